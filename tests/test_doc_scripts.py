"""The measurement scripts under docs/ still import: every name a script takes from specdec exists.

docs/ holds the scripts behind the numbers the docs print (docs/measure/, docs/*.py). They are not run by the
suite (they take minutes and real weights), so a module renamed or a function moved would leave them broken
without a failing test; this reads each script's `import specdec...` and `from specdec... import name` lines
and checks that the module imports and has each name. Imports of anything else (torch, a sibling script) are
not checked: those are the script's own business.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted((ROOT / "docs").rglob("*.py"))


def specdec_imports(source: str) -> list[tuple[int, str, str | None]]:
    """(line, module, name or None) for each thing a script imports from specdec."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] == "specdec"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "specdec":
            out += [(node.lineno, node.module, a.name) for a in node.names]
    return out


def missing_imports(source: str) -> list[str]:
    """'line N: from M import X (why)' for each import from specdec that fails."""
    out = []
    for line, module, name in specdec_imports(source):
        what = f"import {module}" if name is None else f"from {module} import {name}"
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            out.append(f"line {line}: {what} ({e})")
            continue
        if name is not None and name != "*" and not hasattr(mod, name):
            try:  # a submodule not yet imported by its package
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                out.append(f"line {line}: {what} (no such name)")
    return out


def test_a_moved_name_and_a_missing_module_are_caught():
    source = (
        "import numpy as np\n"
        "from specdec.config import Config, make_request\n"  # both exist
        "from specdec.model import linear, llama\n"  # submodules
        "from specdec.model import packing\n"  # line 4: no such module
        "from specdec.config import make_requests\n"  # line 5: no such name
        "import specdec.request\n"  # line 6: no such module
        "from suffix_priced import VARIANTS\n"  # a sibling script: not checked
    )
    problems = missing_imports(source)
    assert [p.split(":")[0] for p in problems] == ["line 4", "line 5", "line 6"], problems


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_docs_script_imports_what_specdec_has(script):
    assert SCRIPTS, "no scripts found under docs/"
    problems = missing_imports(script.read_text(encoding="utf-8"))
    assert not problems, f"{script.relative_to(ROOT)}: " + "; ".join(problems)
