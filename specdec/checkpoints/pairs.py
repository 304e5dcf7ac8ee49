"""A JSON file and the safetensors file it names, replaced together: trained heads, training checkpoints.

Two files cannot be renamed at once, so a pair is never two fixed names. The
tensors go to `<stem>-<first 16 hex digits of their sha256>.safetensors`, and the
JSON file names that file and its whole sha256:

    1. write the tensors (safe_io.replacing: a new temporary file, flushed, renamed) as stem-<sha>.safetensors
    2. write the JSON the same way, over the old JSON                                 <- the switch
    3. remove the stem-*.safetensors files the new JSON does not name

A process killed before step 2 leaves the old JSON naming the old tensors, which
are still there; after it, the new pair. Readers open the file the JSON names
once, check its sha256 on that open file and read the tensors from it
(`open_weights`), so they never pair new tensors with an old JSON (or a damaged
file with anything). Temporary names are random and created exclusively
(safe_io), so two writers never write into one file and no link planted in the
folder is written through; the callers still keep to one writer per folder (a lock).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .. import safe_io
from .safetensors import safetensors_chunks, write_safetensors

MAX_JSON_BYTES = safe_io.MAX_JSON_BYTES  # specdec's JSON files are a few kB


def write_pair(
    folder: Path, json_name: str, stem: str, tensors: dict[str, np.ndarray], meta: dict, dtype: str | dict = "F32"
) -> Path:
    """Write tensors and then json_name (meta plus "weights_file" and "weights_sha256") as above; returns the
    tensors' path. Interrupted at any point, it leaves the old pair (and no temporary file).
    dtype: the tensors' stored type (safetensors.write_safetensors); they are read back as float32."""
    digest = hashlib.sha256()
    for chunk in safetensors_chunks(tensors, dtype):  # the name holds the sha256, so it is known first
        digest.update(chunk)
    sha256 = digest.hexdigest()
    weights = folder / f"{stem}-{sha256[:16]}.safetensors"
    write_safetensors(weights, tensors, dtype)
    safe_io.write_json(folder / json_name, {**meta, "weights_file": weights.name, "weights_sha256": sha256})
    for old in [*folder.glob(f"{stem}-*.safetensors"), folder / f"{stem}.safetensors"]:  # (a fixed name before)
        if old != weights and old.is_file():
            old.unlink()
    return weights


def read_record(path: Path, missing: str, error: Callable[[str], Exception] = ValueError, fix: str = "") -> dict:
    """A pair's JSON file, read by the one reader (safe_io): raises error(missing) when there is no such file, and
    error(f"{path}: {what is wrong}{fix}") when it is not a readable JSON object."""
    try:
        return safe_io.read_json(path)
    except FileNotFoundError:
        raise error(missing) from None
    except (ValueError, OSError) as e:  # safe_io.Refused: a FIFO, a link to a device, too large, not an object...
        raise error(f"{path}: {e}{fix}") from e


def open_weights(folder: Path, meta: dict, stem: str, max_bytes: int | None = None) -> tuple[Path, BinaryIO]:
    """(path, the file open for reading) of the tensors file meta names, checked on that open file to be the
    one written with it (its sha256), a regular file of at most max_bytes; ValueError saying what is wrong.

    NOTE: the caller reads the tensors from the returned file (safetensors.read_safetensors(path, file)),
    so the file checked is the file read; a link to /proc/self/pagemap or a FIFO is refused at once.
    """
    name, sha256 = meta.get("weights_file"), meta.get("weights_sha256")
    if not isinstance(name, str) or not re.fullmatch(rf"{re.escape(stem)}-[0-9a-f]{{16}}\.safetensors", name):
        raise ValueError(f"'weights_file' is {show(name)}, not a file specdec wrote")
    path = folder / name
    try:
        file = safe_io.open_regular(path, max_bytes)
    except FileNotFoundError:
        raise ValueError(f"it names {name}, which is missing (an interrupted copy?)") from None
    except safe_io.Refused as e:
        raise ValueError(f"{name}: {e}") from None
    try:
        same = isinstance(sha256, str) and safe_io.sha256_of(file) == sha256
    except BaseException as e:
        file.close()
        if isinstance(e, (safe_io.Refused, OSError)):
            raise ValueError(f"{name}: {e}") from None
        raise
    if not same:
        file.close()
        raise ValueError(f"{name} is not the file it names (its sha256 differs: damaged or replaced)")
    return path, file


def tensors_problem(tensors: dict[str, np.ndarray], expected: dict[str, tuple[int, ...]], implied: str) -> str | None:
    """What is first wrong with a pair's tensors against `expected` ({name: shape}), or None: a tensor missing,
    one not expected, a shape other than the one `implied` names the source of ("heads.json implies"), values
    that are not finite."""
    missing, unexpected = sorted(expected.keys() - tensors.keys()), sorted(tensors.keys() - expected.keys())
    if missing:
        return f"tensor {missing[0]!r} is missing"
    if unexpected:
        return f"unexpected tensor {show(unexpected[0])}"
    for name, shape in expected.items():
        if tensors[name].shape != shape:
            return f"tensor {name!r} has shape {tensors[name].shape}, {implied} {shape}"
        if not np.isfinite(tensors[name]).all():
            return f"tensor {name!r} holds NaN or infinite values"
    return None


def show(value, limit: int = 60) -> str:
    """A value read from a file, for a message: repr() escapes control characters (no raw escape sequence
    reaches the terminal), and the length is capped."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
