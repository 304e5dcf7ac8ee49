"""Every group of benchmark sections says what it is doing on stderr as it goes (a run of minutes is never
silent), and `--quiet` silences exactly that: each group runs here at its smallest settings, twice."""

from __future__ import annotations

import json

import pytest

from specdec.bench import batch, block, family, heads, real, speed, suite, trees
from specdec.checkpoints.load import load_model


def small_real(monkeypatch, tmp_path) -> list[str]:
    """bench real compares its target with a 124M-shaped model after 256 tokens: a small model and a short
    context stand in for them here."""
    monkeypatch.setattr(real, "random_model", lambda name: load_model("stdlib-2L"))
    monkeypatch.setattr(real, "CONTEXT", 16)
    return []


def small_family(monkeypatch, tmp_path) -> list[str]:
    """bench family times its costs with 21 repeats each, after held-out prompts of hundreds of tokens: 1
    repeat and a short prompt here."""
    measure = family.measure_costs
    monkeypatch.setattr(family, "measure_costs", lambda *args, **kwargs: measure(*args, **{**kwargs, "repeats": 1}))
    monkeypatch.setattr(family.family, "prompts", lambda: [{"text": "def main(argv):"}])
    return []


def prompts_file(monkeypatch, tmp_path) -> list[str]:
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(["def main(argv):\n    "]))
    return ["--prompts-file", str(path)]


GROUPS = {  # group -> (its main, its smallest argv, a setup that returns more argv)
    "family": (family.main, ["--prompts", "1", "--tokens", "4", "--repeats", "1", "--no-gpt2"], small_family),
    "speed": (speed.main, ["--quick", "--sizes", "tiny", "--only", "decode", "--contexts", "32"], None),
    "trees": (
        trees.main,
        [
            "--only",
            "tau",
            "--target",
            "stdlib-2L",
            "--draft",
            "ngram",
            "--trees",
            "none",
            "--temperatures",
            "0",
            "--n-tokens",
            "4",
            "--n-prompts",
            "1",
        ],
        None,
    ),
    "heads": (
        heads.main,
        ["--accept", "--target", "stdlib-2L", "--drafts", "ngram", "--n-prompts", "1", "--tokens", "4"],
        prompts_file,
    ),
    "suite": (
        suite.main,
        ["--target", "stdlib-2L", "--drafts", "ngram", "--n-tokens", "4", "--categories", "lists"],
        None,
    ),
    "real": (
        real.main,
        ["--target", "stdlib-2L", "--drafts", "ngram", "--repeats", "1", "--exit-layers", "1"],
        small_real,
    ),
    "block": (
        block.main,
        [
            "--models",
            "stdlib-2L",
            "--drafts",
            "ngram",
            "--temperatures",
            "1.0",
            "--K",
            "2",
            "--prompts",
            "1",
            "--tokens",
            "4",
        ],
        None,
    ),
    "batch": (
        batch.main,
        ["--models", "tiny", "--batches", "1", "--tokens", "4", "--repeats", "1", "--pass-samples", "1"],
        None,
    ),
}


@pytest.mark.parametrize(
    "group",
    [pytest.param(g, marks=pytest.mark.slow) if g == "real" else g for g in GROUPS],  # real times costs: 5 s
)
def test_every_bench_group_shows_progress_on_stderr_unless_quiet(group, capsys, monkeypatch, tmp_path):
    main, argv, setup = GROUPS[group]
    argv = argv + (setup(monkeypatch, tmp_path) if setup else [])
    main(argv)
    out, err = capsys.readouterr()
    steps = [line for line in err.splitlines() if line.startswith(f"[{group} ")]
    assert steps and all(" s] " in line for line in steps), err
    assert not any(line.startswith(f"[{group} ") for line in out.splitlines())  # the tables' stream stays clean
    main(argv + ["--quiet"])
    out_quiet, err_quiet = capsys.readouterr()
    assert not any(line.startswith(f"[{group} ") for line in err_quiet.splitlines()), err_quiet
