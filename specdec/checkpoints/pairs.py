"""A JSON file and the safetensors file it names, replaced together: trained heads, training checkpoints.

Two files cannot be renamed at once, so a pair is never two fixed names. The
tensors go to `<stem>-<first 16 hex digits of their sha256>.safetensors`, and the
JSON file names that file and its whole sha256:

    1. write the tensors under a unique temporary name, flush, rename to stem-<sha>.safetensors
    2. write the JSON under a unique temporary name, flush, rename over the old JSON   <- the switch
    3. remove the stem-*.safetensors files the new JSON does not name

A process killed before step 2 leaves the old JSON naming the old tensors, which
are still there; after it, the new pair. Readers open the file the JSON names and
check its sha256, so they never pair new tensors with an old JSON (or a damaged
file with anything). Temporary names are unique (tempfile), so two writers never
write into one file; the callers still keep to one writer per folder (a lock).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

import numpy as np

from .safetensors import write_safetensors

MAX_JSON_BYTES = 1 << 20  # specdec's JSON files are a few kB


def write_pair(folder: Path, json_name: str, stem: str, tensors: dict[str, np.ndarray], meta: dict,
               dtype: str | dict = "F32") -> Path:  # fmt: skip
    """Write tensors and then json_name (meta plus "weights_file" and "weights_sha256") as above; returns the
    tensors' path. Interrupted at any point, it leaves the old pair (and no temporary file).
    dtype: the tensors' stored type (safetensors.write_safetensors); they are read back as float32."""
    tmp = temporary(folder, stem)
    try:
        write_safetensors(tmp, tensors, dtype)
        fsync(tmp)
        sha256 = sha256_of(tmp)
        weights = folder / f"{stem}-{sha256[:16]}.safetensors"
        os.replace(tmp, weights)
        tmp = temporary(folder, json_name)
        tmp.write_text(json.dumps({**meta, "weights_file": weights.name, "weights_sha256": sha256}, indent=1))
        fsync(tmp)
        os.replace(tmp, folder / json_name)  # the switch
        tmp = None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    for old in [*folder.glob(f"{stem}-*.safetensors"), folder / f"{stem}.safetensors"]:  # (a fixed name before)
        if old != weights and old.is_file():
            old.unlink()
    return weights


def read_json(path: Path) -> dict:
    """A JSON object from path, at most MAX_JSON_BYTES; ValueError saying what is wrong (without the path)."""
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise ValueError(f"{size} bytes is too large (specdec writes a few kB)")
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except RecursionError as e:
        raise ValueError("not valid JSON (nested too deep)") from e
    except ValueError as e:  # not UTF-8, not JSON
        raise ValueError(f"not valid JSON ({show(str(e), 120)})") from e
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got a JSON {type(value).__name__}")
    return value


def weights_named(folder: Path, meta: dict, stem: str) -> Path:
    """The tensors file meta names, checked to be the one written with it (its sha256); ValueError otherwise."""
    name, sha256 = meta.get("weights_file"), meta.get("weights_sha256")
    if not isinstance(name, str) or not re.fullmatch(rf"{re.escape(stem)}-[0-9a-f]{{16}}\.safetensors", name):
        raise ValueError(f"'weights_file' is {show(name)}, not a file specdec wrote")
    path = folder / name
    if not path.is_file():
        raise ValueError(f"it names {name}, which is missing (an interrupted copy?)")
    if not isinstance(sha256, str) or sha256_of(path) != sha256:
        raise ValueError(f"{name} is not the file it names (its sha256 differs: damaged or replaced)")
    return path


def show(value, limit: int = 60) -> str:
    """A value read from a file, for a message: repr() escapes control characters (no raw escape sequence
    reaches the terminal), and the length is capped."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def temporary(folder: Path, what: str) -> Path:
    """A new, empty file in folder with a unique name, for writing `what` (a fixed name would be shared by two
    writers). Hidden, and ending in .tmp."""
    fd, name = tempfile.mkstemp(prefix=f".{what}.", suffix=".tmp", dir=folder)
    os.close(fd)
    return Path(name)


def fsync(path: Path) -> None:
    """On disk before it is renamed: a power cut then leaves the old file, not zeros."""
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def write_atomically(path: Path, write, mode: int | None = None) -> None:
    """write(file) into a temporary file beside `path`, fsync, rename: `path` is whole or absent, never half.

    mode: the file's permission bits (mkstemp makes it private to its owner); None keeps them.
    """
    tmp = temporary(path.parent, path.name)
    try:
        with open(tmp, "wb") as f:
            write(f)
        fsync(tmp)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
        tmp = None
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)

