"""Where a GPT-2 checkpoint comes from: model names -> Hub repos, and the download.

The Hugging Face Hub serves every GPT-2 size as a `model.safetensors` file next
to `config.json`, `vocab.json` and `merges.txt`. This module fetches those four
files into `models/<name>/` (once; afterwards no network is touched).

Environment variables, read in one place (`HubSettings.from_env`), with the
meanings huggingface_hub gives them:
    HF_ENDPOINT     base URL of the Hub or a mirror (default https://huggingface.co)
    HF_HUB_OFFLINE  1/ON/YES/TRUE: never touch the network; use local files only
    HF_TOKEN        sent as a bearer token, for gated or private repos
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from .safetensors import CheckpointError

# Short names for the released checkpoints, and the Hub repository of each.
MODEL_REPOS = {
    "124M": "openai-community/gpt2",
    "355M": "openai-community/gpt2-medium",
    "774M": "openai-community/gpt2-large",
    "1558M": "openai-community/gpt2-xl",
    "distilgpt2": "distilbert/distilgpt2",
}
CHECKPOINT_FILES = ("config.json", "model.safetensors", "vocab.json", "merges.txt")
DEFAULT_ENDPOINT = "https://huggingface.co"

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class DownloadError(RuntimeError):
    """A checkpoint could not be fetched; the message says what to do."""


# ---------------------------------------------------------------------------
# Where a model comes from.
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class HubSettings:
    endpoint: str = DEFAULT_ENDPOINT
    offline: bool = False
    token: str | None = None

    @classmethod
    def from_env(cls) -> "HubSettings":
        """The one place that reads the environment, as huggingface_hub does."""
        endpoint = os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
        offline = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}
        return cls(endpoint.rstrip("/"), offline, os.environ.get("HF_TOKEN") or None)

    def url(self, repo: str, filename: str) -> str:
        return f"{self.endpoint}/{repo}/resolve/main/{filename}"


def resolve_model(name_or_path: str, models_dir: str | os.PathLike = "models") -> tuple[Path, str | None]:
    """Map a name to (local folder, Hub repo or None for a plain local folder).

    "124M" -> (models/124M, "openai-community/gpt2"); "owner/name" ->
    (models/owner--name, "owner/name"); an existing folder -> (folder, None).
    """
    name = str(name_or_path)
    models_dir = Path(models_dir)
    if name in MODEL_REPOS:
        return models_dir / name, MODEL_REPOS[name]
    if Path(name).is_dir():
        return Path(name), None
    if name.startswith(("/", "./", "../", "~")) or "\\" in name:
        raise ValueError(f"{name} is not a folder: a local model needs a folder holding {', '.join(CHECKPOINT_FILES)}")
    if _REPO_ID.match(name) and ".." not in name:
        folder = models_dir / name.replace("/", "--")
        # The pattern already excludes separators and "..", but check the
        # result too: a name must never place files outside models_dir.
        if models_dir.resolve() not in folder.resolve().parents:
            raise ValueError(f"model name {name!r} would place files outside {models_dir}")
        return folder, name
    known = ", ".join(MODEL_REPOS)
    raise ValueError(
        f"unknown model {name!r}: use one of {known}, a Hub repo id such as "
        f"'openai-community/gpt2', or the path of a folder holding {', '.join(CHECKPOINT_FILES)}"
    )


# ---------------------------------------------------------------------------
# Download: streaming, resumable, checked.
# ---------------------------------------------------------------------------


def _progress_bar(total: int | None, initial: int, desc: str, show: bool):
    from tqdm import tqdm  # imported here so that importing specdec stays light

    return tqdm(total=total, initial=initial, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                leave=False, disable=not show)  # fmt: skip


class _Transient(Exception):
    """A failure worth retrying: a 5xx or 429 answer, or a download that stopped short."""


def _expected_size_and_sha256(session: requests.Session, url: str, headers: dict) -> tuple[int | None, str | None]:
    """Ask the server, without following redirects, what the file should be.

    For files stored with git LFS the Hub answers /resolve/ with a redirect
    whose X-Linked-Size and X-Linked-Etag give the size and the sha256; small
    files are served directly with Content-Length and an ETag (a git blob hash,
    40 hex digits, which is not a sha256 and is not used).
    """
    r = session.head(url, headers=headers, allow_redirects=False, timeout=30)
    _check_status(r, url)
    size = r.headers.get("X-Linked-Size") or (r.headers.get("Content-Length") if r.status_code == 200 else None)
    etag = (r.headers.get("X-Linked-Etag") or r.headers.get("ETag") or "").strip()
    etag = etag.removeprefix("W/").strip('"').lower()
    return (int(size) if size else None), (etag if _SHA256.match(etag) else None)


def _check_status(r: requests.Response, url: str) -> None:
    if r.status_code >= 500 or r.status_code == 429:
        raise _Transient(f"HTTP {r.status_code} from {url}")
    if r.status_code == 404:
        raise DownloadError(
            f"{url} does not exist (HTTP 404): check the model name, or set HF_ENDPOINT to a mirror that has it"
        )
    if r.status_code in (401, 403):
        raise DownloadError(
            f"{url} refused access (HTTP {r.status_code}): for a gated or private repo set HF_TOKEN "
            f"to a token that can read it"
        )
    if r.status_code >= 400:
        raise DownloadError(f"{url} answered HTTP {r.status_code}")


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def download_file(
    url: str,
    dest: Path,
    token: str | None = None,
    retries: int = 3,
    retry_delay: float = 1.0,
    progress: bool = True,
) -> Path:
    """Fetch `url` into `dest`, resuming a partial download, checking size and sha256.

    Bytes go to `dest` + ".incomplete", which is renamed to `dest` only once
    complete and verified, so a file under its real name is always whole. After
    an interruption the next attempt (or the next run) continues with a Range
    request from where the partial file ends.
    """
    dest = Path(dest)
    partial = dest.with_name(dest.name + ".incomplete")
    # identity: sizes and Range offsets must count the file's bytes, not gzip's
    # (huggingface_hub asks for the same).
    headers = {"Accept-Encoding": "identity"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    session = requests.Session()
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(retry_delay * 2 ** (attempt - 1))
        try:
            size, sha256 = _expected_size_and_sha256(session, url, headers)
            _fetch_into(session, url, partial, headers, size, progress, dest.name)
            break
        except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError, _Transient) as e:
            # Transient: retry, resuming from what arrived; but without DNS, retrying will not help.
            if attempt == retries or _is_name_resolution_error(e):
                raise DownloadError(
                    f"could not download {url} ({_one_line(e)}). Check the network, set HF_ENDPOINT "
                    f"to a reachable mirror, or place {', '.join(CHECKPOINT_FILES)} in {dest.parent} by hand"
                ) from e

    if size is not None and partial.stat().st_size != size:  # a server contradicting itself
        raise DownloadError(f"{url}: the server's answers disagree about the file's size; run again later")
    if sha256 is not None and _sha256_of(partial) != sha256:
        partial.unlink()
        raise DownloadError(
            f"{url}: sha256 does not match the server's ({sha256}); the corrupt download was removed, run again"
        )
    os.replace(partial, dest)
    return dest


def _is_name_resolution_error(error: Exception) -> bool:
    text = repr(error)
    return "NameResolutionError" in text or "Name or service not known" in text or "nodename nor servname" in text


def _one_line(error: Exception) -> str:
    """A short description of a requests/urllib3 error, whose str() can run to several lines."""
    if _is_name_resolution_error(error):
        return "the host name could not be resolved: no network, or no DNS"
    if isinstance(error, requests.ConnectionError) and "Connection refused" in repr(error):
        return "connection refused"
    if isinstance(error, requests.exceptions.ChunkedEncodingError):
        return "the connection broke mid-file; what arrived is kept and the next run resumes"
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _fetch_into(session, url, partial: Path, headers, size, progress: bool, desc: str) -> None:
    """Append what is missing to `partial`; raise _Transient if it stays short."""
    have = partial.stat().st_size if partial.exists() else 0
    if size is not None and have > size:
        partial.unlink()  # longer than the real file: not ours to resume
        have = 0
    if size is not None and have == size:
        return
    request_headers = dict(headers)
    if have:
        request_headers["Range"] = f"bytes={have}-"
    with session.get(url, headers=request_headers, stream=True, timeout=30) as r:
        if r.status_code == 416:  # nothing past `have`: the size checks decide
            return
        _check_status(r, url)
        if have and r.status_code != 206:
            have = 0  # the server ignored the Range header: start over
        total = size
        if total is None and r.headers.get("Content-Length"):
            total = have + int(r.headers["Content-Length"])
        mode = "ab" if have else "wb"
        with open(partial, mode) as f, _progress_bar(total, have, desc, progress) as bar:
            for chunk in r.iter_content(chunk_size=1 << 16):
                f.write(chunk)
                bar.update(len(chunk))
    got = partial.stat().st_size
    if total is not None and got < total:
        # Some urllib3 versions end a dropped stream quietly: keep what came, resume.
        raise _Transient(f"the connection closed after {got} of {total} bytes")
    if total is not None and got > total:
        partial.unlink()
        raise _Transient(f"received {got} bytes, more than the expected {total}")


def ensure_files(folder: Path, repo: str | None, settings: HubSettings, progress: bool = True) -> Path:
    """Make sure the four checkpoint files are in `folder`, downloading what is missing."""
    missing = [f for f in CHECKPOINT_FILES if not (folder / f).is_file()]
    if not missing:
        return folder
    if repo is None:
        raise CheckpointError(
            f"{folder} is missing {', '.join(missing)}; a model folder needs {', '.join(CHECKPOINT_FILES)}"
        )
    if settings.offline:
        raise DownloadError(
            f"{folder} is missing {', '.join(missing)} and HF_HUB_OFFLINE is set, so nothing can be "
            f"downloaded: unset HF_HUB_OFFLINE, or place the files there by hand"
        )
    folder.mkdir(parents=True, exist_ok=True)
    for filename in missing:
        download_file(settings.url(repo, filename), folder / filename, token=settings.token, progress=progress)
    return folder
