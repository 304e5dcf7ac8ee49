"""One way to write a file and one way to read one: every file specdec keeps on disk goes through here.

specdec's files often sit in folders other users can write (a shared models
folder, a world-writable one, a training run's folder on a shared disk). So:

Writing (`replacing`, `write_file`, `write_json`): the bytes go into a new
temporary file beside the target, created exclusively under a random name
(O_CREAT | O_EXCL | O_NOFOLLOW: a name that already exists, a symbolic link
planted there included, is never opened; another name is drawn), written through
that one open file, flushed and fsync'd, and then renamed over the target. A
reader sees the old file or the new one, never half of one (not even after a
power cut); on any failure, Ctrl-C included, the temporary file is removed.
A full disk (ENOSPC, EDQUOT) is `DiskFull`, one line naming the file.

Reading (`open_regular`, `read_bytes`, `read_json`, `sha256_of`): the file is
opened once (O_NONBLOCK: opening a FIFO never waits for a writer; O_NOFOLLOW
where the file must not be a link) and every check is made on that open file,
the object then read: refused unless a regular file (a FIFO, /dev/zero, a
folder), refused when its size is over the bound its kind allows, and refused
when it yields more bytes than its size says (/proc/self/pagemap is a "regular
file" of size 0 that reads forever). JSON's nesting depth is bounded (Python's
parser recurses once per level) and its value must be the type asked for.
Refusals are `Refused` (a ValueError) with a sentence that does not repeat the
path: the caller names the file, as its messages do.

Trusting (`untrusted`): a file that others could have planted (a kept layout, a
stamp, a kernel plan) is used only when it is owned by the user reading it (or
the owner of the folder or checkpoint it serves) and no one else may write it.

A leaf: imports nothing of specdec, so any layer may use it (tests/test_imports.py).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import stat
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import numpy as np

MAX_JSON_BYTES = 1 << 20  # a JSON file specdec writes is a few kB (a training manifest passes its own bound)
MAX_JSON_DEPTH = 32  # the deepest JSON specdec writes nests 5 levels
TEMPORARY_TRIES = 100  # random names tried before giving up (each a 64-bit draw: a clash means names are planted)
_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)  # (absent on Windows, which has no symbolic links of this kind)
_BINARY = getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_STEP = np.zeros(256, np.int8)  # by byte: +1 opens a level, -1 closes one
_STEP[list(b"{[")], _STEP[list(b"}]")] = 1, -1
_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


class DiskFull(OSError):
    """No space left (or the user's quota spent) while writing `filename`; nothing was left half-written."""

    def __str__(self) -> str:
        return f"no space left on device writing {self.filename}; free some space (or write elsewhere) and run again"


class Refused(ValueError):
    """A file that is not read as it is: not a regular file, over its size bound, not the JSON expected..."""


# ---------------------------------------------------------------------------
# Writing.
# ---------------------------------------------------------------------------


def _random_name() -> str:
    """The random part of a temporary file's name (tests replace it to know every name the writer may choose)."""
    return secrets.token_hex(8)


def temporary_name(path: Path) -> Path:
    """A candidate temporary name beside `path`: hidden, `.NAME.<16 hex digits>.tmp`."""
    return path.with_name(f".{path.name}.{_random_name()}.tmp")


def _create_temporary(path: Path) -> tuple[int, Path]:
    """(fd, name) of a new, empty file beside `path`, created by this call and by no one else.

    NOTE: O_EXCL with O_CREAT fails on any name that exists, a symbolic link (even one that
    points nowhere) included, so no name someone planted is ever opened: another is drawn.
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | _NO_FOLLOW | _BINARY
    for _ in range(TEMPORARY_TRIES):
        tmp = temporary_name(path)
        try:
            return os.open(tmp, flags, 0o600), tmp
        except FileExistsError:
            continue
    raise FileExistsError(
        errno.EEXIST,
        f"{TEMPORARY_TRIES} random temporary names beside it were all taken "
        "(planted by someone who can write its folder?)",
        str(path),
    )


@contextmanager
def replacing(path: str | os.PathLike, mode: int = 0o644) -> Iterator[BinaryIO]:
    """Write `path` whole or not at all: yields a new temporary file beside it (open "w+b", so what was
    written can be read back before it gets its name); on leaving the block without an error, it is
    flushed, fsync'd, given `mode` and renamed over `path`. On any error it is removed and `path` is as
    it was. ENOSPC / EDQUOT (from writing, syncing or creating) raise DiskFull naming `path`.

    mode: the permission bits (0o644: readable by all, writable by its owner only; 0o600: private).
    """
    path = Path(path)
    tmp = None
    try:
        fd, tmp = _create_temporary(path)
        with os.fdopen(fd, "w+b") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename: a power cut leaves the old file, not zeros
            _chmod(f, tmp, mode)
            written = os.fstat(f.fileno())
            os.replace(tmp, path)
            tmp = None
            _check_landed(path, written)
        _sync_folder(path.parent)
    except OSError as e:
        if e.errno in _FULL and not isinstance(e, DiskFull):
            raise DiskFull(e.errno, "no space left on device", str(path)) from e
        raise
    finally:
        if tmp is not None:  # failed or interrupted: no temporary file left behind
            try:
                os.unlink(tmp)
            except OSError:
                pass


def write_file(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> None:
    """`data` as the whole of `path` (replacing)."""
    with replacing(path, mode) as f:
        f.write(data)


def write_json(path: str | os.PathLike, value, mode: int = 0o644, indent: int | None = 1) -> None:
    """`value` as JSON, the whole of `path` (replacing); NaN and infinity are refused (they are not JSON)."""
    write_file(path, (json.dumps(value, indent=indent, allow_nan=False) + "\n").encode("utf-8"), mode)


def _chmod(f: BinaryIO, tmp: Path, mode: int) -> None:
    if hasattr(os, "fchmod"):
        os.fchmod(f.fileno(), mode)  # the open file: never a name someone could swap meanwhile
    else:  # Windows: only the read-only bit means anything there
        os.chmod(tmp, mode)


def _check_landed(path: Path, written: os.stat_result) -> None:
    """After the rename: `path` must not be a link or other non-file someone swapped in for the temporary file
    in the instant between writing and renaming (possible in a folder others may write). A link found there is
    removed (that never touches what it points to) and the write reported as failed."""
    try:
        landed = os.lstat(path)
    except OSError:
        return  # renamed away already: a reader finds no file, never a wrong one
    if (landed.st_dev, landed.st_ino) == (written.st_dev, written.st_ino) or stat.S_ISREG(landed.st_mode):
        return  # ours, or another writer's whole file (a second process writing the same file)
    if stat.S_ISLNK(landed.st_mode):
        os.unlink(path)
    raise OSError(
        errno.EBUSY,
        "it was swapped for something else while it was written (someone else writes this folder)",
        str(path),
    )


def _sync_folder(folder: Path) -> None:
    """Best effort: the rename itself on disk (POSIX; Windows cannot open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------
# Reading.
# ---------------------------------------------------------------------------


def open_regular(path: str | os.PathLike, max_bytes: int | None = None, follow_links: bool = True) -> BinaryIO:
    """`path` open for reading (binary), checked on the open file: a regular file of at most max_bytes.

    follow_links=False: a symbolic link at `path` is refused (files specdec wrote into a folder others
    may write); True: a link is followed (a user's model folder may be made of links, as Hugging Face's
    cache is), and the checks are made on what it leads to, the object then read.
    FileNotFoundError when nothing is there; Refused for everything else that is wrong.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | _BINARY | (0 if follow_links else _NO_FOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_links:
            raise Refused("it is a symbolic link, which is not followed here; remove it") from None
        raise Refused(f"it cannot be opened ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"it is not a regular file (it is {_kind(st.st_mode)})")
        if max_bytes is not None and st.st_size > max_bytes:
            raise _too_large(st.st_size, max_bytes)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_all(f: BinaryIO, max_bytes: int | None = None) -> bytes:
    """Every byte of an open regular file (open_regular): exactly its size, read from the start.

    NOTE: a file that yields more than its size says (/proc/self/pagemap: size 0, endless) or
    more than max_bytes is refused after reading at most one byte past the bound.
    """
    if f.writable():
        f.flush()
    size = os.fstat(f.fileno()).st_size
    if max_bytes is not None and size > max_bytes:
        raise _too_large(size, max_bytes)
    f.seek(0)
    data = f.read(size + 1)
    if len(data) != size:
        raise Refused(
            f"it gave {len(data):,}{'+' if len(data) > size else ''} bytes where its size says {size:,} "
            "(it changed while read, or it is not an ordinary file)"
        )
    return data


def read_bytes(path: str | os.PathLike, max_bytes: int, follow_links: bool = True) -> bytes:
    """The whole of a regular file of at most max_bytes (open_regular, read_all)."""
    with open_regular(path, max_bytes, follow_links) as f:
        return read_all(f, max_bytes)


def parse_json(raw: bytes, expect: type | None = dict, max_depth: int = MAX_JSON_DEPTH):
    """JSON text -> its value, of type `expect` (None: any); Refused saying what is wrong.

    NOTE: json.loads recurses once per nesting level: 100,000 brackets raise RecursionError
    (caught here), and a value nested a few hundred deep would parse, only to raise it later in
    whatever code compares or walks it; so the parsed value's depth is bounded too (counted
    without recursion: a walk over the parsed containers, cheaper than a second scan of the text).
    """
    too_deep = f"it is not JSON specdec wrote (it nests deeper than {max_depth} levels)"
    try:
        value = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise Refused(too_deep) from None
    except ValueError as e:  # not UTF-8, not JSON, an integer of more than 4300 digits
        text = str(e)
        raise Refused(f"it is not valid JSON ({text if len(text) <= 120 else text[:117] + '...'})") from None
    if _nests_deeper(value, max_depth):
        raise Refused(too_deep)
    if expect is not None and not isinstance(value, expect):
        names = {dict: "object", list: "list"}
        raise Refused(f"expected a JSON {names.get(expect, expect.__name__)}, got a JSON {_json_type(value)}")
    return value


def read_json(
    path: str | os.PathLike, expect: type | None = dict, max_bytes: int = MAX_JSON_BYTES, follow_links: bool = True
):
    """A JSON file's value (read_bytes, parse_json)."""
    return parse_json(read_bytes(path, max_bytes, follow_links), expect)


def sha256_of(f: BinaryIO) -> str:
    """The sha256 of an open regular file's bytes, exactly its size of them (read_all's rule, in 1 MB steps).
    A file being written (replacing's) is flushed first, so its size counts every byte written."""
    if f.writable():
        f.flush()
    size = os.fstat(f.fileno()).st_size
    digest, left = hashlib.sha256(), size
    f.seek(0)
    while left > 0 and (chunk := f.read(min(left, 1 << 20))):
        digest.update(chunk)
        left -= len(chunk)
    if left or f.read(1):
        raise Refused(
            f"it did not give the {size:,} bytes its size says (it changed while read, or it is not an ordinary file)"
        )
    return digest.hexdigest()


def sha256_of_file(path: str | os.PathLike, max_bytes: int | None = None, follow_links: bool = True) -> str:
    """sha256_of a file opened by open_regular."""
    with open_regular(path, max_bytes, follow_links) as f:
        return sha256_of(f)


def open_npz(f: BinaryIO):
    """NumPy's .npz archive in an open regular file (open_regular), for `with ... as data: data[name]`.

    Refused unless it is a zip whose members, unpacked, take no more bytes than the file itself:
    np.savez stores them as they are, so a few kB that would unpack into gigabytes (a "zip bomb") are
    not specdec's. allow_pickle=False: a pickled object is refused, never run.
    """
    f.seek(0)
    if not zipfile.is_zipfile(f):  # (np.load would try anything else as a pickle)
        raise Refused("it is not an .npz file: truncated, or something else")
    f.seek(0)
    try:
        unpacked = sum(member.file_size for member in zipfile.ZipFile(f).infolist())
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise Refused(f"it is not a readable .npz file ({e})") from None
    size = os.fstat(f.fileno()).st_size
    if unpacked > size:
        raise Refused(
            f"its arrays would unpack into {unpacked:,} bytes from a {size:,}-byte file (np.savez stores "
            "them as they are)"
        )
    f.seek(0)
    return np.load(f, allow_pickle=False)


def _nests_deeper(value, limit: int) -> bool:
    """Whether containers nest more than `limit` levels in a parsed JSON value ([[1]] nests 2)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        inner = [child for child in children if isinstance(child, (dict, list))]
        if inner and depth + 1 > limit:
            return True
        stack.extend((child, depth + 1) for child in inner)
    return False


def json_depth(raw: bytes) -> int:
    """How deep brackets nest in JSON text, without parsing it (brackets inside strings do not count)."""
    skeleton = np.frombuffer(_JSON_STRING.sub(b'""', raw), np.uint8)
    return int(np.cumsum(_STEP[skeleton], dtype=np.int64).max(initial=0))


def _too_large(size: int, max_bytes: int) -> Refused:
    return Refused(f"it is too large: {size:,} bytes, more than the {max_bytes:,} a file of its kind may be")


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a file"


def _json_type(value) -> str:
    for kind, name in (
        (dict, "object"),
        (list, "list"),
        (str, "string"),
        (bool, "boolean"),
        ((int, float), "number"),
    ):
        if isinstance(value, kind):
            return name
    return "null"


# ---------------------------------------------------------------------------
# Trusting.
# ---------------------------------------------------------------------------


def untrusted(
    kept: os.stat_result, owner: os.stat_result, uid: int | None, whose: str = "the checkpoint's owner"
) -> str | None:
    """Why a file with status `kept` must not be trusted, or None.

    owner: the status of what the file serves (a checkpoint, the models folder), whose owner
    may also own it; uid: the user reading (None where the system has no user ids, as on Windows).
    NOTE: the owner of what it serves could change that thing itself, and the user reading
    trusts their own files; anyone else's file is refused, whatever it holds. A file no one but
    its owner may write stays that way.
    """
    if not stat.S_ISREG(kept.st_mode):
        return "it is not a regular file"
    if uid is None:
        return None
    if kept.st_uid not in (owner.st_uid, uid):
        return f"it is owned by user id {kept.st_uid}, neither {whose} ({owner.st_uid}) nor you ({uid})"
    if kept.st_mode & 0o022:
        return "users other than its owner can write it"
    return None


def user_id() -> int | None:
    """The user reading (None where the system has no user ids)."""
    return os.geteuid() if hasattr(os, "geteuid") else None
