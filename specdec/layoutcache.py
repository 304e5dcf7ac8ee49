"""The transposed weights kept beside a checkpoint, so that later loads copy nothing.

What it adds: GPT-2's checkpoint stores each linear weight as [n_in, n_out],
and `linear()` wants the transpose (see gpt2.Linear), so a load copies every
linear weight once (gpt2.transposed_copy). The first load of a large checkpoint
writes those copies to a safetensors file of specdec's own in the model's
folder, `specdec-transposed.safetensors`; later loads memory-map that file
instead. Nothing is copied, and no new memory is taken: the pages come from the
page cache, shared by every process that loads the model.

Never stale: the file records the checkpoint's size, its modification time in
nanoseconds and the sha256 of its header (every tensor's name, dtype, shape and
offsets). A load uses the file only when all three match the checkpoint on disk
now, and otherwise copies afresh and writes the file again. (A checkpoint
rewritten with the same size, header and modification time, to the nanosecond,
would go unnoticed; hashing 1.4 GB on every load would cost more than the copy
it saves.)

Best effort: a folder that cannot be written (read-only, nearly full) loads as
before, without the file. The file is written under a temporary name and
renamed, so no reader sees half of one. Checkpoints under MIN_BYTES (the shipped
family: a few MB) are not worth a second file. SPECDEC_NO_LAYOUT_CACHE=1 turns
the whole thing off.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from .gpt2 import Weights
from .safetensors import CheckpointError, header_sha256, read_metadata, read_safetensors, write_safetensors

FILE_NAME = "specdec-transposed.safetensors"
MIN_BYTES = 64 << 20  # checkpoints smaller than this load in milliseconds anyway
LINEARS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
LAYOUT = "1"  # bump when what the file holds changes
STALE_SECONDS = 3600  # a temporary file this old was left by a process killed while writing


def enabled(weights_path: Path) -> bool:
    return os.environ.get("SPECDEC_NO_LAYOUT_CACHE", "") in ("", "0") and weights_path.stat().st_size >= MIN_BYTES


def stamp(weights_path: Path) -> dict[str, str]:
    """What ties the file to one version of the checkpoint (safetensors metadata values are strings)."""
    st = weights_path.stat()
    return {"specdec_layout": LAYOUT, "source_size": str(st.st_size), "source_mtime_ns": str(st.st_mtime_ns),
            "source_header_sha256": header_sha256(weights_path)}  # fmt: skip


def read(weights_path: Path, source: dict[str, str], shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray] | None:
    """{"h.N.<linear>.weight": W.T as a read-only memory map} if the file matches the checkpoint
    and holds every linear weight with the transposed shape; else None.

    source: stamp(weights_path), taken before the checkpoint was read. shapes: the
    checkpoint's shapes of those weights, [n_in, n_out].
    """
    path = weights_path.parent / FILE_NAME
    if not path.is_file():
        return None
    try:
        if read_metadata(path) != {"format": "pt", **source}:
            return None  # stale: the checkpoint changed since the file was written
        tensors = read_safetensors(path)
    except (CheckpointError, OSError):
        return None  # damaged: copy afresh, and the file is written again
    ok = tensors.keys() == shapes.keys() and all(
        tensors[name].dtype == np.float32 and tensors[name].shape == shape[::-1] for name, shape in shapes.items()
    )
    return tensors if ok else None


def write(weights_path: Path, source: dict[str, str], weights: Weights) -> bool:
    """Write the transposed linear weights beside the checkpoint; False where it cannot (no harm done).

    source: stamp(weights_path), taken before the checkpoint was read, so weights read
    from a checkpoint that changed meanwhile are never filed under its new stamp.
    """
    folder = weights_path.parent
    tensors = {f"h.{i}.{name}.weight": getattr(block, name.replace(".", "_")).w_t
               for i, block in enumerate(weights.blocks) for name in LINEARS}  # fmt: skip
    needed = sum(t.nbytes for t in tensors.values())
    tmp = None
    try:
        if shutil.disk_usage(folder).free < 2 * needed:  # leave room for everything else
            return False
        for old in folder.glob(f".{FILE_NAME}.*"):  # left by a process killed while writing
            if time.time() - old.stat().st_mtime > STALE_SECONDS:
                old.unlink(missing_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{FILE_NAME}.", dir=folder)
        os.close(fd)
        write_safetensors(tmp, tensors, "F32", metadata=source)
        os.chmod(tmp, 0o644)  # as readable as the checkpoint beside it (mkstemp makes it private)
        os.replace(tmp, folder / FILE_NAME)
        return True
    except OSError:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        return False
