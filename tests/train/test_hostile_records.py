"""Training records another user (or a damaged disk) could hand specdec: made.json of shards made elsewhere, a
run's manifest.json, its shards, and the states cache. Each is checked whole before anything it names is
opened or copied; each bad case is one line naming the file, never a hang, a traceback or an orphaned file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import within
from test_distill import POOL, SETTINGS, chat_model, shard_bytes
from test_made_elsewhere import made_elsewhere

from specdec.train import adopt, states
from specdec.train.adopt import MADE, adopt_shards
from specdec.train.distill import make_data
from specdec.train.shards import MANIFEST, load_distill_data

PAGEMAP = Path("/proc/self/pagemap")


def one_line_naming(error: BaseException, path: Path) -> str:
    text = str(error)
    assert "\n" not in text and str(path) in text, text
    return text


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A whole run of 7 shards, made once for the module (tests copy what they change)."""
    tmp = tmp_path_factory.mktemp("runs")
    model = chat_model()
    make_data(model, tmp / "whole", 220, POOL, **SETTINGS)
    return model, tmp / "whole"


@pytest.fixture
def cut(runs, tmp_path):
    """The same run cut after 2 shards: the run shards made elsewhere would continue."""
    model, whole = runs
    make_data(model, tmp_path / "cut", 220, POOL, **SETTINGS, stop_after=2)
    return tmp_path / "cut"


def folder_state(folder: Path) -> tuple[bytes, dict, list[str]]:
    return (folder / MANIFEST).read_bytes(), shard_bytes(folder), sorted(p.name for p in folder.iterdir())


def edit_made(new: Path, change) -> None:
    record = json.loads((new / MADE).read_text())
    change(record)
    (new / MADE).write_text(json.dumps(record))


MADE_CASES = {
    "an entry that is a string": lambda r: r["entries"].__setitem__(0, "shard-00002.npz"),
    "settings that are a string": lambda r: r.__setitem__("settings", "x"),
    "settings with a field of the wrong type": lambda r: r["settings"].__setitem__("seed", "5"),
    "settings with an unknown field": lambda r: r["settings"].__setitem__("extra", 1),
    "an entry without rows": lambda r: r["entries"][0].pop("rows"),
    "an entry without sha256": lambda r: r["entries"][0].pop("sha256"),
    "an entry with rows true": lambda r: r["entries"][0].__setitem__("rows", True),
    "an entry naming /etc/passwd": lambda r: r["entries"][0].__setitem__("file", "/etc/passwd"),
    "an entry naming a path outside": lambda r: r["entries"][0].__setitem__("file", "../whole/shard-00002.npz"),
    "an entry naming /proc/self/pagemap": lambda r: r["entries"][0].__setitem__("file", "/proc/self/pagemap"),
    "the same shard twice": lambda r: r["entries"].append(dict(r["entries"][0])),
    "entries that are an object": lambda r: r.__setitem__("entries", {"a": 1}),
}


@pytest.mark.parametrize("why", sorted(MADE_CASES))
def test_made_json_is_checked_whole_before_any_shard_is_opened_or_copied(runs, cut, tmp_path, why):
    model, whole = runs
    made_elsewhere(whole, tmp_path / "new", [2, 3])
    edit_made(tmp_path / "new", MADE_CASES[why])
    before = folder_state(cut)
    with pytest.raises(ValueError) as caught:
        within(10, lambda: adopt_shards(cut, tmp_path / "new", model.n_vocab))
    assert "not a record of shards made elsewhere" in one_line_naming(caught.value, tmp_path / "new" / MADE)
    assert folder_state(cut) == before


SPECIAL = {
    "a FIFO": lambda p: os.mkfifo(p),
    "a link to /proc/self/pagemap": lambda p: p.symlink_to(PAGEMAP),
    "a link to /dev/zero": lambda p: p.symlink_to("/dev/zero"),
    "nested 100,000 deep": lambda p: p.write_text("[" * 100_000 + "]" * 100_000),
}


@pytest.mark.parametrize(
    "which,why",
    [("made.json", why) for why in sorted(SPECIAL)]
    + [("a shard", why) for why in sorted(SPECIAL) if "nested" not in why],
)
def test_a_special_or_nested_file_is_one_line_at_once(runs, cut, tmp_path, why, which):
    model, whole = runs
    new = tmp_path / "new"
    made_elsewhere(whole, new, [2, 3])
    path = new / (MADE if which == "made.json" else "shard-00003.npz")
    path.unlink()
    SPECIAL[why](path)
    before = folder_state(cut)
    with pytest.raises(ValueError) as caught:
        within(10, lambda: adopt_shards(cut, new, model.n_vocab))
    one_line_naming(caught.value, path)
    assert folder_state(cut) == before


def test_a_copy_that_fails_midway_takes_the_copies_before_it_away(runs, cut, tmp_path, monkeypatch):
    """Every shard checked, then copied: a copy that fails (a full disk, say) after the first one leaves the run
    folder as it was, with no shard in it that no manifest names."""
    model, whole = runs
    made_elsewhere(whole, tmp_path / "new", [2, 3, 4])
    before = folder_state(cut)
    real, copies = adopt.copy_whole, []

    def full_on_the_second(source, dest, *args):
        copies.append(dest.name)
        if len(copies) == 2:
            raise OSError(28, "No space left on device", str(dest))
        return real(source, dest, *args)

    monkeypatch.setattr(adopt, "copy_whole", full_on_the_second)
    with pytest.raises(OSError):
        adopt_shards(cut, tmp_path / "new", model.n_vocab)
    assert copies == ["shard-00002.npz", "shard-00003.npz"]
    assert folder_state(cut) == before, "a shard copied before the failure was left behind"


