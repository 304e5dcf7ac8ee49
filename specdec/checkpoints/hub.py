"""Where a checkpoint comes from: model names -> Hub repos, and the download.

The Hugging Face Hub serves every GPT-2 size as a `model.safetensors` file next
to `config.json`, `vocab.json` and `merges.txt`; a Llama (SmolLM2) as
`model.safetensors` (or shards listed in `model.safetensors.index.json`) next to
`config.json` and `tokenizer.json`. This module fetches config.json first, which
says the kind of model and so which files the rest are (`checkpoint_files`),
then those, into `<models_dir>/<owner>--<name>/` (once; afterwards no network is
touched). One folder per Hub repo: "124M" and "openai-community/gpt2" share it.

Where models_dir is, when not given: the same folder whatever the current
directory, as huggingface_hub keeps its cache in ~/.cache/huggingface:
    $SPECDEC_HOME/models            when SPECDEC_HOME is set
    $XDG_CACHE_HOME/specdec/models  when XDG_CACHE_HOME is set
    ~/.cache/specdec/models         otherwise

Environment variables, read in one place (`HubSettings.from_env`), with the
meanings huggingface_hub gives them (SPECDEC_HOME, above, is read by `default_models_dir`):
    HF_ENDPOINT     base URL of the Hub or a mirror (default https://huggingface.co)
    HF_HUB_OFFLINE  1/ON/YES/TRUE: never touch the network; use local files only
    HF_TOKEN        sent as a bearer token, for gated or private repos
    HF_HUB_DOWNLOAD_TIMEOUT  seconds to wait for the server to answer (default 10)

What the downloader guarantees: a file under its real name in `models/` is
complete, came from a Hub-like server (one that names the commit it served),
matches the size and sha256 the Hub gives, and parses (JSON, merges, the
safetensors header). Bytes go to a partial file, `<file>.incomplete`, written by
one process at a time under a per-file lock; other processes wait and then use
the finished file. A verified file is never written again.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import requests

from . import draft, family
from .locks import exclusive
from .pins import WHEELS
from .safetensors import CheckpointError, index_safetensors

log = logging.getLogger(__name__)  # retries are reported as warnings (stderr unless configured)

# Short names for the released checkpoints, and the Hub repository of each.
MODEL_REPOS = {
    "124M": "openai-community/gpt2",
    "355M": "openai-community/gpt2-medium",
    "774M": "openai-community/gpt2-large",
    "1558M": "openai-community/gpt2-xl",
    "distilgpt2": "distilbert/distilgpt2",
}
# The Hub's own short names for GPT-2 (what Hugging Face users type), accepted as the names above.
HUB_SHORT_NAMES = {"gpt2": "124M", "gpt2-medium": "355M", "gpt2-large": "774M", "gpt2-xl": "1558M"}
# SmolLM2 (a Llama) from the Hub, as released in BF16 safetensors and loaded as float32 (hf_llama.py).
# Short names are the Instruct models, since chat is what they are for; "-base" names the pretrained
# ones. "smollm2-135m" itself is the quantized GGUF from a pinned wheel (wheel.py), which needs no Hub;
# "smollm2-135m-bf16" is the same Instruct model as released on the Hub, unquantized.
LLAMA_REPOS = {
    "smollm2-135m-bf16": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "smollm2-360m": "HuggingFaceTB/SmolLM2-360M-Instruct",
    "smollm2-1.7b": "HuggingFaceTB/SmolLM2-1.7B-Instruct",
    "smollm2-135m-base": "HuggingFaceTB/SmolLM2-135M",
    "smollm2-360m-base": "HuggingFaceTB/SmolLM2-360M",
    "smollm2-1.7b-base": "HuggingFaceTB/SmolLM2-1.7B",
}
CHECKPOINT_FILES = ("config.json", "model.safetensors", "vocab.json", "merges.txt")  # a GPT-2 folder
LLAMA_FILES = ("config.json", "model.safetensors", "tokenizer.json")  # a Llama folder (or shards: see below)
WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"
# Size of each repo's model.safetensors (GPT-2: float32; SmolLM2: BF16), to say what a first run is about to download.
DOWNLOAD_SIZES = {
    "openai-community/gpt2": 548_000_000,
    "openai-community/gpt2-medium": 1_520_000_000,
    "openai-community/gpt2-large": 3_250_000_000,
    "openai-community/gpt2-xl": 6_430_000_000,
    "distilbert/distilgpt2": 353_000_000,
    "HuggingFaceTB/SmolLM2-135M-Instruct": 269_000_000,
    "HuggingFaceTB/SmolLM2-360M-Instruct": 724_000_000,
    "HuggingFaceTB/SmolLM2-1.7B-Instruct": 3_420_000_000,
    "HuggingFaceTB/SmolLM2-135M": 269_000_000,
    "HuggingFaceTB/SmolLM2-360M": 724_000_000,
    "HuggingFaceTB/SmolLM2-1.7B": 3_420_000_000,
}
DEFAULT_ENDPOINT = "https://huggingface.co"

# The Hub's rule for a repo id: owner/name, each of letters, digits, "_", "." and
# "-", not starting or ending with "." or "-", at most 96 characters, and with
# no "--" or ".." anywhere ("--" is what joins owner and name in a folder name,
# so "a--b/c" and "a/b--c" would otherwise share models/a--b--c).
_REPO_PART = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_REPO_ID = re.compile(f"{_REPO_PART}/{_REPO_PART}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_GIT_SHA1 = re.compile(r"[0-9a-f]{40}")


class DownloadError(RuntimeError):
    """A checkpoint could not be fetched; the message says what to do."""


class RemoteFileMissing(DownloadError):
    """The server has no such file (HTTP 404): for model.safetensors, the checkpoint may be sharded."""


# ---------------------------------------------------------------------------
# Where a model comes from.
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class HubSettings:
    endpoint: str = DEFAULT_ENDPOINT
    offline: bool = False
    token: str | None = None
    timeout: float = 10.0  # seconds to connect, and seconds of silence allowed mid-answer
    retries: int = 3  # after the first try: at most 4 tries, about 4 * 2 * timeout + 7 s in all
    retry_delay: float = 1.0  # doubled after each retry

    @classmethod
    def from_env(cls) -> "HubSettings":
        """The one place that reads the environment, as huggingface_hub does."""
        endpoint = os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
        if not endpoint.startswith(("http://", "https://")):
            raise ValueError(f"HF_ENDPOINT must be a URL starting with http:// or https://, not {endpoint!r}")
        offline = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
        try:
            timeout = float(os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT") or 10.0)
        except ValueError:
            raise ValueError("HF_HUB_DOWNLOAD_TIMEOUT must be a number of seconds") from None
        return cls(endpoint.rstrip("/"), offline, os.environ.get("HF_TOKEN") or None, timeout)

    def url(self, repo: str, filename: str) -> str:
        return f"{self.endpoint}/{repo}/resolve/main/{filename}"


def default_models_dir() -> Path:
    """Where downloaded models live when no models_dir is given (see the module docstring)."""
    if os.environ.get("SPECDEC_HOME"):
        return Path(os.environ["SPECDEC_HOME"]).expanduser() / "models"
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "specdec" / "models"


def resolve_model(name_or_path: str, models_dir: str | os.PathLike | None = None) -> tuple[Path, str | None]:
    """Map a name to (local folder, Hub repo or None for a plain local folder).

    "124M" -> (models_dir/openai-community--gpt2, "openai-community/gpt2"), the
    folder "openai-community/gpt2" gets too; an existing folder -> (folder, None).
    models_dir None: default_models_dir().
    """
    name = str(name_or_path)
    if models_dir is not None and not isinstance(models_dir, (str, os.PathLike)):
        raise ValueError(f"models_dir must be a folder path (a str or os.PathLike) or None, got {models_dir!r:.80}")
    if models_dir is not None and not str(models_dir):
        raise ValueError("models_dir is empty: give a folder, or leave it out for the default " + _default_dir_text())
    models_dir = default_models_dir() if models_dir is None else Path(models_dir)
    name = HUB_SHORT_NAMES.get(name, name)
    if name in MODEL_REPOS:
        repo = MODEL_REPOS[name]
        legacy = models_dir / name  # where earlier versions put short names: still used if complete
        if all((legacy / f).is_file() for f in CHECKPOINT_FILES) and not (models_dir / _folder_name(repo)).exists():
            return _download_folder(models_dir, name), repo
        return _download_folder(models_dir, _folder_name(repo), repo), repo
    if name in LLAMA_REPOS:
        repo = LLAMA_REPOS[name]
        return _download_folder(models_dir, _folder_name(repo), repo), repo
    if name in family.NAMES:  # shipped inside the package: nothing to download
        return family.folder(name), None
    if Path(name).is_dir():
        return Path(name), None
    if name.startswith(("/", "./", "../", "~")) or "\\" in name:
        raise ValueError(f"{name} is not a folder: a local model is {_LOCAL_MODELS}")
    if _REPO_ID.fullmatch(name) and ".." not in name and "--" not in name:
        return _download_folder(models_dir, _folder_name(name), name), name
    raise ValueError(f"unknown model {name!r}: use {known_models()}")


# What a local model can be (load.load_model reads each).
_LOCAL_MODELS = (f"a folder holding a GPT-2 checkpoint ({', '.join(CHECKPOINT_FILES)}) or a Llama one "
                 f"({', '.join(LLAMA_FILES)}), or a Llama GGUF file (a path ending in .gguf)")  # fmt: skip


def known_models() -> str:
    """Every way to name a model, from the name tables themselves: short names, repo ids, local models."""
    names = [*MODEL_REPOS, *HUB_SHORT_NAMES, *WHEELS, *LLAMA_REPOS, *family.NAMES, draft.NAME]
    return f"one of {', '.join(names)}, a Hub repo id such as 'openai-community/gpt2', or {_LOCAL_MODELS}"


def without_the_hub() -> str:
    """Commands that work when the Hub cannot be reached, as an installed package runs them."""
    chat = next(iter(WHEELS))
    return (f"Without the Hub, {chat} works (fetched once with pip from the package index): specdec "
            f"--target_model_size {chat} --draft ngram --chat; with no network at all, the small models shipped "
            f"with specdec: specdec --target_model_size {family.TARGET} --draft {family.DRAFT} (python -m specdec "
            "takes the same flags)")


def _folder_name(repo: str) -> str:
    return repo.replace("/", "--")  # as huggingface_hub names repo folders (models--owner--name)


def _default_dir_text() -> str:
    return f"({default_models_dir()}; set SPECDEC_HOME to move it)"


def _download_folder(models_dir: Path, folder_name: str, name: str | None = None) -> Path:
    """models_dir/folder_name, refused if it is a link or would lie outside models_dir.

    The downloader writes there, so it must be a plain folder of models_dir: a
    symbolic link there could make a download land anywhere.
    """
    folder = models_dir / folder_name
    if folder.is_symlink():
        raise ValueError(
            f"{folder} is a symbolic link; the downloader only writes into plain folders. Load the folder it points "
            f"to by its path instead (load_model('{os.path.realpath(folder)}')), or set models_dir to its parent"
        )
    if models_dir.resolve() not in folder.resolve().parents:  # the patterns exclude this; check the result too
        raise ValueError(f"model name {name or folder_name!r} would place files outside {models_dir}")
    return folder


# ---------------------------------------------------------------------------
# Download: one process per file, checked before it gets its real name.
# ---------------------------------------------------------------------------


def _progress_bar(total: int | None, initial: int, desc: str, show: bool):
    from tqdm import tqdm  # imported here so that importing specdec stays light

    return tqdm(total=total, initial=initial, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                leave=False, disable=not show)  # fmt: skip


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
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _open_partial(partial: Path, append: bool):
    """The partial file for writing, never through a symbolic link planted under its name."""
    if partial.is_symlink():
        partial.unlink()  # removes the link only; what it points to is untouched
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    flags |= os.O_APPEND if append else os.O_TRUNC
    return os.fdopen(os.open(partial, flags, 0o644), "ab" if append else "wb")


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
        log.warning("%s: %s after resuming an earlier partial download; downloading it again from zero",
                    dest.name, problem)  # fmt: skip
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
        if attempt:
            delay = retry_delay * 2 ** (attempt - 1)
            log.warning("%s: %s; retrying in %g s (try %d of %d)", dest.name, _one_line(error), delay,
                        attempt + 1, retries + 1)  # fmt: skip
            time.sleep(delay)
        try:
            remote = _remote_file(session, url, headers, timeout)
            _fetch_into(session, url, partial, headers, remote, progress, dest.name, timeout)
            return remote
        except requests.TooManyRedirects as e:
            raise DownloadError(_redirect_loop(url)) from e
        except _RETRYABLE as e:
            # Transient: retry, resuming from what arrived; but without DNS, retrying will not help.
            error = e
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
                    + ("; what arrived is kept and the next run resumes" if keep else "") + ". "
                    + without_the_hub()
                ) from e
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
            with open(partial, "rb") as f:
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
    have = partial.stat().st_size if partial.is_file() and not partial.is_symlink() else 0
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
                    f"the disk filled up while downloading {desc} into {partial.parent} ({_human(got)} of "
                    f"{_human(total) if total else 'an unknown size'}); the partial file was removed. "
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


def _human(n: int) -> str:
    for unit in ("bytes", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _check_free_space(partial: Path, desc: str, needed: int) -> None:
    free = shutil.disk_usage(partial.parent).free
    if needed > free:
        raise DownloadError(
            f"{desc} needs {_human(needed)} but only {_human(free)} is free in {partial.parent}: "
            f"free some space or choose another models folder"
        )


# ---------------------------------------------------------------------------
# Which files a model folder holds: config.json says what kind of model it is.
# ---------------------------------------------------------------------------

_SHARD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,200}\.safetensors")


def model_kind(folder: Path) -> str:
    """"gpt2" or "llama", from config.json's model_type (or architectures), as transformers decides.

    A config.json that is missing or not a JSON object counts as GPT-2, whose
    reader (load.read_hparams) then says what is wrong with it.
    """
    try:
        config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return "gpt2"
    if not isinstance(config, dict):
        return "gpt2"
    model_type, architectures = config.get("model_type"), config.get("architectures")
    if model_type == "llama" or (isinstance(architectures, list) and "LlamaForCausalLM" in architectures):
        return "llama"
    if model_type not in (None, "gpt2"):
        raise CheckpointError(f"{Path(folder) / 'config.json'}: model_type {model_type!r:.60}; specdec loads GPT-2 "
                              "('gpt2') and Llama ('llama') checkpoints")  # fmt: skip
    return "gpt2"


def shard_files(index_path: Path) -> list[str]:
    """The shard file names a model.safetensors.index.json lists, in order, each a plain file name."""
    try:
        index = json.loads(Path(index_path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{index_path}: cannot read it as JSON ({e}); delete it and load again") from e
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index_path}: no weight_map of tensor names to shard files; delete it and load again")
    shards = []
    for tensor, shard in weight_map.items():
        # NOTE: the downloader writes each shard under this name: never a path, never outside the folder.
        if not isinstance(shard, str) or not _SHARD.fullmatch(shard) or ".." in shard:
            raise CheckpointError(f"{index_path}: tensor {tensor!r:.80} is mapped to {shard!r:.80}, not a plain "
                                  "*.safetensors file name")  # fmt: skip
        if shard not in shards:
            shards.append(shard)
    return shards


def checkpoint_files(folder: Path) -> tuple[str, ...]:
    """The files a complete model folder holds, by its kind (model_kind): GPT-2's four, or a Llama's
    config.json, weights and tokenizer.json, the weights being model.safetensors or, when the folder
    holds an index, the index and every shard it lists."""
    folder = Path(folder)
    if model_kind(folder) == "gpt2":
        return CHECKPOINT_FILES
    if (folder / INDEX).is_file() and not (folder / WEIGHTS).is_file():
        return ("config.json", INDEX, *shard_files(folder / INDEX), "tokenizer.json")
    return LLAMA_FILES


def missing_files(folder: Path) -> list[str]:
    """What `folder` lacks of checkpoint_files(folder); [] for a complete model folder."""
    return [f for f in checkpoint_files(folder) if not (Path(folder) / f).is_file()]


# ---------------------------------------------------------------------------
# What each file must look like before it gets its real name.
# ---------------------------------------------------------------------------


def check_download(path: Path, filename: str) -> None:
    """Raise ValueError unless `path` parses as the checkpoint file `filename`.

    Cheap format checks only (the loader does the full ones): enough to refuse
    an HTML page, a truncated body or a file of another kind.
    """
    if filename.endswith(".safetensors"):  # model.safetensors, or one shard of it
        index_safetensors(path)
        return
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{filename} is not UTF-8 text") from e
    if filename.endswith(".json"):
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            raise ValueError(f"{filename} is not valid JSON ({e})") from e
        if not isinstance(value, dict):
            raise ValueError(f"{filename} is not a JSON object")
    elif filename == "merges.txt":
        for line_no, line in enumerate(text.splitlines(), 1):
            if line and not line.startswith("#version") and len(line.split(" ")) != 2:
                raise ValueError(f"merges.txt line {line_no} is not two tokens separated by a space: {line[:80]!r}")


def ensure_files(folder: Path, repo: str | None, settings: HubSettings, progress: bool = True) -> Path:
    """Make sure `folder` holds a complete checkpoint (checkpoint_files), downloading what is missing.

    config.json comes first: it says whether the rest is GPT-2's files or a Llama's.
    A Llama repo without model.safetensors (HTTP 404) is taken to be sharded: its
    model.safetensors.index.json, then every shard the index lists.
    """
    missing = missing_files(folder)
    if not missing:
        return folder
    if repo is None:
        raise CheckpointError(
            f"{folder} is missing {', '.join(missing)}; a model folder needs {', '.join(checkpoint_files(folder))}"
        )
    if settings.offline:
        raise DownloadError(
            f"{folder} is missing {', '.join(missing)} and HF_HUB_OFFLINE is set, so nothing can be "
            f"downloaded: unset HF_HUB_OFFLINE, or place the files there by hand. " + without_the_hub()
        )
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    if progress:
        size = DOWNLOAD_SIZES.get(repo) if not (folder / WEIGHTS).is_file() and not (folder / INDEX).is_file() else None
        print(f"downloading {repo}" + (f" (about {_human(size)})" if size else "") + f" from {settings.endpoint} "
              f"into {folder}", file=sys.stderr, flush=True)  # fmt: skip

    def fetch(filename: str) -> None:
        download_file(
            settings.url(repo, filename), folder / filename, token=settings.token, retries=settings.retries,
            retry_delay=settings.retry_delay, progress=progress, timeout=settings.timeout,
            validate=lambda path, name=filename: check_download(path, name),
            lock_dir=folder.parent / ".locks" / folder.name,  # outside: the model folder holds only its files
        )  # fmt: skip

    try:
        if not (folder / "config.json").is_file():
            fetch("config.json")  # first: it decides which files the rest are
        if model_kind(folder) == "llama" and not (folder / WEIGHTS).is_file() and not (folder / INDEX).is_file():
            try:
                fetch(WEIGHTS)
            except RemoteFileMissing:  # a checkpoint too large for one file (a few GB) comes in shards
                fetch(INDEX)
        for filename in missing_files(folder):
            fetch(filename)
    except BaseException:
        if created and not any(folder.iterdir()):
            folder.rmdir()  # nothing arrived: leave no empty model folder behind
        raise
    return folder
