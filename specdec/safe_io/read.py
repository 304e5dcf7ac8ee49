"""Reading a file: opened once, refused unless a regular file within its size bound, every check made on the
object then read; JSON of bounded depth and the type asked for (the package docstring says why)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import zipfile
from typing import BinaryIO

import numpy as np

MAX_JSON_BYTES = 1 << 20  # a JSON file specdec writes is a few kB (a training manifest passes its own bound)
MAX_JSON_DEPTH = 32  # the deepest JSON specdec writes nests 5 levels
_NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)  # (absent on Windows, which has no symbolic links of this kind)
_BINARY = getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_STEP = np.zeros(256, np.int8)  # by byte: +1 opens a level, -1 closes one
_STEP[list(b"{[")], _STEP[list(b"}]")] = 1, -1


class Refused(ValueError):
    """A file that is not read as it is: not a regular file, over its size bound, not the JSON expected..."""


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
