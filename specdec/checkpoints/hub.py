"""Where a named model's files come from: a name -> a folder under models_dir, filled from its Hub repo once.

`resolve_model` maps a name (registry.py) or a Hub repo id to a folder, one per repo,
`<models_dir>/<owner>--<name>/`: "124M" and "openai-community/gpt2" share it. An existing
folder is used as it is. `ensure_files` fetches config.json first, which says the kind
of model and so which files the rest are (folders.checkpoint_files), then those
(download.py); afterwards no network is touched. Where models_dir is by default, and the
environment variables that reach the Hub: settings.py.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from . import registry
from .sizes import human_size
from .download import DownloadError, RemoteFileMissing, download_file
from .folders import CHECKPOINT_FILES, INDEX, WEIGHTS, check_download, checkpoint_files, missing_files, model_kind
from .registry import LOCAL_MODELS, without_the_hub
from .safetensors import CheckpointError
from .settings import HubSettings, default_dir_text, default_models_dir

# The Hub's rule for a repo id: owner/name, each of letters, digits, "_", "." and
# "-", not starting or ending with "." or "-", at most 96 characters, and with
# no "--" or ".." anywhere ("--" is what joins owner and name in a folder name,
# so "a--b/c" and "a/b--c" would otherwise share models/a--b--c).
_REPO_PART = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_REPO_ID = re.compile(f"{_REPO_PART}/{_REPO_PART}")


def resolve_model(name_or_path: str, models_dir: str | os.PathLike | None = None) -> tuple[Path, str | None]:
    """Map a name to (local folder, Hub repo or None for a plain local folder).

    "124M" -> (models_dir/openai-community--gpt2, "openai-community/gpt2"), the
    folder "openai-community/gpt2" gets too; an existing folder -> (folder, None).
    models_dir None: default_models_dir().
    """
    name = str(name_or_path)
    if not name.strip():  # NOTE: Path("") is ".", the current folder, which would then be read as a model folder
        raise ValueError(f"the model name is empty: use {registry.known_models()}")
    if models_dir is not None and not isinstance(models_dir, (str, os.PathLike)):
        raise ValueError(f"models_dir must be a folder path (a str or os.PathLike) or None, got {models_dir!r:.80}")
    if models_dir is not None and not str(models_dir):
        raise ValueError("models_dir is empty: give a folder, or leave it out for the default " + default_dir_text())
    models_dir = default_models_dir() if models_dir is None else Path(models_dir)
    name = registry.canonical(name)
    card = registry.MODELS.get(name)
    if card is not None and card.source == registry.HUB:
        repo = card.where
        legacy = models_dir / name  # where earlier versions put GPT-2's short names: still used if complete
        if (
            card.architecture == "gpt2"
            and all((legacy / f).is_file() for f in CHECKPOINT_FILES)
            and not (models_dir / _folder_name(repo)).exists()
        ):
            return _download_folder(models_dir, name), repo
        return _download_folder(models_dir, _folder_name(repo), repo), repo
    if card is not None and card.source == registry.SHIPPED and card.base is None:  # inside the package
        return registry.shipped_folder(name), None
    if Path(name).is_dir():
        return Path(name), None
    if name.startswith(("/", "./", "../", "~")) or "\\" in name:
        raise ValueError(f"{name} is not a folder: a local model is {LOCAL_MODELS}")
    if _REPO_ID.fullmatch(name) and ".." not in name and "--" not in name:
        return _download_folder(models_dir, _folder_name(name), name), name
    raise ValueError(f"unknown model {name!r}: use {registry.known_models()}")


def _folder_name(repo: str) -> str:
    return repo.replace("/", "--")  # as huggingface_hub names repo folders (models--owner--name)


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
        fresh = not (folder / WEIGHTS).is_file() and not (folder / INDEX).is_file()
        size = registry.download_size(repo) if fresh else None
        print(
            f"downloading {repo}" + (f" (about {human_size(size)})" if size else "") + f" from {settings.endpoint} "
            f"into {folder}",
            file=sys.stderr,
            flush=True,
        )

    def fetch(filename: str) -> None:
        download_file(
            settings.url(repo, filename),
            folder / filename,
            token=settings.token,
            retries=settings.retries,
            retry_delay=settings.retry_delay,
            progress=progress,
            timeout=settings.timeout,
            validate=lambda path, name=filename: check_download(path, name),
            lock_dir=folder.parent / ".locks" / folder.name,  # outside: the model folder holds only its files
        )

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
