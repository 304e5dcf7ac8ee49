"""One process at a time: an exclusive lock on a small file, for downloads, the kept layout and training.

fcntl.flock on POSIX, msvcrt.locking on Windows: both are released by the
operating system when the process dies, so a crash (even kill -9) never leaves
a stale lock. A lock file may be removed only by a process holding its lock
(`specdec cache --remove` does, with what it guards): a process that waited on the
removed file finds, once it holds that lock, that the name no longer leads to the
file it locked, and locks the file under the name now instead. So two processes
never hold two different files under one name.

    with exclusive(folder / ".lock") as held:   # wait=False: held is False at once if another process has it
        if held: ...
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator


@contextmanager
def exclusive(path: Path, wait: bool = True, on_wait: Callable[[], None] | None = None) -> Iterator[bool]:
    """Hold an exclusive lock on `path` (created if needed) for the with-block; yields whether it is held.

    wait=True blocks until the lock is free (calling on_wait() once first, if the
    lock is taken, so the caller can say why it waits) and always yields True.
    wait=False yields False at once when another process holds the lock.
    Raises OSError when the lock file cannot be created or opened.
    """
    path = Path(path)
    told = False
    while True:
        fd = _open(path)
        held = _try_lock(fd)
        if not held and wait:
            if on_wait is not None and not told:
                on_wait()
                told = True
            while not (held := _try_lock(fd, block=True)):
                time.sleep(0.1)
        if held and not _still_named(fd, path):  # removed (with what it guarded) while we waited: lock anew
            _unlock(fd)
            os.close(fd)
            continue
        break
    try:
        yield held
    finally:
        if held:
            _unlock(fd)
        os.close(fd)


def _open(path: Path) -> int:
    """The lock file open for locking, created (with its folder, which a removal may have taken) if needed."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    try:
        return os.open(path, flags, 0o644)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, flags, 0o644)


def _still_named(fd: int, path: Path) -> bool:
    """Whether `path` still names the file open as `fd` (not removed, nor replaced, since it was opened)."""
    try:
        named = os.lstat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


if sys.platform == "win32":
    import msvcrt

    def _try_lock(fd: int, block: bool = False) -> bool:
        os.lseek(fd, 0, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)  # LK_LOCK gives up after 10 s: poll instead
            return True
        except OSError:
            return False

    def _unlock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        except OSError:
            pass
else:
    import fcntl

    def _try_lock(fd: int, block: bool = False) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if block else fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)
