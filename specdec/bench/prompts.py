"""The committed prompt suite (prompts.json): five categories of text, read and checked; a prompt as token ids.

The categories (copying from the prompt, code, free continuation, lists and
templates, dialogue) follow Spec-Bench (Xia et al., arXiv 2401.07851), which
showed that a drafter's speedup depends strongly on the kind of text. Every
benchmark section that decodes text reads its prompts here.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from ..model.base import CausalLM


def load_prompts(path: str | Path | None = None) -> dict[str, list[str]]:
    """{category: [prompt, ...]} from the committed suite (or a JSON file of the same layout)."""
    if path is None:
        text = resources.files("specdec.bench").joinpath("prompts.json").read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    data = json.loads(text)
    try:
        suite = {name: list(cat["prompts"]) for name, cat in data["categories"].items()}
    except (KeyError, TypeError, AttributeError):
        raise ValueError(
            f"{path or 'prompts.json'}: expected {{'categories': {{name: {{'prompts': [...]}}}}}}"
        ) from None
    if not suite or not all(suite.values()) or not all(isinstance(p, str) and p for ps in suite.values() for p in ps):
        raise ValueError(f"{path or 'prompts.json'}: every category needs at least one non-empty prompt")
    return suite


def encode(model: CausalLM, text: str) -> list[int]:
    if model.tokenizer is None:
        raise ValueError(f"{model.name} has no tokenizer: the suite's prompts are text")
    return model.tokenizer.encode(text, allowed_special="all")
