"""Shards made elsewhere join a run (`python scripts/distill_torch.py merge` calls adopt_shards).

The distillation pipeline (distill.py) can run on another machine over the same
settings and request pool: scripts/distill_torch.py runs it with the target's
forward pass on a GPU. That run writes its shards into a folder of its own,
beside a record of what it made:

    NEW/shard-00035.npz ...   shards, exactly as shards.write_shard writes them
    NEW/made.json             {"settings": the run's settings (manifest.json's "settings"),
                               "by", "device", "torch": what made them, where,
                               "entries": each shard's manifest entry (write_shard's, with "seconds")}

adopt_shards adds to the run's manifest the shards that continue it, after
checking all of them and before copying any:
- made.json's settings are the run's (the model's fingerprint, the seed, the pool's sha256, ...);
- each shard's sha256, arrays and token ids (shards.read_shard);
- each shard holds the rows its index holds (shards.shard_rows_of), each row
  answering request r mod n_requests and greedy exactly where the run's rule
  makes it greedy: the rows were drawn with the run's seeds.
What cannot be checked without running the model is that the replies are its
own; `python -m specdec.train data`'s resume trusts its own shards by their
checksum in the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .. import safe_io
from ..checkpoints import locks
from .shards import (
    LOCK,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    SHARD_FILE,
    DistillSettings,
    check_entry,
    read_manifest,
    read_shard,
    settings_of,
    shard_rows_of,
    write_manifest,
)

MADE = "made.json"


def read_made(new: Path) -> dict:
    """NEW/made.json, checked whole before any shard it names is opened: an object whose "settings" are a
    run's (shards.settings_of) and whose "entries" are shard entries (shards.check_entry: objects naming
    shard files beside it, each once, with a sha256 and whole counts); ValueError naming the file otherwise."""
    path = new / MADE
    try:
        made = safe_io.read_json(path, dict, MAX_MANIFEST_BYTES)  # (a FIFO, a device, 100,000 brackets: refused)
        settings_of(made.get("settings"))
        if not isinstance(made.get("entries"), list):
            raise ValueError(f"'entries' is {type(made.get('entries')).__name__}, not a list")
        names = [check_entry(entry)["file"] for entry in made["entries"]]
        if len(set(names)) < len(names):
            raise ValueError(f"it names {next(n for n in names if names.count(n) > 1)} twice")
        return made
    except (OSError, ValueError) as e:
        raise ValueError(
            f"{path}: not a record of shards made elsewhere ({' '.join(str(e).split())[:200]}); give the --out "
            "folder of `scripts/distill_torch.py make`"
        ) from e


def check_rows(arrays: dict[str, np.ndarray], settings: DistillSettings, index: int, name: str) -> None:
    """ValueError unless shard `index`'s arrays hold its own rows, requests and greedy choices."""
    rows = np.array(shard_rows_of(settings, index))
    greedy = [bool(np.random.default_rng((settings.seed, int(r), 1)).random() < settings.greedy_frac) for r in rows]
    for what, expected in (("row", rows), ("request", rows % settings.n_requests), ("greedy", greedy)):
        if not np.array_equal(arrays[what], expected):
            raise ValueError(
                f"{name}: its {what!r} array is not what shard {index} of this run holds; it was made "
                f"by another run, or changed"
            )


def adopt_shards(
    folder: str | Path, new: str | Path, n_vocab: int, log: Callable[[str], None] | None = None
) -> list[int]:
    """Add the shards in `new` that continue the run in `folder` to its manifest; the indices added.

    Every one of them is checked (module docstring) before any is copied; the
    manifest is written last. Shards that do not follow the run's last one are left
    in `new` and reported to log. ValueError, saying what to do, when the folder is
    being written by a `data` run, when made.json is not this run's, or when a shard
    does not check out (the folder is then left as it was).
    """
    folder, new = Path(folder), Path(new)
    if not (folder / MANIFEST).is_file():
        raise ValueError(f"{folder}: no {MANIFEST}; give the folder of the run these shards continue")
    # The lock a `data` run holds: its manifest in memory would overwrite this one's.
    with locks.exclusive(folder / LOCK, wait=False) as held:  # (opened without following a link)
        if not held:
            raise ValueError(f"{folder} is being written by a `data` run; adopt shards when it has stopped")
        return _adopt(folder, new, n_vocab, log or (lambda line: None))


def _adopt(folder: Path, new: Path, n_vocab: int, log: Callable[[str], None]) -> list[int]:
    """adopt_shards, with the folder locked."""
    manifest, made = read_manifest(folder), read_made(new)
    if made["settings"] != manifest["settings"]:
        differ = [k for k in manifest["settings"] if made["settings"].get(k) != manifest["settings"][k]]
        raise ValueError(
            f"{new}: made with other settings than the run in {folder} ({', '.join(differ) or 'extra'} "
            f"differ); make shards with the run's own {MANIFEST}"
        )
    settings = settings_of(manifest["settings"])
    entries = {int(SHARD_FILE.fullmatch(e["file"]).group(1)): e for e in made["entries"]}
    start, added = len(manifest["shards"]), []
    while start + len(added) in entries:
        index = start + len(added)
        arrays = read_shard(new, entries[index], n_vocab)  # sha256, arrays, ids: ValueError naming the file
        check_rows(arrays, settings, index, str(new / entries[index]["file"]))
        added.append(index)
    if not added:
        raise ValueError(
            f"{new}: none of its shards continues the run in {folder}, whose next shard is {start}; make that one first"
        )
    copied = []
    try:  # all of it, or none: a copy that fails (a full disk, a shard changed since it was checked) takes the
        for index in added:  # copies made before it away, so nothing is left in the folder that no manifest names
            dest = folder / entries[index]["file"]
            copied.append(dest)
            copy_whole(new / entries[index]["file"], dest, entries[index]["sha256"])
            read_shard(folder, entries[index], n_vocab)
        manifest["shards"] += [entries[index] for index in added]
        manifest["reply_tokens"] = sum(e["reply_tokens"] for e in manifest["shards"] if e is not None)
        record = {key: made.get(key) for key in ("by", "device", "torch")}
        manifest.setdefault("made_elsewhere", []).append({"shards": [added[0], added[-1]], **record})
        write_manifest(folder, manifest)
    except BaseException:
        for dest in copied:
            dest.unlink(missing_ok=True)
        raise
    left = sorted(set(entries) - set(added))
    if left:
        log(f"left in {new}: shards {', '.join(map(str, left))} (they do not follow shard {added[-1]})")
    return added


def copy_whole(source: Path, dest: Path, sha256: str) -> None:
    """source's bytes into dest (safe_io.replacing: whole or absent), readable by anyone here; ValueError, and
    dest untouched, unless the bytes copied are the ones whose sha256 the record gives."""
    with safe_io.open_regular(source) as src, safe_io.replacing(dest, mode=0o644) as out:
        while chunk := src.read(1 << 20):
            out.write(chunk)
        if safe_io.sha256_of(out) != sha256:
            raise ValueError(f"{source}: changed while it was copied (its sha256 is no longer the record's)")


def made_record(settings: DistillSettings | dict, entries: list[dict], by: str, device: str, torch: str) -> dict:
    """What made.json holds (module docstring), for the run that makes shards elsewhere."""
    settings = asdict(settings) if isinstance(settings, DistillSettings) else settings
    return {
        "settings": settings,
        "by": by,
        "device": device,
        "torch": torch,
        "entries": sorted(entries, key=lambda e: e["file"]),
    }
