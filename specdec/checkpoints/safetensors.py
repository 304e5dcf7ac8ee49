"""The safetensors format, read with np.memmap and written for tests and demo models.

safetensors format (https://huggingface.co/docs/safetensors): 8 bytes of
little-endian u64 N, then N bytes of JSON mapping each tensor name to
{"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the byte
after the header), optionally a "__metadata__" entry, then the raw data.
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..model.fast import kernels, threads
from .. import safe_io

_MAX_HEADER_BYTES = 100_000_000  # the reference implementation's own limit
_MAX_DEPTH = 8  # {name: {"shape": [...]}} is 3 deep


class CheckpointError(ValueError):
    """A checkpoint file is missing, truncated, corrupt or not a GPT-2."""


_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2")}


def read_safetensors(path: str | os.PathLike, file: BinaryIO | None = None) -> dict[str, np.ndarray]:
    """Every tensor in a safetensors file as a float32 array.

    F32 tensors are read-only views into one np.memmap of the file: opening a
    1.4 GB checkpoint costs a header parse, and pages are read from disk (or
    shared from the page cache) only when used. F16 and BF16 are converted to
    float32, which does copy. file: the file already open (binary), read instead
    of opening `path` again (which then only names it in messages).
    """
    path = Path(path)
    with opened(path) if file is None else nullcontext(file) as f:  # one open file: the one checked is the one mapped
        entries, data_start, data_size = index_safetensors(path, f)
        data = (
            np.memmap(f, dtype=np.uint8, mode="r", offset=data_start, shape=(data_size,))
            if data_size
            else np.empty(0, np.uint8)
        )
    tensors = {}
    for name, dtype, shape, begin, stop in entries:
        try:
            raw = data[begin:stop].view(_DTYPES[dtype]).reshape(shape)
        except (ValueError, OverflowError) as e:  # e.g. shape [0, 2**62]: no bytes, but no such array either
            raise CheckpointError(f"{path}: tensor {name!r} has shape {list(shape)}, which NumPy cannot hold ({e})")
        tensors[name] = _to_float32(raw, dtype)
    return tensors


def index_safetensors(
    path: str | os.PathLike, file: BinaryIO | None = None
) -> tuple[list[tuple[str, str, tuple[int, ...], int, int]], int, int]:
    """Check a safetensors file's header against its size, reading no tensor data.

    Returns ([(name, dtype, shape, begin, end)] sorted by begin, data_start,
    data_size); raises CheckpointError naming the file (and the tensor) for
    anything that is not a well-formed file. file: as in read_safetensors.
    """
    path = Path(path)
    header, header_len, file_size = _read_header(path, file)
    header.pop("__metadata__", None)

    data_start = 8 + header_len
    data_size = file_size - data_start
    entries = sorted((_check_entry(path, name, info) for name, info in header.items()), key=lambda e: e[3])
    # The data section must be tiled exactly: each tensor starts where the last
    # ended, and the last ends at the end of the file. This rules out
    # truncation, overlap (two names reading the same bytes) and gaps.
    for name, _, _, begin, stop in entries:
        if stop > data_size:
            raise CheckpointError(
                f"{path}: tensor {name!r} needs bytes {begin}..{stop} but the data section has {data_size}; "
                f"the file is truncated or corrupt, delete it and download again"
            )
    end = 0
    for name, _, _, begin, stop in entries:
        if begin != end:
            raise CheckpointError(
                f"{path}: tensor {name!r} (bytes {begin}..{stop}) overlaps another tensor or leaves a gap "
                f"before it; the file is corrupt, delete it and download again"
            )
        end = stop
    if end != data_size:
        raise CheckpointError(
            f"{path}: {data_size - end} bytes after the last tensor; the file is corrupt, delete it and download again"
        )
    return entries, data_start, data_size


def _read_header(path: Path, file: BinaryIO | None = None) -> tuple[dict, int, int]:
    """(the JSON header as a dict, its length in bytes, the file's size), checked to be a JSON object."""
    if file is None:
        with opened(path) as f:
            return _read_header(path, f)
    file_size = os.fstat(file.fileno()).st_size
    file.seek(0)
    prefix = file.read(8)
    if len(prefix) < 8:
        raise CheckpointError(f"{path}: {file_size} bytes is too short for a safetensors file")
    header_len = int.from_bytes(prefix, "little")
    if header_len > min(_MAX_HEADER_BYTES, file_size - 8):
        raise CheckpointError(
            f"{path}: header length {header_len} does not fit in a {file_size}-byte file; "
            f"the file is truncated or not safetensors, delete it and download again"
        )
    raw_header = file.read(header_len)
    # NOTE: json.loads recurses once per nesting level: a header of 100,000
    # brackets would raise RecursionError. A real header nests 3 deep.
    if safe_io.json_depth(raw_header) > _MAX_DEPTH:
        raise CheckpointError(f"{path}: the header nests deeper than {_MAX_DEPTH}; the file is corrupt, delete it")
    try:
        header = json.loads(raw_header)
    except ValueError as e:  # not UTF-8, not JSON, or an integer of more than 4300 digits
        raise CheckpointError(f"{path}: the header is not valid JSON ({e}); delete the file and download again") from e
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the header is not a JSON object")
    return header, header_len, file_size


def read_metadata(path: str | os.PathLike, file: BinaryIO | None = None) -> dict:
    """The header's "__metadata__" object (string keys and values by the format's rules), or {}."""
    metadata = _read_header(Path(path), file)[0].get("__metadata__")
    return metadata if isinstance(metadata, dict) else {}


def opened(path: Path) -> BinaryIO:
    """A safetensors file open for reading, by the one reader (safe_io.open_regular: a regular file, links
    followed as a model folder may be made of them, a FIFO or device refused at once); CheckpointError
    naming the file otherwise (FileNotFoundError when it is missing)."""
    try:
        return safe_io.open_regular(path)
    except safe_io.Refused as e:
        raise CheckpointError(f"{path}: {e}") from None


def header_sha256(path: str | os.PathLike) -> str:
    """sha256 of the length prefix and header: names, dtypes, shapes and offsets of every tensor."""
    with opened(Path(path)) as f:
        prefix = f.read(8)
        return hashlib.sha256(prefix + f.read(min(int.from_bytes(prefix, "little"), _MAX_HEADER_BYTES))).hexdigest()


def _check_entry(path: Path, name: str, info) -> tuple[str, str, tuple[int, ...], int, int]:
    """One header entry as (name, dtype, shape, begin, end), or a CheckpointError."""
    try:
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        ok = (
            isinstance(dtype, str)
            and isinstance(shape, list)
            and isinstance(offsets, list)
            and len(offsets) == 2
            and all(type(d) is int and d >= 0 for d in shape)
            and all(type(o) is int and o >= 0 for o in offsets)
        )
    except (TypeError, KeyError):
        ok = False
    if not ok:
        raise CheckpointError(
            f"{path}: tensor {name!r} has a malformed header entry {info!r:.200}; the file is corrupt"
        )
    if dtype not in _DTYPES:
        raise CheckpointError(f"{path}: tensor {name!r} has dtype {dtype:.20}; only F32, F16 and BF16 are supported")
    begin, end = offsets
    # Python ints: NumPy's int64 product of [2**32, 2**32] would wrap to 0 and pass.
    n_bytes = math.prod(shape) * _DTYPES[dtype].itemsize
    if end - begin != n_bytes:
        raise CheckpointError(
            f"{path}: tensor {name!r} claims bytes {begin}..{end} for shape {shape} {dtype} ({n_bytes} bytes); "
            f"the file is corrupt, delete it and download again"
        )
    return name, dtype, tuple(shape), begin, end


def _to_float32(raw: np.ndarray, dtype_name: str) -> np.ndarray:
    if dtype_name == "F32":
        return raw
    if dtype_name == "F16":
        converted = raw.astype(np.float32)
    else:  # BF16 is the top half of a float32: shift the 16 bits back into place.
        converted = (raw.astype(np.uint32) << 16).view(np.float32)
    release_pages(raw)
    return converted


def release_pages(array: np.ndarray) -> None:
    """Tell the kernel this process no longer needs the file pages behind a
    memory-mapped array it has copied from.

    Pages read through a mapping count in the process's resident memory for as
    long as they stay mapped. Without this, loading (which copies the linear
    weights into a transposed layout) would briefly hold every weight twice. The
    array stays valid: touching it again just reads the file (or page cache).
    """
    mm = getattr(array, "_mmap", None)  # set on np.memmap and its views
    if mm is None or array.nbytes == 0 or not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    start = array.ctypes.data - np.frombuffer(mm, np.uint8).ctypes.data
    first_page = start // mmap.PAGESIZE * mmap.PAGESIZE
    try:
        mm.madvise(mmap.MADV_DONTNEED, first_page, start + array.nbytes - first_page)
    except (OSError, ValueError):
        pass  # only advice: memory use is higher, nothing else changes


# Writing: for tests, the benchmark and offline demo models.


def _encode(array: np.ndarray, dtype_name: str) -> np.ndarray:
    array = np.ascontiguousarray(array, dtype=np.float32)
    if dtype_name == "BF16":  # keep the top 16 bits (truncation; fine for test files)
        return (array.view(np.uint32) >> 16).astype("<u2")
    return array.astype(_DTYPES[dtype_name], copy=False)


def write_safetensors(
    path: str | os.PathLike, tensors, dtype: str | dict = "F32", metadata: dict | None = None, mode: int = 0o644
) -> int:
    """Write tensors as safetensors (safe_io.replacing: whole or not at all, never through a link); returns
    the file size. Arguments as safetensors_chunks; mode: the file's permission bits."""
    with safe_io.replacing(path, mode) as f:
        return write_safetensors_to(f, tensors, dtype, metadata)


def write_safetensors_to(f: BinaryIO, tensors, dtype: str | dict = "F32", metadata: dict | None = None) -> int:
    """safetensors_chunks written into an open binary file (safe_io.replacing's); returns the bytes written."""
    return sum(f.write(chunk) for chunk in safetensors_chunks(tensors, dtype, metadata))


def safetensors_chunks(
    tensors, dtype: str | dict = "F32", metadata: dict | None = None
) -> Iterator[bytes | memoryview]:
    """A safetensors file's bytes, in order: the length prefix, the header, each tensor's data.

    tensors: a dict, or a function returning (name, array) pairs (called twice,
    once for the header and once for the data, so only one tensor is in memory
    at a time). dtype: "F32", "F16" or "BF16" for every tensor, or {name: dtype}
    (F32 for a name it leaves out). metadata: more string pairs for the header's
    "__metadata__".
    """
    pairs = tensors.items if isinstance(tensors, dict) else tensors

    def dtype_of(name: str) -> str:
        return dtype.get(name, "F32") if isinstance(dtype, dict) else dtype

    header, offset = {"__metadata__": {"format": "pt", **(metadata or {})}}, 0
    for name, array in pairs():
        n_bytes = math.prod(array.shape) * _DTYPES[dtype_of(name)].itemsize
        header[name] = {"dtype": dtype_of(name), "shape": list(array.shape), "data_offsets": [offset, offset + n_bytes]}
        offset += n_bytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned
    yield len(blob).to_bytes(8, "little")
    yield blob
    for name, array in pairs():
        yield _encode(array, dtype_of(name)).data.cast("B")  # the array's bytes, not a copy of them


def check_finite(array: np.ndarray, name: str, source: str) -> None:
    """Refuse NaN or infinite weights, which would make every logit NaN (greedy then emits token 0 forever).

    A chunked scan (no full-size temporary) that names the tensor, split over
    specdec's workers (threads.py) like the matrix products: for GPT-2 355M's
    1.4 GB in the page cache, about 0.09 s of a copying load_folder's 0.3 s on 2 cores.
    """
    flat = np.asarray(array).reshape(-1)  # a plain view: slicing an np.memmap costs a Python object per slice
    chunk = 1 << 20
    starts = range(0, flat.size, chunk)
    n_parts = max(1, min(kernels.SPLIT_PARTS, len(starts)))
    finite = [True] * n_parts

    def scan(part: int) -> None:
        for start in starts[part::n_parts]:
            if not np.isfinite(flat[start : start + chunk]).all():
                finite[part] = False
                return

    threads.workers(n_parts).run([lambda part=part: scan(part) for part in range(n_parts)], blas=False)
    if not all(finite):
        raise CheckpointError(
            f"{source}: tensor {name!r} holds NaN or infinite values; the file is corrupt (or the model diverged "
            f"in training), delete it and download again"
        )
