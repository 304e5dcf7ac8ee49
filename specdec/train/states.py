"""The target's hidden states that a head reads, recomputed once per row and kept as float16.

row_states runs the target teacher-forced over the distillation rows (features.hidden_states)
and returns, per row, the states of the layers a head kind reads; with a cache folder, each
layer's states are kept on disk between runs and trusted only after their record and sha256
are checked.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..checkpoints.pairs import sha256_of, write_atomically
from ..drafters.heads import model_fingerprint
from ..model.base import CausalLM
from .distill import DistillData
from .features import hidden_states

F32 = np.float32
F16 = np.float16


def row_states(target: CausalLM, data: DistillData, rows: list[int], layers: list[int], progress: bool,
               cache: Path | None = None) -> dict:  # fmt: skip
    """{row: [len(layers), n_prompt + n_reply - 1, n_embd] float16}: the hidden states a head reads,
    recomputed (features.hidden_states) in batches of similar length, kept as float16 (half the memory).

    cache: a folder where each layer's states for rows 0 .. max(rows) are kept between runs
    (states_file), so that a second head, or a run with other settings, does not pay the
    teacher-forced pass again; a cache of more rows of the same data serves fewer rows too. A
    cached file is used only when its sha256 matches its record and the record names this model,
    these rows' shards and this layer; otherwise it is made again.
    When the data has grown since (shards are only ever appended), the cached states of the rows
    it had are read and only the new rows are computed.
    """
    if not layers:  # a kind that reads no states (the draft model): empty arrays, no target pass
        return {r: np.zeros((0, len(data.prompts[r]) + len(data.replies[r]) - 1, target.n_embd), F16) for r in rows}
    n_rows = max(rows) + 1
    held = {layer: _read_covering(cache, target, data, n_rows, layer) if cache else None for layer in layers}
    missing = [layer for layer in layers if held[layer] is None]
    if missing:
        todo = list(range(n_rows)) if cache else rows
        reused: dict[int, dict] = {layer: {} for layer in missing}  # rows read from an earlier, smaller cache
        if cache:
            earlier = {layer: _read_prefix(cache, target, data, n_rows, layer) for layer in missing}
            if all(earlier.values()):
                n_held = min(len(states) for states in earlier.values())
                reused = {layer: {r: states[r] for r in range(n_held)} for layer, states in earlier.items()}
                todo = list(range(n_held, n_rows))
        order = sorted(todo, key=lambda r: len(data.prompts[r]) + len(data.replies[r]))  # little padding per pass
        fresh: dict[int, np.ndarray] = {}
        bar = tqdm(total=len(order), desc="hidden states", unit="row", disable=not progress)
        for r, states in hidden_states(target, data, missing, order, batch=8):
            fresh[r] = states.astype(F16)
            bar.update(1)
        bar.close()
        for i, layer in enumerate(missing):
            held[layer] = {**reused[layer], **{r: fresh[r][i] for r in fresh}}
            if cache:
                _write_states(cache, target, data, n_rows, layer, held[layer])
    return {r: np.stack([held[layer][r] for layer in layers]) for r in rows}


def _states_key(target: CausalLM, data: DistillData, n_rows: int, layer: int) -> tuple[str, dict]:
    record = {"format": "specdec-states-1", "model_fingerprint": model_fingerprint(target), "layer": layer,
              "rows": n_rows, "shards_sha256": data.shard_sha256[: -(-n_rows // data.settings["shard_rows"])]}  # fmt: skip
    key = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]
    return f"states-L{layer}-{key}", record


def _write_states(cache: Path, target, data, n_rows: int, layer: int, states: dict) -> None:
    """Layer `layer`'s states of rows 0 .. n_rows-1, end to end, float16, then its record (written last)."""
    stem, record = _states_key(target, data, n_rows, layer)
    cache.mkdir(parents=True, exist_ok=True)
    flat = np.concatenate([states[r] for r in range(n_rows)])  # [sum of row lengths - 1, n_embd]
    write_atomically(cache / f"{stem}.npy", lambda f: np.save(f, flat, allow_pickle=False))
    record.update(shape=list(flat.shape), sha256=sha256_of(cache / f"{stem}.npy"))
    write_atomically(cache / f"{stem}.json", lambda f: f.write(json.dumps(record).encode()))


def _read_covering(cache: Path, target, data, n_rows: int, layer: int) -> dict | None:
    """This layer's states of rows 0 .. n_rows-1 from a trusted cache of exactly those rows or, failing that,
    of more rows of the same data (a larger run's, say; its rows are these rows' shards and the ones after),
    smallest first: one file is hashed in full. None when neither is there."""
    exact = _read_states(cache, target, data, n_rows, layer)
    if exact is not None:
        return exact
    for rows in sorted(_cached_sizes(cache, layer, lambda rows: n_rows < rows <= len(data.replies))):
        states = _read_states(cache, target, data, rows, layer)  # checked in full there
        if states is not None:
            return {r: states[r] for r in range(n_rows)}
    return None


def _cached_sizes(cache: Path, layer: int, wanted) -> set[int]:
    """The row counts of this layer's cache files whose records say a count that wanted(count) accepts."""
    sizes = set()
    for path in cache.glob(f"states-L{layer}-*.json"):
        try:
            rows = json.loads(path.read_text()).get("rows")
        except (OSError, ValueError, RecursionError):
            continue
        if type(rows) is int and wanted(rows):
            sizes.add(rows)
    return sizes


def _read_prefix(cache: Path, target, data, n_rows: int, layer: int) -> dict | None:
    """The largest trusted cache of this layer's states for fewer rows of the same data (the shards it
    read are this data's first shards, unchanged), or None. Largest first: one file is hashed in full."""
    for rows in sorted(_cached_sizes(cache, layer, lambda rows: 0 < rows < n_rows), reverse=True):
        states = _read_states(cache, target, data, rows, layer)  # checked in full there
        if states is not None:
            return states
    return None


def _read_states(cache: Path, target, data, n_rows: int, layer: int) -> dict | None:
    """The cached states of one layer as {row: [n, n_embd]}, or None when absent or not to be trusted."""
    stem, record = _states_key(target, data, n_rows, layer)
    path = cache / f"{stem}.npy"
    try:
        saved = json.loads((cache / f"{stem}.json").read_text())
        if any(saved.get(k) != v for k, v in record.items()) or sha256_of(path) != saved.get("sha256"):
            return None
        flat = np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        return None
    lengths = [len(data.prompts[r]) + len(data.replies[r]) - 1 for r in range(n_rows)]
    if flat.dtype != F16 or flat.shape != (sum(lengths), target.n_embd) or list(flat.shape) != saved.get("shape"):
        return None
    ends = np.cumsum(lengths)
    return {r: flat[end - n : end] for r, (n, end) in enumerate(zip(lengths, ends))}
