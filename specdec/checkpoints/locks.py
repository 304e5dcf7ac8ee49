"""One process at a time: an exclusive lock on a small file, for downloads, the kept layout and training.

fcntl.flock on POSIX, msvcrt.locking on Windows: both are released by the
operating system when the process dies, so a crash (even kill -9) never leaves
a stale lock. The lock file itself stays (deleting it would let two processes
lock two different files under one name).

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
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    held = False
    try:
        held = _try_lock(fd)
        if not held and wait:
            if on_wait is not None:
                on_wait()
            while not (held := _try_lock(fd, block=True)):
                time.sleep(0.1)
        yield held
    finally:
        if held:
            _unlock(fd)
        os.close(fd)


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
