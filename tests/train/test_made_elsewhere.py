"""Shards made on another machine (scripts/distill_torch.py, which runs the distillation pipeline with the
target's forward pass on a GPU) join a run only after they are checked: `merge` adds the ones that continue
the run, refuses a tampered one before copying anything, and the result is the data of one run.

The script's PyTorch part needs torch and is not tested here; its merge is NumPy and specdec alone."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from specdec.train.distill import MANIFEST, load_distill_data, make_data

from test_distill import POOL, SETTINGS, chat_model, shard_bytes

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "distill_torch.py"


def load_script():
    spec = importlib.util.spec_from_file_location("distill_torch", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def made_elsewhere(whole: Path, new: Path, indices: list[int]) -> None:
    """What `make` leaves in its --out folder: the shards and made.json listing their manifest entries."""
    new.mkdir()
    entries = json.loads((whole / MANIFEST).read_text())["shards"]
    for i in indices:
        (new / entries[i]["file"]).write_bytes((whole / entries[i]["file"]).read_bytes())
    made = {"by": "scripts/distill_torch.py", "device": "test", "torch": "none",
            "entries": [entries[i] for i in indices]}
    (new / "made.json").write_text(json.dumps(made))


def test_shards_made_elsewhere_continue_the_run_as_if_made_here(tmp_path):
    script, model = load_script(), chat_model()
    make_data(model, tmp_path / "whole", 220, POOL, **SETTINGS)
    n_shards = len(json.loads((tmp_path / "whole" / MANIFEST).read_text())["shards"])
    assert n_shards >= 6
    cut = tmp_path / "cut"
    make_data(model, cut, 220, POOL, **SETTINGS, stop_after=2)
    made_elsewhere(tmp_path / "whole", tmp_path / "new", [2, 3, 5])  # 5 does not follow 3: left out

    assert script.merge_shards(cut, tmp_path / "new", model.n_vocab) == [2, 3]
    assert shard_bytes(cut) == {k: v for k, v in shard_bytes(tmp_path / "whole").items() if int(k[6:11]) < 4}
    manifest = json.loads((cut / MANIFEST).read_text())
    assert manifest["made_elsewhere"][0]["shards"] == [2, 3]
    assert manifest["reply_tokens"] == sum(e["reply_tokens"] for e in manifest["shards"])
    # The pipeline trusts them and finishes the run: the data of one uninterrupted run.
    make_data(model, cut, 220, POOL, **SETTINGS)
    assert shard_bytes(cut) == shard_bytes(tmp_path / "whole")
    assert load_distill_data(cut, model).n_tokens >= 220


def test_a_tampered_or_foreign_shard_is_refused_before_anything_is_copied(tmp_path):
    script, model = load_script(), chat_model()
    make_data(model, tmp_path / "whole", 220, POOL, **SETTINGS)
    cut = tmp_path / "cut"
    make_data(model, cut, 220, POOL, **SETTINGS, stop_after=2)
    before = (cut / MANIFEST).read_bytes(), shard_bytes(cut)
    made_elsewhere(tmp_path / "whole", tmp_path / "new", [2, 3])
    path = tmp_path / "new" / "shard-00003.npz"
    path.write_bytes(path.read_bytes()[:-10])  # truncated on the way
    with pytest.raises(ValueError, match="shard-00003.npz: its sha256"):
        script.merge_shards(cut, tmp_path / "new", model.n_vocab)
    assert ((cut / MANIFEST).read_bytes(), shard_bytes(cut)) == before  # shard 2 was good, yet not copied alone

    made_elsewhere(tmp_path / "whole", tmp_path / "gap", [3])  # shard 2 missing: nothing continues the run
    with pytest.raises(ValueError, match="no shard continues the run"):
        script.merge_shards(cut, tmp_path / "gap", model.n_vocab)
    made_elsewhere(tmp_path / "whole", tmp_path / "big", [2])  # token ids beyond a smaller vocabulary
    with pytest.raises(ValueError, match="outside"):
        script.merge_shards(cut, tmp_path / "big", 10)
    assert ((cut / MANIFEST).read_bytes(), shard_bytes(cut)) == before
