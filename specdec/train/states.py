"""The target's hidden states that a head reads, recomputed once per row and kept as float16.

row_states runs the target teacher-forced over the distillation rows (features.hidden_states)
and returns, per row, the states of the layers a head kind reads; with a cache folder, each
layer's states are kept on disk between runs and trusted only after their record and sha256
are checked, and every value is finite (safe_io: written whole, read from one open file, a
file of this user's that no one else may write).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .. import safe_io
from ..drafters.heads import model_fingerprint
from ..model.base import CausalLM
from .shards import DistillData
from .features import hidden_states

F32 = np.float32
F16 = np.float16


def row_states(
    target: CausalLM,
    data: DistillData,
    rows: list[int],
    layers: list[int],
    progress: bool,
    cache: Path | None = None,
    log: Callable[[str], None] | None = None,
) -> dict:
    """{row: [len(layers), n_prompt + n_reply - 1, n_embd] float16}: the hidden states a head reads,
    recomputed (features.hidden_states) in batches of similar length, kept as float16 (half the memory).

    cache: a folder where each layer's states for rows 0 .. max(rows) are kept between runs
    (states_file), so that a second head, or a run with other settings, does not pay the
    teacher-forced pass again; a cache of more rows of the same data serves fewer rows too. A
    cached file is used only when its sha256 matches its record, the record names this model,
    these rows' shards and this layer, and every value is finite; otherwise it is made again
    (log(line) says why, when a file under this run's own name is refused).
    When the data has grown since (shards are only ever appended), the cached states of the rows
    it had are read and only the new rows are computed.
    """
    if not layers:  # a kind that reads no states (the draft model): empty arrays, no target pass
        return {r: np.zeros((0, len(data.prompts[r]) + len(data.replies[r]) - 1, target.n_embd), F16) for r in rows}
    n_rows = max(rows) + 1
    log = log or (lambda line: None)
    held = {layer: _read_covering(cache, target, data, n_rows, layer, log) if cache else None for layer in layers}
    missing = [layer for layer in layers if held[layer] is None]
    if missing:
        todo = list(range(n_rows)) if cache else rows
        reused: dict[int, dict] = {layer: {} for layer in missing}  # rows read from an earlier, smaller cache
        if cache:
            earlier = {layer: _read_prefix(cache, target, data, n_rows, layer, log) for layer in missing}
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
    record = {
        "format": "specdec-states-1",
        "model_fingerprint": model_fingerprint(target),
        "layer": layer,
        "rows": n_rows,
        "shards_sha256": data.shard_sha256[: -(-n_rows // data.settings["shard_rows"])],
    }
    key = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]
    return f"states-L{layer}-{key}", record


def _write_states(cache: Path, target, data, n_rows: int, layer: int, states: dict) -> None:
    """Layer `layer`'s states of rows 0 .. n_rows-1, end to end, float16, then its record (written last)."""
    stem, record = _states_key(target, data, n_rows, layer)
    cache.mkdir(parents=True, exist_ok=True)
    flat = np.concatenate([states[r] for r in range(n_rows)])  # [sum of row lengths - 1, n_embd]
    with safe_io.replacing(cache / f"{stem}.npy") as f:
        np.save(f, flat, allow_pickle=False)
        sha256 = safe_io.sha256_of(f)  # of the bytes written, read back before the file gets its name
    record.update(shape=list(flat.shape), sha256=sha256)
    safe_io.write_json(cache / f"{stem}.json", record, indent=None)


def _read_covering(cache: Path, target, data, n_rows: int, layer: int, log) -> dict | None:
    """This layer's states of rows 0 .. n_rows-1 from a trusted cache of exactly those rows or, failing that,
    of more rows of the same data (a larger run's, say; its rows are these rows' shards and the ones after),
    smallest first: one file is hashed in full. None when neither is there."""
    exact = _read_states(cache, target, data, n_rows, layer, log)
    if exact is not None:
        return exact
    for rows in sorted(_cached_sizes(cache, layer, lambda rows: n_rows < rows <= len(data.replies))):
        states = _read_states(cache, target, data, rows, layer, log)  # checked in full there
        if states is not None:
            return {r: states[r] for r in range(n_rows)}
    return None


def _cached_sizes(cache: Path, layer: int, wanted) -> set[int]:
    """The row counts of this layer's cache files whose records say a count that wanted(count) accepts."""
    sizes = set()
    for path in cache.glob(f"states-L{layer}-*.json"):
        try:
            rows = _record(path).get("rows")
        except (OSError, ValueError):  # _read_states says why, if it is one this run asks for
            continue
        if type(rows) is int and wanted(rows):
            sizes.add(rows)
    return sizes


def _read_prefix(cache: Path, target, data, n_rows: int, layer: int, log) -> dict | None:
    """The largest trusted cache of this layer's states for fewer rows of the same data (the shards it
    read are this data's first shards, unchanged), or None. Largest first: one file is hashed in full."""
    for rows in sorted(_cached_sizes(cache, layer, lambda rows: 0 < rows < n_rows), reverse=True):
        states = _read_states(cache, target, data, rows, layer, log)  # checked in full there
        if states is not None:
            return states
    return None


def _record(path: Path) -> dict:
    """A cache record (JSON object), read by the one reader: a regular file, not a link, of this user's."""
    with safe_io.open_regular(path, safe_io.MAX_JSON_BYTES, follow_links=False) as f:
        _check_owner(f, path)
        return safe_io.parse_json(safe_io.read_all(f, safe_io.MAX_JSON_BYTES))


def _check_owner(f, path: Path) -> None:
    """safe_io.untrusted's rule, with the cache folder's owner in the checkpoint owner's place."""
    why = safe_io.untrusted(os.fstat(f.fileno()), path.parent.stat(), safe_io.user_id(), "the cache folder's owner")
    if why:
        raise safe_io.Refused(why)


def _read_states(cache: Path, target, data, n_rows: int, layer: int, log) -> dict | None:
    """The cached states of one layer as {row: [n, n_embd]}, or None when absent or not to be trusted
    (log says why for one that is there: damaged, planted, or holding NaN under a sha256 sealed again)."""
    stem, record = _states_key(target, data, n_rows, layer)
    path = cache / f"{stem}.npy"
    lengths = [len(data.prompts[r]) + len(data.replies[r]) - 1 for r in range(n_rows)]
    shape = [sum(lengths), target.n_embd]
    try:
        saved = _record(cache / f"{stem}.json")
        if any(saved.get(k) != v for k, v in record.items()) or saved.get("shape") != shape:
            raise safe_io.Refused("its record is not this run's (another model, rows or layer)")
        with safe_io.open_regular(path, follow_links=False) as f:
            _check_owner(f, path)
            # NOTE: the sha256 (and so the size) before np.load reads a shape from the file's own header
            if safe_io.sha256_of(f) != saved.get("sha256"):
                raise safe_io.Refused("its sha256 is not the one its record holds (damaged or replaced)")
            f.seek(0)
            flat = np.load(f, allow_pickle=False)
        if flat.dtype != F16 or list(flat.shape) != shape:
            raise safe_io.Refused(f"it holds {flat.dtype} of shape {flat.shape}, not float16 of shape {tuple(shape)}")
        if not np.isfinite(flat).all():
            raise safe_io.Refused("it holds NaN or infinite values")
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:  # safe_io.Refused, or np.load's own complaint
        log(f"ignoring the cached states {path}: {' '.join(str(e).split())[:200]}; computing them again")
        return None
    ends = np.cumsum(lengths)
    return {r: flat[end - n : end] for r, (n, end) in enumerate(zip(lengths, ends))}
