"""Downloading one file from the Hugging Face Hub (or a mirror), checked before it gets its real name.

What the downloader guarantees: a file under its real name in `models/` is
complete, came from a Hub-like server (one that names the commit it served),
matches the size and sha256 the Hub gives, and parses (`validate`, e.g.
folders.check_download: JSON, merges, the safetensors header). Bytes go to a
partial file, `<file>.incomplete`, written by one process at a time under a
per-file lock; other processes wait and then use the finished file. A verified
file is never written again. Transient failures (a 5xx or 429 answer, a dropped
connection) are retried with a warning each, resuming the LFS weights with a
Range request.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import requests

from .sizes import human_size
from .. import safe_io
from .locks import exclusive
from .registry import without_the_hub

log = logging.getLogger(__name__)  # retries are reported as warnings (stderr unless configured)

_SHA256 = re.compile(r"[0-9a-f]{64}")
_GIT_SHA1 = re.compile(r"[0-9a-f]{40}")


class DownloadError(RuntimeError):
    """A checkpoint could not be fetched; the message says what to do."""


class RemoteFileMissing(DownloadError):
    """The server has no such file (HTTP 404): for model.safetensors, the checkpoint may be sharded."""


def _progress_bar(total: int | None, initial: int, desc: str, show: bool):
    from tqdm import tqdm  # imported here so that importing specdec stays light

    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        leave=False,
        disable=not show,
    )


class _Transient(Exception):
    """A failure worth retrying: a 5xx or 429 answer, or a download that stopped short."""


_RETRYABLE = (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError, _Transient)


@dataclass(frozen=True)
class _Remote:
    """What the server says the file is (from a HEAD that does not follow the LFS redirect)."""

    size: int | None  # X-Linked-Size for LFS files, else Content-Length
    sha256: str | None  # LFS files: X-Linked-Etag is the sha256 of the content
    git_sha1: str | None  # other files: the ETag is the git blob hash of the content
    etag: str  # as sent, for If-Range


def _remote_file(session: requests.Session, url: str, headers: dict, timeout: float) -> _Remote:
    """Ask the server what the file should be, refusing answers that are not the Hub's.

    For files stored with git LFS the Hub answers /resolve/ with a redirect
    whose X-Linked-Size and X-Linked-Etag give the size and the sha256; small
    files are served directly with Content-Length and an ETag. Every answer
    carries X-Repo-Commit: a captive portal or a misconfigured proxy that
    answers 200 with a web page does not, and is refused here, as
    huggingface_hub refuses it. Same-host redirects (a renamed repo) are
    followed; a loop ends after 5.
    """
    for _ in range(5):
        r = session.head(url, headers=headers, allow_redirects=False, timeout=(timeout, timeout))
        _check_status(r, url)
        location = r.headers.get("Location")
        if r.is_redirect and location and "X-Linked-Etag" not in r.headers and not urlsplit(location).netloc:
            url = urljoin(url, location)
            continue
        break
    else:
        raise DownloadError(_redirect_loop(url))
    raw_etag = r.headers.get("X-Linked-Etag") or r.headers.get("ETag")
    if not r.headers.get("X-Repo-Commit") or not raw_etag:
        raise DownloadError(
            f"{url} was answered by something that is not a Hugging Face Hub (no X-Repo-Commit or ETag header): "
            f"a captive portal, proxy or wrong HF_ENDPOINT? Fix the network or HF_ENDPOINT and run again"
        )
    size = r.headers.get("X-Linked-Size") or (r.headers.get("Content-Length") if r.status_code == 200 else None)
    etag = raw_etag.strip().removeprefix("W/").strip('"').lower()
    lfs = "X-Linked-Etag" in r.headers
    return _Remote(
        size=int(size) if size and size.isdigit() else None,
        sha256=etag if lfs and _SHA256.fullmatch(etag) else None,
        git_sha1=etag if not lfs and _GIT_SHA1.fullmatch(etag) else None,
        etag=raw_etag.strip(),
    )


def _check_status(r: requests.Response, url: str) -> None:
    if r.status_code >= 500 or r.status_code == 429:
        raise _Transient(f"HTTP {r.status_code} from {url}")
    if r.status_code == 404:
        raise RemoteFileMissing(
            f"{url} does not exist (HTTP 404): check the model name, or set HF_ENDPOINT to a mirror that has it"
        )
    if r.status_code in (401, 403):
        raise DownloadError(
            f"{url} refused access (HTTP {r.status_code}): for a gated or private repo set HF_TOKEN "
            f"to a token that can read it"
        )
    if r.status_code >= 400 and r.status_code != 416:
        raise DownloadError(f"{url} answered HTTP {r.status_code}")


def _digest_of(path: Path, digest, prefix: bytes = b"") -> str:
    digest.update(prefix)
    with safe_io.open_regular(path, follow_links=False) as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _open_partial(partial: Path, append: bool):
    """The partial file for writing: a file of this user's own, never one planted under its name.

    A partial must keep one name across runs to be resumed, so it cannot be a fresh temporary file each
    time as every other file specdec writes is (safe_io.replacing). Instead: starting afresh, whatever
    is under the name (a link, someone else's file) is removed and a new file created exclusively
    (O_EXCL, O_NOFOLLOW); resuming, the open file must be a regular file of this user's with no other
    name (a hard link) and no one else allowed to write it, else it is removed and the download starts
    over (_resumable_size said 0 for it already).
    """
    flags = os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    if append:
        fd = os.open(partial, flags | os.O_APPEND)
        if _ours(os.fstat(fd)):
            return os.fdopen(fd, "ab")
        os.close(fd)
        raise _Transient(f"{partial} changed while it was resumed")
    partial.unlink(missing_ok=True)  # removes a link or another's file only; what a link points to is untouched
    return os.fdopen(os.open(partial, flags | os.O_CREAT | os.O_EXCL, 0o644), "wb")


def _ours(st: os.stat_result) -> bool:
    """A partial this user may resume: a regular file of theirs, with one name, that no one else may write."""
    mine = not hasattr(os, "geteuid") or st.st_uid == os.geteuid()
    return stat.S_ISREG(st.st_mode) and mine and st.st_nlink == 1 and not st.st_mode & 0o022


def _resumable_size(partial: Path) -> int:
    """Bytes of a partial download to resume from: 0 (and the file removed) for one that is not ours (_ours)."""
    try:
        st = partial.lstat()
    except FileNotFoundError:
        return 0
    if _ours(st):
        return st.st_size
    partial.unlink()
    return 0


def download_file(
    url: str,
    dest: Path,
    token: str | None = None,
    retries: int = 3,
    retry_delay: float = 1.0,
    progress: bool = True,
    timeout: float = 10.0,
    validate=None,
    lock_dir: Path | None = None,
) -> Path:
    """Fetch `url` into `dest`, checking size, hash and (with `validate`) content.

    One process at a time downloads a given file: the others wait on its lock
    and then find `dest` complete and use it. Bytes go to `dest` + ".incomplete",
    which becomes `dest` only when it is whole, matches the server's hash, and
    `validate(path)` (if given) has not raised: so a file under its real name is
    always right, and is never written again. Files with a sha256 (the LFS
    weights) resume after an interruption, in this run or the next, with a
    Range request guarded by If-Range; the sha256 then checks the whole. Small
    files have only a git hash, so they always start from zero.

    The lock files live in `lock_dir` (default: dest's folder/.locks), one
    small file per download, never removed (as huggingface_hub keeps them).
    """
    dest = Path(dest)
    lock_dir = dest.parent / ".locks" if lock_dir is None else Path(lock_dir)
    lock_dir.mkdir(parents=True, exist_ok=True)

    def waiting():
        log.warning("waiting for another process that is downloading %s", dest)

    with exclusive(lock_dir / f"{dest.name}.lock", on_wait=waiting):
        if dest.is_file():
            return dest  # another process finished it while we waited
        dest.parent.mkdir(parents=True, exist_ok=True)  # (again: a failed process removes an empty folder)
        partial = dest.with_name(dest.name + ".incomplete")
        try:
            _download_locked(url, dest, partial, token, retries, retry_delay, progress, timeout, validate)
        except BaseException:
            if partial.is_file() and not partial.is_symlink() and partial.stat().st_size == 0:
                partial.unlink()  # nothing worth resuming
            raise
    return dest


def _download_locked(url, dest: Path, partial: Path, token, retries, retry_delay, progress, timeout, validate) -> None:
    # identity: sizes and Range offsets must count the file's bytes, not gzip's
    # (huggingface_hub asks for the same).
    headers = {"Accept-Encoding": "identity"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    session = requests.Session()
    session.max_redirects = 5
    resumed = partial.is_file() and not partial.is_symlink() and partial.stat().st_size > 0
    remote = _fetch_with_retries(session, url, dest, partial, headers, retries, retry_delay, progress, timeout)
    problem = _problem(partial, remote, validate)
    if problem and resumed and remote.sha256 is not None:
        # A partial left by an earlier run was of another revision (or damaged): once more, from zero.
        log.warning(
            "%s: %s after resuming an earlier partial download; downloading it again from zero", dest.name, problem
        )
        partial.unlink()
        remote = _fetch_with_retries(session, url, dest, partial, headers, retries, retry_delay, progress, timeout)
        problem = _problem(partial, remote, validate)
    if problem:
        partial.unlink()
        raise DownloadError(f"{url}: {problem}; nothing was kept. Check the network or HF_ENDPOINT and run again")
    os.replace(partial, dest)


def _fetch_with_retries(session, url, dest, partial, headers, retries, retry_delay, progress, timeout) -> _Remote:
    """Ask for the file's description and bytes, retrying transient failures with a warning per retry."""
    remote = None
    for attempt in range(retries + 1):
        try:
            remote = _remote_file(session, url, headers, timeout)
            _fetch_into(session, url, partial, headers, remote, progress, dest.name, timeout)
            return remote
        except requests.TooManyRedirects as e:
            raise DownloadError(_redirect_loop(url)) from e
        except _RETRYABLE as e:
            # Transient: retry, resuming from what arrived; but without DNS, retrying will not help.
            if attempt == retries or _is_name_resolution_error(e):
                # NOTE: remote is None when no answer came in this run (refused, no DNS, 5xx/429 on every
                # try): the server has said nothing against the partial an earlier run left, so it stays.
                keep = partial.is_file() and (remote is None or _resumable(remote))
                if not keep:
                    partial.unlink(missing_ok=True)
                raise DownloadError(
                    f"could not download {url} ({_one_line(e)}) after {attempt + 1} tries. Check the network, set "
                    f"HF_ENDPOINT to a reachable mirror, or place {dest.name} (and the model's other files) "
                    f"in {dest.parent} by hand"
                    + ("; what arrived is kept and the next run resumes" if keep else "")
                    + ". "
                    + without_the_hub()
                ) from e
            delay = retry_delay * 2**attempt
            log.warning(
                "%s: %s; retrying in %g s (try %d of %d)", dest.name, _one_line(e), delay, attempt + 2, retries + 1
            )
            time.sleep(delay)
    raise AssertionError("unreachable: the last attempt returns or raises")


def _redirect_loop(url: str) -> str:
    return f"{url}: the server keeps redirecting (a loop); check HF_ENDPOINT or try again later"


def _resumable(remote: _Remote) -> bool:
    """Only a partial whose whole will be checked by a sha256 is worth resuming."""
    return remote.sha256 is not None


def _problem(partial: Path, remote: _Remote, validate) -> str | None:
    """Why `partial` is not exactly the file the server described, or None."""
    got = partial.stat().st_size
    if remote.size is not None and got != remote.size:
        return f"received {got} bytes, the server announced {remote.size}"
    if remote.sha256 is not None and _digest_of(partial, hashlib.sha256()) != remote.sha256:
        return f"the sha256 does not match the server's ({remote.sha256})"
    if remote.git_sha1 is not None and _digest_of(partial, hashlib.sha1(), b"blob %d\0" % got) != remote.git_sha1:
        return f"the git hash does not match the server's ETag ({remote.git_sha1})"
    if validate is not None:
        try:
            validate(partial)
        except ValueError as e:  # CheckpointError is a ValueError
            with safe_io.open_regular(partial, follow_links=False) as f:
                html = f.read(512).lstrip().lower().startswith((b"<!doctype html", b"<html"))
            return "the server sent a web page instead (a captive portal or proxy?)" if html else str(e)
    return None


def _is_name_resolution_error(error: Exception) -> bool:
    text = repr(error)
    return "NameResolutionError" in text or "Name or service not known" in text or "nodename nor servname" in text


def _one_line(error: Exception) -> str:
    """A short description of a requests/urllib3 error, whose str() can run to several lines."""
    if _is_name_resolution_error(error):
        return "the host name could not be resolved: no network, or no DNS"
    if isinstance(error, requests.ConnectionError) and "Connection refused" in repr(error):
        return "connection refused"
    if isinstance(error, requests.Timeout):
        return "the server did not answer in time"
    if isinstance(error, requests.exceptions.ChunkedEncodingError):
        return "the connection broke mid-file"
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _fetch_into(session, url, partial: Path, headers, remote: _Remote, progress: bool, desc: str, timeout) -> None:
    """Write what is missing into `partial`; raise _Transient if it stays short."""
    size = remote.size
    have = _resumable_size(partial)
    if not _resumable(remote) or (size is not None and have > size):
        have = 0  # no sha256 to check a spliced file with, or longer than the real file: start over
    if size is not None and have == size:
        return
    for _ in range(2):
        request_headers = dict(headers)
        if have:
            # If-Range: a file that changed since the partial began comes back whole (200), not spliced.
            request_headers.update(Range=f"bytes={have}-", **{"If-Range": remote.etag})
        with session.get(url, headers=request_headers, stream=True, timeout=(timeout, timeout)) as r:
            if r.status_code == 416 and have:
                have = 0  # the server refuses the range: drop the partial and start from zero, once
                continue
            _check_status(r, url)
            if r.status_code == 416:
                raise DownloadError(f"{url} answered HTTP 416 to a request without a Range")
            if have and r.status_code != 206:
                have = 0  # the server ignored the Range header (or the file changed): start over
            total = size
            if total is None and r.headers.get("Content-Length", "").isdigit():
                total = have + int(r.headers["Content-Length"])
            _check_free_space(partial, desc, (total or 0) - have)
            label = f"{partial.parent.name}/{desc}"  # the bar names the model: its folder is its repo
            try:
                with _open_partial(partial, append=bool(have)) as f, _progress_bar(total, have, label, progress) as bar:
                    for chunk in r.iter_content(chunk_size=1 << 16):
                        f.write(chunk)
                        bar.update(len(chunk))
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                got = partial.stat().st_size
                partial.unlink(missing_ok=True)
                raise DownloadError(
                    f"the disk filled up while downloading {desc} into {partial.parent} ({human_size(got)} of "
                    f"{human_size(total) if total else 'an unknown size'}); the partial file was removed. "
                    f"Free some space or choose another models folder"
                ) from e
        break
    got = partial.stat().st_size
    if total is not None and got < total:
        # Some urllib3 versions end a dropped stream quietly: keep what came, resume.
        raise _Transient(f"the connection closed after {got} of {total} bytes")
    if total is not None and got > total:
        partial.unlink()
        raise _Transient(f"received {got} bytes, more than the expected {total}")


def _check_free_space(partial: Path, desc: str, needed: int) -> None:
    free = shutil.disk_usage(partial.parent).free
    if needed > free:
        raise DownloadError(
            f"{desc} needs {human_size(needed)} but only {human_size(free)} is free in {partial.parent}: "
            f"free some space or choose another models folder"
        )
