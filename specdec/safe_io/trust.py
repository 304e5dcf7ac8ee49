"""Trusting a file others could have planted: used only when its owner is the user or the folder's owner, and no
one else may write it."""

from __future__ import annotations

import os
import stat


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
