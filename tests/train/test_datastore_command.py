"""`python -m specdec.train datastore` (train/datastore.py): a datastore of the replies in distillation shards,
trusted shards only, cut at --max-tokens, refused in one line (exit 2) for another model's data or bad flags."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_distill import POOL, SETTINGS, chat_model

from specdec.drafters.datastore import CARD, SEPARATOR, Datastore
from specdec.train.cli import main
from specdec.train.distill import make_data
from specdec.train.shards import load_distill_data


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    make_data(chat_model(), folder, 60, POOL, **SETTINGS)
    return folder


def test_the_command_stores_every_reply_of_the_shards(shards, tmp_path, monkeypatch, capsys):
    import specdec.checkpoints.load as load

    monkeypatch.setattr(load, "load_model", lambda name, progress=True: chat_model())
    out = tmp_path / "store"
    assert main(["datastore", "--model", "tiny", "--data", str(shards), "--out", str(out), "--quiet"]) == 0
    assert "datastore:" in capsys.readouterr().out
    store = Datastore.load(out, chat_model().n_vocab)
    replies = load_distill_data(shards).replies
    want = np.concatenate([[SEPARATOR]] + [np.append(r, SEPARATOR) for r in replies])
    np.testing.assert_array_equal(store.corpus, want)
    card = json.loads((out / CARD).read_text())
    assert card["source"]["rows"] == len(replies) and card["source"]["data"] == shards.name
    assert card["command"].startswith("python -m specdec.train datastore --model tiny --data data")
    assert str(tmp_path) not in json.dumps(card)  # no machine's folders in a card

    cut = tmp_path / "cut"
    assert main(["datastore", "--model", "tiny", "--data", str(shards), "--out", str(cut), "--max-tokens", "30"]) == 0
    small = Datastore.load(cut, chat_model().n_vocab)
    assert len(small) <= 30 and small.card["source"]["cut_at_max_tokens"]
    np.testing.assert_array_equal(small.corpus, want[: len(small)])  # the first replies, whole


def test_a_damaged_shard_is_skipped_and_bad_input_is_one_line(shards, tmp_path, monkeypatch, capsys):
    import specdec.checkpoints.load as load

    monkeypatch.setattr(load, "load_model", lambda name, progress=True: chat_model())
    copy = tmp_path / "data"
    copy.mkdir()
    for path in shards.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    first = copy / "shard-00000.npz"
    first.write_bytes(first.read_bytes()[:-10])
    assert main(["datastore", "--model", "tiny", "--data", str(copy), "--out", str(tmp_path / "s")]) == 0
    assert "skipped a shard that is not trusted" in capsys.readouterr().err
    store = Datastore.load(tmp_path / "s", chat_model().n_vocab)
    assert store.card["source"]["shards_skipped"] == 1 and store.card["source"]["rows"] < len(
        load_distill_data(shards).replies
    )

    monkeypatch.setattr(load, "load_model", lambda name, progress=True: chat_model(seed=1))  # another model
    for argv, message in (
        (["--data", str(shards)], "written by another model"),
        (["--data", str(tmp_path / "none")], "no manifest.json"),
        (["--data", str(shards), "--max-tokens", "2"], "--max-tokens must be at least 3"),
    ):
        assert main(["datastore", "--model", "tiny", "--out", str(tmp_path / "x"), *argv, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "x" / CARD).exists()  # nothing half-written
