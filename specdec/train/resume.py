"""A training run's checkpoint: saved every --save-every steps, read back by --resume and by --init.

checkpoint.json names checkpoint-<sha256 prefix>.safetensors (checkpoints/pairs.py: the two replaced as one).
The record holds the run's settings, the step and AdamW's step count; the tensors are the parameters and
AdamW's moments (adam.m.<name>, adam.v.<name>). Every part is checked before it is used: the settings against
this run's, the file's sha256, each tensor's shape and values.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..checkpoints.pairs import open_weights, read_record, show, write_pair
from ..checkpoints.safetensors import read_safetensors
from .optim import AdamW

CHECKPOINT_FILE, CHECKPOINT_STEM = "checkpoint.json", "checkpoint"


def save_checkpoint(out: Path, settings: dict, opt: AdamW, step: int) -> None:
    """Parameters and AdamW moments after `step` steps; the two files replaced as one."""
    write_pair(
        out,
        CHECKPOINT_FILE,
        CHECKPOINT_STEM,
        {**opt.params, **opt.state()},
        {**settings, "step": step, "adam_t": opt.t},
    )


def read_checkpoint(
    out: Path, settings: dict, shapes: dict[str, tuple[int, ...]], steps: int | None
) -> tuple[dict, dict[str, np.ndarray]]:
    """(the checkpoint's record, with its "step" and AdamW's "adam_t"; every tensor) of a checkpoint written
    with the same settings, each part checked: ValueError naming the file otherwise. shapes: the
    parameters' (the moments have the same)."""
    path = out / CHECKPOINT_FILE
    fix = "run without --resume to start over (or use another --out)"
    missing = f"--resume: no checkpoint in {out}; run without --resume to start"
    saved = read_record(path, missing, lambda what: ValueError(f"--resume: {what}"), f"; {fix}")
    differ = [k for k in settings if saved.get(k) != settings[k]]
    if differ:
        raise ValueError(
            f"--resume: the checkpoint in {out} was made with other settings ({', '.join(differ)}); "
            f"use the same options, or another --out to start over"
        )
    for key in ("step", "adam_t"):
        if type(saved.get(key)) is not int or saved[key] < 0:
            raise ValueError(f"--resume: {path}: {key!r} is {show(saved.get(key))}, not a whole number >= 0; {fix}")
    if steps is not None and saved["step"] > steps:
        raise ValueError(
            f"--resume: the checkpoint in {out} is at step {saved['step']}, past --steps {steps}; "
            f"use --steps {saved['step']} or more"
        )
    expected = {**shapes, **{f"adam.{m}.{k}": shape for k, shape in shapes.items() for m in "mv"}}
    return saved, _checked_tensors("--resume", out, saved, expected, fix)


def read_init(folder: Path, settings: dict, shapes: dict[str, tuple[int, ...]]) -> tuple[dict, dict[str, np.ndarray]]:
    """(the checkpoint's record, its parameters) of the last checkpoint of a training run in `folder`, for
    --init: a run that starts from those weights (on more data, say). It must be the same kind of head for
    the same model, with the same shape and the same held-out share (so that no request held out here was
    trained on there); every part is checked, ValueError naming the file otherwise."""
    path = folder / CHECKPOINT_FILE
    fix = "give the --out folder of a finished or checkpointed training run"
    missing = f"--init: no checkpoint in {folder} ({CHECKPOINT_FILE}); {fix}"
    saved = read_record(path, missing, lambda what: ValueError(f"--init: {what}"), f"; {fix}")
    differ = [k for k in ("kind", "model_fingerprint", "config", "held_out") if saved.get(k) != settings.get(k)]
    if differ:
        raise ValueError(
            f"--init: the run in {folder} differs from this one in {', '.join(differ)}; start from a "
            f"head of the same kind, block and model, trained with the same --held-out"
        )
    if type(saved.get("step")) is not int or saved["step"] < 1:
        raise ValueError(f"--init: {path}: 'step' is {show(saved.get('step'))}, not a whole number >= 1; {fix}")
    return saved, _checked_tensors("--init", folder, saved, shapes, fix)


def _checked_tensors(flag: str, folder: Path, saved: dict, expected: dict[str, tuple[int, ...]], fix: str) -> dict:
    """A checkpoint's tensors, after its sha256 (open_weights) and every expected tensor's shape and values."""
    try:
        weights, file = open_weights(folder, saved, CHECKPOINT_STEM)
        with file:  # the file whose sha256 was checked is the file read
            tensors = read_safetensors(weights, file)
    except (ValueError, OSError) as e:  # (CheckpointError is a ValueError)
        raise ValueError(f"{flag}: {folder / CHECKPOINT_FILE}: {e}; {fix}") from e
    for name, shape in expected.items():
        if name not in tensors or tensors[name].shape != shape:
            have = "missing" if name not in tensors else f"of shape {tensors[name].shape}, not {shape}"
            raise ValueError(f"{flag}: {weights}: tensor {name!r} is {have}; {fix}")
        if not np.isfinite(tensors[name]).all():
            raise ValueError(f"{flag}: {weights}: tensor {name!r} holds NaN or infinite values; {fix}")
    return tensors
