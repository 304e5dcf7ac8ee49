"""Shards made elsewhere join a run (`python scripts/distill_torch.py merge` calls adopt_shards).

The distillation pipeline (distill.py) can run on another machine over the same
settings and request pool: scripts/distill_torch.py runs it with the target's
forward pass on a GPU. That run writes its shards into a folder of its own,
beside a record of what it made:

    NEW/shard-00035.npz ...   shards, exactly as distill.write_shard writes them
    NEW/made.json             {"settings": the run's settings (manifest.json's "settings"),
                               "by", "device", "torch": what made them, where,
                               "entries": each shard's manifest entry (write_shard's, with "seconds")}

adopt_shards adds to the run's manifest the shards that continue it, after
checking all of them and before copying any:
- made.json's settings are the run's (the model's fingerprint, the seed, the pool's sha256, ...);
- each shard's sha256, arrays and token ids (distill.read_shard);
- each shard holds the rows its index holds (distill.shard_rows_of), each row
  answering request r mod n_requests and greedy exactly where the run's rule
  makes it greedy: the rows were drawn with the run's seeds.
What cannot be checked without running the model is that the replies are its
own; `python -m specdec.train data`'s resume trusts its own shards by their
checksum in the same way.
"""

from __future__ import annotations

import fcntl
import json
import re
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ..checkpoints.pairs import show, write_atomically
from .distill import MANIFEST, DistillSettings, read_manifest, read_shard, shard_rows_of, write_manifest

MADE = "made.json"
SHARD_NAME = re.compile(r"shard-(\d{5})\.npz")


def read_made(new: Path) -> dict:
    """NEW/made.json, checked for its fields; ValueError naming the file otherwise."""
    path = new / MADE
    try:
        made = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(made.get("settings"), dict) or not isinstance(made.get("entries"), list):
            raise ValueError("it has no 'settings' or no 'entries'")
        for entry in made["entries"]:
            if not SHARD_NAME.fullmatch(str(entry.get("file"))):
                raise ValueError(f"an entry names {show(entry.get('file'))}, not a shard")
        return made
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"{path}: not a record of shards made elsewhere ({show(str(e), 100)}); give the --out "
                         f"folder of `scripts/distill_torch.py make`") from e  # fmt: skip


def check_rows(arrays: dict[str, np.ndarray], settings: DistillSettings, index: int, name: str) -> None:
    """ValueError unless shard `index`'s arrays hold its own rows, requests and greedy choices."""
    rows = np.array(shard_rows_of(settings, index))
    greedy = [bool(np.random.default_rng((settings.seed, int(r), 1)).random() < settings.greedy_frac) for r in rows]
    for what, expected in (("row", rows), ("request", rows % settings.n_requests), ("greedy", greedy)):
        if not np.array_equal(arrays[what], expected):
            raise ValueError(f"{name}: its {what!r} array is not what shard {index} of this run holds; it was made "
                             f"by another run, or changed")  # fmt: skip


def adopt_shards(folder: str | Path, new: str | Path, n_vocab: int, log: Callable[[str], None] | None = None
                 ) -> list[int]:  # fmt: skip
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
    with open(folder / ".lock", "w") as lock:
        try:  # the lock a `data` run holds: its manifest in memory would overwrite this one's
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"{folder} is being written by a `data` run; adopt shards when it has stopped") from None
        return _adopt(folder, new, n_vocab, log or (lambda line: None))


def _adopt(folder: Path, new: Path, n_vocab: int, log: Callable[[str], None]) -> list[int]:
    """adopt_shards, with the folder locked."""
    manifest, made = read_manifest(folder), read_made(new)
    if made["settings"] != manifest["settings"]:
        differ = [k for k in manifest["settings"] if made["settings"].get(k) != manifest["settings"][k]]
        raise ValueError(f"{new}: made with other settings than the run in {folder} ({', '.join(differ) or 'extra'} "
                         f"differ); make shards with the run's own {MANIFEST}")  # fmt: skip
    settings = DistillSettings(**manifest["settings"])
    entries = {int(SHARD_NAME.fullmatch(e["file"]).group(1)): e for e in made["entries"]}
    start, added = len(manifest["shards"]), []
    while start + len(added) in entries:
        index = start + len(added)
        arrays = read_shard(new, entries[index], n_vocab)  # sha256, arrays, ids: ValueError naming the file
        check_rows(arrays, settings, index, str(new / entries[index]["file"]))
        added.append(index)
    if not added:
        raise ValueError(f"{new}: none of its shards continues the run in {folder}, whose next shard is {start}; "
                         f"make that one first")  # fmt: skip
    for index in added:
        copy_whole(new / entries[index]["file"], folder / entries[index]["file"])
        read_shard(folder, entries[index], n_vocab)
    manifest["shards"] += [entries[index] for index in added]
    manifest["reply_tokens"] = sum(e["reply_tokens"] for e in manifest["shards"] if e is not None)
    record = {key: made.get(key) for key in ("by", "device", "torch")}
    manifest.setdefault("made_elsewhere", []).append({"shards": [added[0], added[-1]], **record})
    write_manifest(folder, manifest)
    left = sorted(set(entries) - set(added))
    if left:
        log(f"left in {new}: shards {', '.join(map(str, left))} (they do not follow shard {added[-1]})")
    return added


def copy_whole(source: Path, dest: Path) -> None:
    """source's bytes into dest, which is whole or absent (write_atomically), readable by anyone here."""
    payload = source.read_bytes()
    write_atomically(dest, lambda f: f.write(payload), mode=0o644)


def made_record(settings: DistillSettings | dict, entries: list[dict], by: str, device: str, torch: str) -> dict:
    """What made.json holds (module docstring), for the run that makes shards elsewhere."""
    settings = asdict(settings) if isinstance(settings, DistillSettings) else settings
    return {"settings": settings, "by": by, "device": device, "torch": torch,
            "entries": sorted(entries, key=lambda e: e["file"])}  # fmt: skip
