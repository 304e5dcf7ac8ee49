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

    write.py  replacing, write_file, write_json; DiskFull
    read.py   open_regular, read_all, read_bytes, read_json, parse_json, sha256_of, open_npz; Refused
    trust.py  untrusted, user_id

A leaf: imports nothing of specdec, so any layer may use it (tests/test_imports.py).
May import: the standard library and NumPy; nothing of specdec.
"""

from .read import (
    MAX_JSON_BYTES,
    MAX_JSON_DEPTH,
    Refused,
    json_depth,
    open_npz,
    open_regular,
    parse_json,
    read_all,
    read_bytes,
    read_json,
    sha256_of,
    sha256_of_file,
)
from .trust import untrusted, user_id
from .write import DiskFull, replacing, temporary_name, write_file, write_json

__all__ = [
    "DiskFull",
    "Refused",
    "replacing",
    "write_file",
    "write_json",
    "temporary_name",
    "open_regular",
    "read_all",
    "read_bytes",
    "read_json",
    "parse_json",
    "json_depth",
    "sha256_of",
    "sha256_of_file",
    "open_npz",
    "untrusted",
    "user_id",
    "MAX_JSON_BYTES",
    "MAX_JSON_DEPTH",
]
