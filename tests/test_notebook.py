"""The walkthrough notebook: committed with its outputs, and its code still runs.

The structure checks need nothing. Running the code needs matplotlib (the
`notebook` extra, which CI installs): every code cell is executed in order in
one namespace, in this process, with matplotlib's Agg backend and IPython
magics (`%...` lines) left out; so no Jupyter kernel is needed either. The
cells tagged `real-model` (the SmolLM2 section) need the 98 MB model and a few
minutes: the default run leaves them out, a slow test runs the whole notebook.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "walkthrough.ipynb"


def code_cells(real_model: bool = True) -> list[str]:
    """The code cells' sources in order; real_model=False leaves out those tagged `real-model`."""
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    return [
        "".join(c["source"])
        for c in cells
        if c["cell_type"] == "code" and (real_model or "real-model" not in c["metadata"].get("tags", []))
    ]


def run_cells(sources: list[str]) -> dict:
    namespace: dict = {"__name__": "__walkthrough__"}
    for i, source in enumerate(sources):
        code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("%"))
        exec(compile(code, f"walkthrough.ipynb, code cell {i + 1}", "exec"), namespace)
    return namespace


def test_the_notebook_is_committed_with_its_outputs():
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert len(code) >= 10
    # Run top to bottom in one session: execution counts 1, 2, 3, ...
    assert [c["execution_count"] for c in code] == list(range(1, len(code) + 1))
    outputs = [o for c in code for o in c["outputs"]]
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 5  # the plots
    assert any("text/html" in o.get("data", {}) for o in outputs)  # the coloured trace


@pytest.mark.slow  # about 70 s on an idle machine; CI runs it with -m slow
def test_the_notebook_runs(monkeypatch, tmp_path):
    matplotlib = pytest.importorskip("matplotlib", reason="the notebook extra: pip install -e '.[notebook]'")
    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)  # nothing may depend on the current directory
    sources = code_cells(real_model=False)
    assert len(sources) < len(code_cells())  # the real-model section is tagged, and left out here
    namespace = run_cells(sources)
    result = namespace["result"]  # the full run: its trace is what the HTML view shows
    assert len(result.tokens) > 0 and "<span" in result._repr_html_()


@pytest.mark.slow
def test_the_notebook_runs_with_the_real_model(monkeypatch, tmp_path, smollm2_gguf):
    matplotlib = pytest.importorskip("matplotlib", reason="the notebook extra: pip install -e '.[notebook]'")
    matplotlib.use("Agg")
    import specdec

    monkeypatch.chdir(tmp_path)
    load = specdec.load_model
    monkeypatch.setattr(
        specdec, "load_model", lambda name, *a, **k: load(smollm2_gguf if name == "smollm2-135m" else name, *a, **k)
    )
    namespace = run_cells(code_cells())
    real = namespace["real"]
    assert real["ngram"].tokens == real["early_exit:29"].tokens  # both greedy, both the target's text
    assert namespace["corrections"](real["ngram"], namespace["smol"].tokenizer)  # the section shows failures
