"""The stdlib family: small GPT-2s trained on the Python standard library, shipped inside specdec.

Real GPT-2 weights need a download; these need nothing, so every example, test
and benchmark can show speculative decoding on a *trained* model offline:

    stdlib-6L   the target: 6 layers, 128 wide, trained with an extra early-exit
                loss after block 2 (LayerSkip, arXiv 2404.16710), so that
                "early_exit:2" is a real self-speculative drafter on it
    stdlib-2L   the draft: 2 layers, 96 wide

Both read the same 4096-token byte-level BPE (GPT-2's format: vocab.json +
merges.txt), and each folder under `weights/` is a complete GPT-2 checkpoint
(config.json, model.safetensors in F16), loaded like any other:

>>> import specdec
>>> target = specdec.load_model("stdlib-6L")   # doctest: +SKIP

`weights/family.json` records how they were made (corpus, split, sizes,
steps, held-out bits per byte) by tests/fixtures/train_family.py;
`weights/prompts.json` holds prompts from held-out files for tests and the
benchmark (`python -m specdec.bench --only family`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
TARGET = "stdlib-6L"  # the names of the two models; their rows (and folders) are in registry.py
DRAFT = "stdlib-2L"
EARLY_EXIT_LAYER = 2  # the layer the target's early-exit loss was trained at
HELD_OUT_MOD = 20


def card() -> dict:
    """Provenance and results of the training run (weights/family.json)."""
    return json.loads((WEIGHTS_DIR / "family.json").read_text(encoding="utf-8"))


def prompts() -> list[dict]:
    """Held-out prompts: {"file", "line", "text"}, the first three lines of a function in a held-out file."""
    return json.loads((WEIGHTS_DIR / "prompts.json").read_text(encoding="utf-8"))


def is_held_out(relative_path: str) -> bool:
    """The corpus split: a stdlib file (path relative to the stdlib root, with "/") is held out
    when the SHA-256 of its path, read as an integer, is 0 mod 20 (about 5% of the files)."""
    return int(hashlib.sha256(relative_path.encode()).hexdigest(), 16) % HELD_OUT_MOD == 0
