"""Shards made elsewhere (specdec/train/adopt.py; scripts/distill_torch.py makes them with the target's forward
pass on a GPU) join a run only after every one is checked: the ones that continue it are adopted, trusted by
the pipeline afterwards as its own, and a tampered, foreign, gapped or concurrent case changes nothing."""

from __future__ import annotations

import fcntl
import json
from pathlib import Path

import pytest
from test_distill import POOL, SETTINGS, chat_model, shard_bytes

from specdec.train.adopt import MADE, adopt_shards, made_record
from specdec.train.distill import make_data
from specdec.train.shards import MANIFEST, load_distill_data


def made_elsewhere(whole: Path, new: Path, indices: list[int], settings: dict | None = None) -> None:
    """What `distill_torch.py make` leaves in its --out folder: the shards, and made.json with their entries."""
    new.mkdir()
    manifest = json.loads((whole / MANIFEST).read_text())
    for i in indices:
        name = manifest["shards"][i]["file"]
        (new / name).write_bytes((whole / name).read_bytes())
    record = made_record(settings or manifest["settings"], [manifest["shards"][i] for i in indices], "test", "cpu", "-")
    (new / MADE).write_text(json.dumps(record))


def folder_state(folder: Path) -> tuple[bytes, dict]:
    return (folder / MANIFEST).read_bytes(), shard_bytes(folder)


@pytest.fixture
def runs(tmp_path):
    """A whole run of 7 shards, and the same run cut after 2."""
    model = chat_model()
    make_data(model, tmp_path / "whole", 220, POOL, **SETTINGS)
    make_data(model, tmp_path / "cut", 220, POOL, **SETTINGS, stop_after=2)
    assert len(json.loads((tmp_path / "whole" / MANIFEST).read_text())["shards"]) >= 6
    return model, tmp_path / "whole", tmp_path / "cut"


def test_shards_made_elsewhere_continue_the_run_and_are_trusted_as_its_own(runs, tmp_path):
    model, whole, cut = runs
    made_elsewhere(whole, tmp_path / "new", [2, 3, 5])  # 5 does not follow 3: left where it is
    lines = []
    assert adopt_shards(cut, tmp_path / "new", model.n_vocab, log=lines.append) == [2, 3]
    assert lines == [f"left in {tmp_path / 'new'}: shards 5 (they do not follow shard 3)"]
    assert shard_bytes(cut) == {k: v for k, v in shard_bytes(whole).items() if int(k[6:11]) < 4}
    manifest = json.loads((cut / MANIFEST).read_text())
    assert manifest["made_elsewhere"] == [{"shards": [2, 3], "by": "test", "device": "cpu", "torch": "-"}]
    assert manifest["reply_tokens"] == sum(e["reply_tokens"] for e in manifest["shards"])
    # The pipeline trusts the adopted shards (it does not make them again) and finishes the run.
    log = []
    make_data(model, cut, 220, POOL, **SETTINGS, log=log.append)
    assert f"{cut}: 4 shards trusted" in log[0]
    assert shard_bytes(cut) == shard_bytes(whole)
    assert load_distill_data(cut, model).n_tokens >= 220


def test_a_tampered_shard_or_another_runs_shards_are_refused_and_nothing_is_copied(runs, tmp_path):
    model, whole, cut = runs
    before = folder_state(cut)
    made_elsewhere(whole, tmp_path / "cut-short", [2, 3])
    path = tmp_path / "cut-short" / "shard-00003.npz"
    path.write_bytes(path.read_bytes()[:-10])  # truncated on the way
    with pytest.raises(ValueError, match="shard-00003.npz: its sha256"):
        adopt_shards(cut, tmp_path / "cut-short", model.n_vocab)
    assert folder_state(cut) == before  # shard 2 was good, yet not copied alone

    other = {**SETTINGS, "seed": 6}  # another run: the same model and requests, other seeds
    make_data(model, tmp_path / "other", 220, POOL, **other)
    made_elsewhere(tmp_path / "other", tmp_path / "said-so", [2])
    with pytest.raises(ValueError, match=r"other settings than the run .*\(seed differ\)"):
        adopt_shards(cut, tmp_path / "said-so", model.n_vocab)
    cut_settings = json.loads((cut / MANIFEST).read_text())["settings"]
    made_elsewhere(tmp_path / "other", tmp_path / "disguised", [2, 3], settings=cut_settings)  # claims the run's
    with pytest.raises(ValueError, match="'greedy' array is not what shard 2 of this run holds"):
        adopt_shards(cut, tmp_path / "disguised", model.n_vocab)
    assert folder_state(cut) == before


def test_a_gap_a_foreign_vocabulary_or_a_data_run_in_progress_are_refused(runs, tmp_path):
    model, whole, cut = runs
    before = folder_state(cut)
    made_elsewhere(whole, tmp_path / "gap", [3, 4])  # shard 2 missing
    with pytest.raises(ValueError, match="none of its shards continues the run .* next shard is 2"):
        adopt_shards(cut, tmp_path / "gap", model.n_vocab)
    made_elsewhere(whole, tmp_path / "ids", [2])
    with pytest.raises(ValueError, match="outside"):  # token ids beyond a smaller vocabulary
        adopt_shards(cut, tmp_path / "ids", 10)
    with open(cut / ".lock", "w") as lock:  # a `data` run holds the folder
        fcntl.flock(lock, fcntl.LOCK_EX)
        with pytest.raises(ValueError, match="being written by a `data` run"):
            adopt_shards(cut, tmp_path / "ids", model.n_vocab)
    (tmp_path / "ids" / MADE).write_text('{"entries": []}')
    with pytest.raises(ValueError, match="not a record of shards made elsewhere"):
        adopt_shards(cut, tmp_path / "ids", model.n_vocab)
    assert folder_state(cut) == before


def test_a_run_with_a_missing_shard_in_its_manifest_takes_shards_after_it(runs, tmp_path):
    """A manifest may hold a hole (a shard that is to be made again); adopted shards follow its last entry."""
    model, whole, cut = runs
    manifest = json.loads((cut / MANIFEST).read_text())
    manifest["shards"][1] = None
    (cut / MANIFEST).write_text(json.dumps(manifest))
    made_elsewhere(whole, tmp_path / "new", [2])
    assert adopt_shards(cut, tmp_path / "new", model.n_vocab) == [2]
    manifest = json.loads((cut / MANIFEST).read_text())
    assert manifest["reply_tokens"] == manifest["shards"][0]["reply_tokens"] + manifest["shards"][2]["reply_tokens"]
    make_data(model, cut, 220, POOL, **SETTINGS)  # the hole is made again; the run ends as the whole one
    assert shard_bytes(cut) == shard_bytes(whole)
