"""The transposed weights kept beside a checkpoint, so that later loads copy nothing.

What it adds: GPT-2's checkpoint stores each linear weight as [n_in, n_out],
and `linear()` wants the transpose (see gpt2.Linear), so a load copies every
linear weight once (gpt2.transposed_copy). The first load of a large checkpoint
writes those copies to a safetensors file of specdec's own in the model's
folder, `specdec-transposed.safetensors`; later loads memory-map that file
instead. Nothing is copied, and no new memory is taken: the pages come from the
page cache, shared by every process that loads the model.

Never stale: the file records the checkpoint's size, the sha256 of its header
(every tensor's name, dtype, shape and offsets), its device and inode, and its
modification and status-change times in nanoseconds. A load uses the file only
when all of them match the checkpoint on disk now, and otherwise copies afresh
and writes the file again. A fine-tune of the same size has the same size and
header, and tools can set a file's modification time (`cp -p`, `rsync -a`,
`tar -x`), but not its status-change time (ctime), which any write or rename
updates; a replaced file also has a new inode. Hashing 1.4 GB on every load
would cost more than the copy it saves. A copied folder gets new inodes, so its
first load writes the file again: wasted work, never wrong weights.

Best effort: a folder that cannot be written (read-only, nearly full) loads as
before, without the file. The file is written under a temporary name, flushed to
disk and renamed, so no reader (not even after a power cut) sees half of one.
Checkpoints under MIN_BYTES (the shipped family: a few MB) are not worth a
second file. Writing it says so on stderr, once per checkpoint version.
SPECDEC_NO_LAYOUT_CACHE=1 (or load_folder(..., keep_layout=False)) turns the
whole thing off.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .safetensors import CheckpointError, header_sha256, read_metadata, read_safetensors, write_safetensors

FILE_NAME = "specdec-transposed.safetensors"
MIN_BYTES = 64 << 20  # checkpoints smaller than this load in milliseconds anyway
LAYOUT = "1"  # bump when what the file holds changes
STALE_SECONDS = 3600  # a temporary file this old was left by a process killed while writing


def enabled(weights_path: Path, keep_layout: bool | None = None) -> bool:
    """Whether loads of this checkpoint keep its layout: keep_layout if given, else unless
    SPECDEC_NO_LAYOUT_CACHE is 1/ON/YES/TRUE; never below MIN_BYTES."""
    if keep_layout is None:
        keep_layout = os.environ.get("SPECDEC_NO_LAYOUT_CACHE", "").strip().upper() not in {"1", "ON", "YES", "TRUE"}
    return keep_layout and weights_path.stat().st_size >= MIN_BYTES


def stamp(weights_path: Path) -> dict[str, str]:
    """What ties the file to one version of the checkpoint (safetensors metadata values are strings)."""
    st = weights_path.stat()
    fields = {"size": st.st_size, "device": st.st_dev, "inode": st.st_ino, "mtime_ns": st.st_mtime_ns,
              "ctime_ns": st.st_ctime_ns}  # fmt: skip
    return {"specdec_layout": LAYOUT, **{f"source_{k}": str(v) for k, v in fields.items()},
            "source_header_sha256": header_sha256(weights_path)}  # fmt: skip


def read(
    weights_path: Path, source: dict[str, str], shapes: dict[str, tuple[int, ...]]
) -> dict[str, np.ndarray] | None:
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
    except (CheckpointError, OSError, ValueError):  # ValueError: np.memmap of a file that shrank meanwhile
        return None  # damaged: copy afresh, and the file is written again
    ok = tensors.keys() == shapes.keys() and all(
        tensors[name].dtype == np.float32 and tensors[name].shape == shape[::-1] for name, shape in shapes.items()
    )
    return tensors if ok else None


def write(weights_path: Path, source: dict[str, str], tensors: dict[str, np.ndarray]) -> bool:
    """Write the transposed linear weights beside the checkpoint; False where it cannot (no harm done).

    source: stamp(weights_path), taken before the checkpoint was read and checked again
    after (checkpoint.load_folder), so weights from a checkpoint that changed meanwhile
    are never filed under its new stamp. tensors: {"h.N.<linear>.weight": W.T}.
    """
    folder = weights_path.parent
    needed = sum(t.nbytes for t in tensors.values())
    tmp = None
    try:
        if shutil.disk_usage(folder).free < 2 * needed:  # leave room for everything else
            return False
        for old in folder.glob(f".{FILE_NAME}.*"):  # left by a process killed while writing
            try:
                if time.time() - old.stat().st_mtime > STALE_SECONDS:
                    old.unlink()
            except OSError:  # another process cleaned it up first
                pass
        print(f"specdec: keeping the transposed weights of {weights_path} beside it ({needed / 1e9:.1f} GB, once; "
              f"later loads map them; SPECDEC_NO_LAYOUT_CACHE=1 turns this off)", file=sys.stderr, flush=True)  # fmt: skip
        fd, tmp = tempfile.mkstemp(prefix=f".{FILE_NAME}.", dir=folder)
        os.close(fd)
        write_safetensors(tmp, tensors, "F32", metadata=source)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())  # on disk before the rename: a power cut leaves the old state, not zeros
        os.chmod(tmp, weights_path.stat().st_mode & 0o666)  # as readable as the checkpoint (mkstemp: private)
        os.replace(tmp, folder / FILE_NAME)
        tmp = None
        return True
    except OSError:
        return False
    finally:
        if tmp is not None:  # failed, or interrupted (Ctrl-C): no partial file left
            Path(tmp).unlink(missing_ok=True)
