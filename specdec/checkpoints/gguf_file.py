"""GGUF files (llama.cpp's format): header, metadata, tensor table, and dequantization to float32.

The layout (ggml's docs/gguf.md, version 3; every integer little-endian):
    magic "GGUF", version u32, tensor count u64, metadata count u64
    metadata: key (string), value type u32, value      (string = u64 length + UTF-8 bytes)
    tensor table: name (string), n_dims u32, dims u64[n_dims], ggml type u32, offset u64
    padding to `general.alignment` (default 32), then the tensor data; each
    tensor's offset is relative to the data section's start and aligned too.
NOTE: dims are listed fastest-varying first, so NumPy's shape is the reverse:
a matrix with dims [n_in, n_out] is the array [n_out, n_in] (row = output).

Block quantizations, 32 weights per block (ggml's ggml-common.h):
    Q8_0  f16 d, int8 q[32]                      w = d * q
    Q4_0  f16 d, u8 qs[16]                       w = d * (q - 8)
    Q4_1  f16 d, f16 m, u8 qs[16]                w = d * q + m
NOTE: in Q4_0 / Q4_1 the LOW nibbles of qs[0..15] are weights 0..15 of the
block and the HIGH nibbles are weights 16..31 (not interleaved pairs).

Everything read from the file is checked before it is used: a hostile or
truncated file is a CheckpointError naming the file (and the tensor), never a
traceback or a silently wrong array. gguf.py turns a file into a model.
"""

from __future__ import annotations

import mmap
import struct
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .. import safe_io
from .safetensors import CheckpointError

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # version 2 has the same layout with u64 counts; 1 used u32 counts and is long gone
DEFAULT_ALIGNMENT = 32
MAX_COUNT = 1 << 24  # metadata entries, array items, tensors: far above any real file
MAX_STRING = 1 << 26  # bytes in one string (a chat template is a few kB; merges are many short strings)
MAX_DIMS = 4

# Metadata value types -> struct format (scalars); 8 = string, 9 = array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class QuantType:
    """A ggml tensor type: how many weights share a block and how many bytes a block takes."""

    name: str
    block: int  # weights per block
    nbytes: int  # bytes per block


