"""docs/reading.md cannot go stale: every `path:function` (or `path:Class.method`) it names exists there."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "reading.md"
REFERENCE = re.compile(r"`((?:specdec|tests)/[\w/]+\.py):([\w.]+)`")


def defined(path: Path) -> set[str]:
    """Every function and class of a module, and every method as Class.method."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {
                f"{node.name}.{item.name}"
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            }
    return names


def stale(text: str) -> list[str]:
    """The references of a guide's text that name no function where they say."""
    missing = []
    for file, name in REFERENCE.findall(text):
        path = ROOT / file
        if not path.is_file() or name not in defined(path):
            missing.append(f"{file}:{name}")
    return missing


def test_every_function_the_reading_guide_names_exists():
    text = GUIDE.read_text()
    assert len(REFERENCE.findall(text)) >= 30, "the guide names the round's and the pass's functions"
    assert stale(text) == []


def test_a_renamed_function_fails_the_check():
    text = GUIDE.read_text().replace("specdec/verify/chain.py:sampled_chain", "specdec/verify/chain.py:sample_chain")
    assert "specdec/verify/chain.py:sample_chain" in stale(text)
    moved = GUIDE.read_text().replace("specdec/model/gpt2.py:gelu", "specdec/model/llama.py:gelu")
    assert stale(moved) == ["specdec/model/llama.py:gelu"]


def test_the_guide_covers_every_step_of_the_round():
    text = GUIDE.read_text()
    for step in ("| 1 |", "| 2 |", "| 3 |", "| 4 |", "| 5 |"):
        assert step in text
