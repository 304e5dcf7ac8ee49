"""Shipping a trained head inside specdec: a float16 copy, checked on the way in and out, with its card.

    python -m specdec.train ship --model smollm2-135m --head heads/eagle-smollm2 \
        --out specdec/checkpoints/weights/eagle-smollm2-135m

What ships is what `--draft eagle` resolves to (checkpoints/registry.py: SHIPPED_HEADS).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from .. import safe_io
from ..drafters import eagle
from ..drafters.heads import load_heads, save_heads
from ..model.base import CausalLM

SHIP_LIMIT = 10 * 2**20  # bytes: a head shipped inside the package stays small


def ship_head(src: str | Path, dst: str | Path, target: CausalLM, kind: str = "eagle") -> Path:
    """Copy the head trained in src into dst as float16 (checked on the way in and out), with CARD.txt.

    The head is read with the checked loader (its file, its shapes, the target it belongs to), written
    with heads.save_heads(half=True), and read back through the drafter's own loader; a file over
    SHIP_LIMIT is refused. Returns the weights' path.
    """
    config, params, vocab = load_heads(src, kind, target, eagle.head_shapes(src, target))
    for key in (
        "kind",
        "model",
        "model_fingerprint",
        "n_embd",
        "n_vocab",
        "n_head",
        "layer_norm_epsilon",
        "draft_vocab",
        "weights_file",
        "weights_sha256",
    ):
        config.pop(key, None)  # save_heads writes these afresh
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))  # made whole here, then moved into place
    try:
        weights = save_heads(work, kind, target, params, config, vocab, half=True)
        size = weights.stat().st_size
        if size > SHIP_LIMIT:
            raise ValueError(
                f"{dst}: the head would take {size / 2**20:.1f} MiB, over the {SHIP_LIMIT / 2**20:.0f} "
                f"MiB a shipped head may take; use a smaller --vocab-top or head (nothing written)"
            )
        eagle.EagleDrafter.load(work, target)  # the drafter reads it back
        safe_io.write_file(work / "CARD.txt", card_text(kind, target, config, size).encode("utf-8"))
        for path in work.iterdir():  # a package's files: readable by whoever installs it
            path.chmod(0o644)
        work.chmod(0o755)
        if dst.exists():
            shutil.rmtree(dst)
        work.rename(dst)
        work = None
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    weights = dst / weights.name
    return weights


def card_text(kind: str, target: CausalLM, config: dict, size: int) -> str:
    """The head's card in words: what it is, its data, its training, its held-out figures, the command."""
    d, h = config.get("data", {}), config.get("held_out", {})
    after, before = h.get("trained", {}), h.get("untrained", {})
    init = config.get("init")  # a run that started from another run's weights (--init)
    if init and "head" in init:  # an EAGLE-3 head started from an EAGLE head (--init-head)
        started = [
            f"started from: the EAGLE head {init['head']} (its fc and block; fuse fitted to the final feature "
            f"it read, R^2 {init['fuse_r2']:.3f} on {init['fit_positions']:,} positions; held-out top-1 "
            f"{init['top1_top5']['top1']:.3f})"
        ]
    else:
        started = (
            [
                f"started from: {init['folder']} (step {init['step']}, {init['rows']} rows; held-out top-1 "
                f"{init['top1_top5']['top1']:.3f})"
            ]
            if init
            else []
        )
    lines = [
        f"{kind} head for {target.name}"
        + (f", {config['block']} block" if "block" in config else "")
        + f" (float16, {size / 2**20:.1f} MiB; computed in float32)",
        "",
        f"data: {d.get('reply_tokens_train', '?'):,} reply tokens in {d.get('rows_train', '?'):,} replies that "
        f"{target.name} wrote itself to templated chat requests and Python docstrings "
        "(python -m specdec.train data; docs/distill.md)",
        f"held out: {d.get('reply_tokens_held_out', '?'):,} reply tokens in {d.get('rows_held_out', '?'):,} replies "
        f"to requests never trained on ({d.get('held_out_rule', '?')})",
        f"draft vocabulary: the {config.get('vocab_top')} most frequent reply tokens (FR-Spec)",
        f"training: {config.get('steps')} steps, {config.get('epochs')} epochs, {config.get('batch_tokens')} "
        f"positions per step, AdamW lr {config.get('lr')}, seed {config.get('seed')}, "
        f"{config.get('train_seconds')} s"
        + (
            ", with EAGLE-3's training-time test (a second step on its own outputs)"
            if config.get("training_time_test")
            else ""
        ),
        *started,
        f"held-out teacher-forced top-1: {before.get('top1', float('nan')):.3f} untrained -> "
        f"{after.get('top1', float('nan')):.3f} trained; top-5 {after.get('top5', float('nan')):.3f}"
        + (
            f"; second draft token (read from its own output) top-1 {after['top1_second']:.3f}"
            if "top1_second" in after
            else ""
        ),
        f"command: {config.get('command')}",
        "",
    ]
    return "\n".join(lines)