# The types specdec dequantizes; ggml's enum values (ggml.h).
TYPES = {
    0: QuantType("F32", 1, 4),
    1: QuantType("F16", 1, 2),
    2: QuantType("Q4_0", 32, 18),
    3: QuantType("Q4_1", 32, 20),
    8: QuantType("Q8_0", 32, 34),
    30: QuantType("BF16", 1, 2),
}
# Names of the types it refuses, so the message can say what the file holds.
OTHER_TYPES = {
    6: "Q5_0",
    7: "Q5_1",
    9: "Q8_1",
    10: "Q2_K",
    11: "Q3_K",
    12: "Q4_K",
    13: "Q5_K",
    14: "Q6_K",
    15: "Q8_K",
    16: "IQ2_XXS",
    17: "IQ2_XS",
    18: "IQ3_XXS",
    19: "IQ1_S",
    20: "IQ4_NL",
    21: "IQ3_S",
    22: "IQ2_S",
    23: "IQ4_XS",
    24: "I8",
    25: "I16",
    26: "I32",
    27: "I64",
    28: "F64",
    29: "IQ1_M",
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # NumPy order (the file's dims reversed)
    qtype: QuantType
    start: int  # absolute byte offset in the file
    nbytes: int


class GGUFFile:
    """An open GGUF file: `metadata` (a dict), `tensors` (name -> TensorInfo), and `tensor(name)` as float32.

    The file is memory-mapped; only the tensors asked for are read.
    """

    def __init__(self, path: str | Path, file: BinaryIO | None = None):
        """file: `path` already open (checked by the caller, as wheel.open_model does); else it is opened here."""
        self.path = Path(path)
        try:
            # NOTE: safe_io.open_regular: the type checked on the open file, opened without waiting, so a
            # FIFO (or a device) named *.gguf is refused at once instead of blocking the load forever
            with safe_io.open_regular(self.path) if file is None else nullcontext(file) as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except safe_io.Refused as e:
            raise CheckpointError(f"{self.path}: {e}") from None
        except ValueError:  # an empty file cannot be mapped
            raise self.error("is empty, not a GGUF file") from None
        except OSError as e:
            raise CheckpointError(f"{self.path}: cannot read it ({e.strerror or e})") from None
        self._pos = 0
        self.metadata: dict = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._parse()

    def error(self, what: str, tensor: str | None = None) -> CheckpointError:
        where = f"{self.path}" + (f", tensor {tensor!r}" if tensor else "")
        return CheckpointError(f"{where}: {what}; the file is truncated or not a GGUF model: download it again")

    # -- the header and tables -------------------------------------------------------------------------

    def _read(self, n: int) -> bytes:
        if n < 0 or self._pos + n > len(self._map):
            raise self.error(f"ends at byte {len(self._map)} where {n} more bytes were expected at {self._pos}")
        data = self._map[self._pos : self._pos + n]
        self._pos += n
        return data

    def _unpack(self, fmt: str):
        return struct.unpack(fmt, self._read(struct.calcsize(fmt)))[0]

    def _string(self) -> str:
        n = self._unpack("<Q")
        if n > MAX_STRING:
            raise self.error(f"has a string of {n} bytes")
        try:
            return self._read(n).decode("utf-8")
        except UnicodeDecodeError:
            raise self.error("has a string that is not UTF-8") from None

    def _count(self, what: str, item_bytes: int) -> int:
        """A count of items that take at least item_bytes each: refused when the bytes left cannot hold them."""
        n = self._unpack("<Q")
        if n > MAX_COUNT or n * item_bytes > len(self._map) - self._pos:
            raise self.error(f"claims {n} {what} in {len(self._map) - self._pos} bytes")
        return n

    def _value(self, kind: int, depth: int = 0):
        if kind in _SCALARS:
            return self._unpack(_SCALARS[kind])
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY and depth == 0:  # arrays of arrays do not occur in models
            item = self._unpack("<I")
            n = self._count("array items", struct.calcsize(_SCALARS[item]) if item in _SCALARS else 8)
            if item in _SCALARS:  # numbers: one read, not a Python object per item
                fmt = _SCALARS[item]
                raw = self._read(n * struct.calcsize(fmt))
                return np.frombuffer(raw, dtype=np.dtype(fmt)).tolist()
            return [self._value(item, depth + 1) for _ in range(n)]
        raise self.error(f"has a metadata value of unknown type {kind}")

    def _parse(self) -> None:
        if self._read(4) != MAGIC:
            raise self.error("does not start with the GGUF magic bytes")
        version = self._unpack("<I")
        if version not in VERSIONS:
            swapped = " (a big-endian file: specdec reads little-endian GGUF)" if version >= 1 << 16 else ""
            raise CheckpointError(f"{self.path}: GGUF version {version}{swapped} is not supported (only {VERSIONS})")
        # The smallest a table entry can be: a name (u64 length) and its fixed fields.
        n_tensors, n_meta = self._count("tensors", 8 + 4 + 8 + 4 + 8), self._count("metadata entries", 8 + 4 + 1)
        for _ in range(n_meta):
            key = self._string()
            if key in self.metadata:  # which of the two would a reader believe?
                raise self.error(f"gives metadata {key!r} twice")
            self.metadata[key] = self._value(self._unpack("<I"))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._unpack("<I")
            if not 1 <= n_dims <= MAX_DIMS:
                raise self.error(f"gives {n_dims} dimensions", name)
            dims = [self._unpack("<Q") for _ in range(n_dims)]
            kind, offset = self._unpack("<I"), self._unpack("<Q")
            infos.append((name, dims, kind, offset))
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
            raise self.error(f"has general.alignment {alignment!r}, not a power of two")
        data_start = -(-self._pos // alignment) * alignment
        for name, dims, kind, offset in infos:
            self.tensors[name] = self._tensor_info(name, dims, kind, offset, data_start, alignment)
        spans = sorted((t.start, t.start + t.nbytes, t.name) for t in self.tensors.values())
        for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
            if start < end:  # two names reading the same bytes
                raise self.error(f"overlaps tensor {first!r}", second)

    def _tensor_info(self, name, dims, kind, offset, data_start, alignment) -> TensorInfo:
        if name in self.tensors:
            raise self.error("names a tensor twice", name)
        if kind not in TYPES:
            what = OTHER_TYPES.get(kind, f"type {kind}")
            raise CheckpointError(
                f"{self.path}, tensor {name!r}: {what} quantization is not supported; specdec reads "
                f"{', '.join(t.name for t in TYPES.values())} (re-quantize the model to one of those, e.g. Q8_0)"
            )
        qtype = TYPES[kind]
        if any(d < 1 or d > 1 << 40 for d in dims):
            raise self.error(f"gives dimensions {dims}", name)
        count = int(np.prod(dims, dtype=object))
        if dims[0] % qtype.block:
            raise self.error(f"has rows of {dims[0]} weights, not whole {qtype.name} blocks of {qtype.block}", name)
        nbytes = count // qtype.block * qtype.nbytes
        start = data_start + offset
        if offset % alignment:
            raise self.error(f"starts at offset {offset}, not a multiple of the alignment {alignment}", name)
        if start + nbytes > len(self._map):
            raise self.error(f"lies at bytes {start}..{start + nbytes} of a {len(self._map)}-byte file", name)
        return TensorInfo(name, tuple(reversed(dims)), qtype, start, nbytes)

    # -- tensors ---------------------------------------------------------------------------------------

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view of the mapped file."""
        t = self.tensors[name]
        return np.frombuffer(self._map, dtype=np.uint8, count=t.nbytes, offset=t.start)

    def tensor(self, name: str) -> np.ndarray:
        """The tensor dequantized to a new float32 array of its NumPy shape; refuses NaN or infinite values."""
        if name not in self.tensors:
            raise CheckpointError(f"{self.path}: no tensor {name!r}; this is not the model the loader expects")
        t = self.tensors[name]
        values = dequantize(self.raw(name), t.qtype).reshape(t.shape)
        if not np.isfinite(values).all():
            raise CheckpointError(f"{self.path}, tensor {name!r}: holds NaN or infinite values; the file is corrupt")
        return values


def dequantize(raw: np.ndarray, qtype: QuantType) -> np.ndarray:
    """Bytes of whole blocks -> float32 weights, flat, in the file's order.

    NOTE: a damaged scale (an f16 inf or NaN) overflows here; NumPy's warnings about it are silenced,
    since GGUFFile.tensor refuses the non-finite result with one line naming the tensor.
    """
    with np.errstate(all="ignore"):
        return _dequantize(raw, qtype)


def _dequantize(raw: np.ndarray, qtype: QuantType) -> np.ndarray:
    if qtype.name == "F32":
        return raw.view("<f4").astype(np.float32)
    if qtype.name == "F16":
        return raw.view("<f2").astype(np.float32)
    if qtype.name == "BF16":  # the top 16 bits of a float32
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    blocks = raw.reshape(-1, qtype.nbytes)  # [n_blocks, bytes per block]
    d = blocks[:, 0:2].copy().view("<f2").astype(np.float32)  # [n_blocks, 1]
    if qtype.name == "Q8_0":
        q = blocks[:, 2:].view(np.int8).astype(np.float32)  # [n_blocks, 32]
        return (d * q).reshape(-1)
    qs = blocks[:, -16:]  # [n_blocks, 16]: two 4-bit weights per byte
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)  # low nibbles first: weights 0..15, 16..31
    if qtype.name == "Q4_0":
        return (d * (q - np.float32(8))).reshape(-1)
    m = blocks[:, 2:4].copy().view("<f2").astype(np.float32)  # Q4_1's minimum
    return (d * q + m).reshape(-1)