MANIFEST_CASES = {
    "an entry that is a string": lambda m: m["shards"].__setitem__(1, "shard-00001.npz"),
    "settings that are a string": lambda m: m.__setitem__("settings", "x"),
    "an entry without rows": lambda m: m["shards"][1].pop("rows"),
    "an entry without sha256": lambda m: m["shards"][1].pop("sha256"),
    "an entry naming /etc/passwd": lambda m: m["shards"][1].__setitem__("file", "/etc/passwd"),
    "an entry naming /proc/self/pagemap": lambda m: m["shards"][1].__setitem__("file", str(PAGEMAP)),
    "an entry naming another shard": lambda m: m["shards"][1].__setitem__("file", "shard-00000.npz"),
    "counts that do not fit together": lambda m: m["shards"][1].__setitem__("greedy_rows", 10**6),
}


@pytest.mark.parametrize(
    "why",
    sorted(MANIFEST_CASES)
    + ["manifest nested 100,000 deep", "manifest a FIFO", "shard a FIFO", "shard a link to /proc/self/pagemap"],
)
def test_load_distill_data_checks_every_entry_before_reading_a_shard(runs, tmp_path, why):
    import shutil

    model, whole = runs
    folder = tmp_path / "data"
    shutil.copytree(whole, folder)
    manifest_path, shard = folder / MANIFEST, folder / "shard-00001.npz"
    if why in MANIFEST_CASES:
        manifest = json.loads(manifest_path.read_text())
        MANIFEST_CASES[why](manifest)
        manifest_path.write_text(json.dumps(manifest))
        named = manifest_path
    elif why.startswith("manifest"):
        manifest_path.unlink()
        SPECIAL["a FIFO" if "FIFO" in why else "nested 100,000 deep"](manifest_path)
        named = manifest_path
    else:
        shard.unlink()
        SPECIAL["a FIFO" if "FIFO" in why else "a link to /proc/self/pagemap"](shard)
        named = shard
    with pytest.raises(ValueError) as caught:
        within(10, lambda: load_distill_data(folder, model))
    one_line_naming(caught.value, named)


# ---------------------------------------------------------------------------
# The states cache (train/states.py).
# ---------------------------------------------------------------------------


@pytest.fixture
def cached(runs, tmp_path):
    """The module's data, its states of layer 1 for 8 rows computed once into a cache folder."""
    model, whole = runs
    data = load_distill_data(whole, model)
    cache = tmp_path / "states"
    first = states.row_states(model, data, list(range(8)), [1], False, cache)
    (npy,) = cache.glob("states-L1-*.npy")
    return model, data, cache, npy, first


def reseal(npy: Path, flat: np.ndarray) -> None:
    """Write new values under the cache's name and seal them again: the record's sha256 made to match."""
    import hashlib

    np.save(npy, flat, allow_pickle=False)
    record_path = npy.with_suffix(".json")
    record = json.loads(record_path.read_text())
    record["sha256"] = hashlib.sha256(npy.read_bytes()).hexdigest()
    record_path.write_text(json.dumps(record))


def test_nan_states_under_a_sha256_sealed_again_are_refused_and_computed_afresh(cached):
    """The attack: NaN written into the cached states and the record's sha256 made to match. Trusted, training
    would see a NaN loss on every run ('lower --lr'); refused, the states are computed again, with one line."""
    model, data, cache, npy, first = cached
    flat = np.load(npy)
    flat[3, 5] = np.nan
    reseal(npy, flat)
    said = []
    again = states.row_states(model, data, list(range(8)), [1], False, cache, said.append)
    assert all(np.isfinite(again[r]).all() for r in again)
    assert all(np.array_equal(again[r], first[r]) for r in first), "the states computed again are the model's own"
    assert len(said) == 1 and "holds NaN or infinite values" in said[0] and str(npy) in said[0], said
    assert np.isfinite(np.load(npy)).all(), "and the cache is written afresh"


@pytest.mark.parametrize(
    "why",
    [
        "record nested 100,000 deep",
        "record a FIFO",
        "states a FIFO",
        "states a link to /dev/zero",
        "states others can write",
    ],
)
def test_a_damaged_or_planted_states_cache_is_one_line_and_computed_afresh(cached, why):
    model, data, cache, npy, first = cached
    path = npy.with_suffix(".json") if why.startswith("record") else npy
    if why == "states others can write":
        os.chmod(npy, 0o666)
    else:
        path.unlink()
        SPECIAL[
            {
                "record nested 100,000 deep": "nested 100,000 deep",
                "states a link to /dev/zero": "a link to /dev/zero",
            }.get(why, "a FIFO")
        ](path)
    said = []
    again = within(20, lambda: states.row_states(model, data, list(range(8)), [1], False, cache, said.append))
    assert all(np.array_equal(again[r], first[r]) for r in first)
    assert len(said) == 1 and "\n" not in said[0] and "computing them again" in said[0], said
