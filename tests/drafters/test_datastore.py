"""The datastore (drafters/datastore.py): its backward order against a plain sort, its longest match and
continuations against brute force, its files written whole and refused in one line when they are not what the
card says, and `python -m specdec.train datastore` building one from distillation shards."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

from specdec.drafters.datastore import (
    CARD,
    MAX_ENDS,
    SEPARATOR,
    Datastore,
    DatastoreFileError,
    backward_order,
)
from specdec.drafters.suffix_index import MAX_MATCH, MIN_MATCH


def brute_order(corpus) -> list[int]:
    return sorted(range(len(corpus)), key=lambda i: [int(t) for t in corpus[i::-1]])


@pytest.mark.parametrize("seed", range(4))
def test_backward_order_is_the_sort_of_the_text_read_backwards(seed):
    rng = np.random.default_rng(seed)
    for corpus in (rng.integers(0, 3, 200), rng.integers(0, 60000, 50), np.array([4] * 70), np.array([7])):
        assert backward_order(corpus).tolist() == brute_order(corpus)


def replies(seed: int, n: int = 30):
    rng = np.random.default_rng(seed)
    phrase = rng.integers(0, 9, 12).tolist()
    out = []
    for _ in range(n):  # replies over a small vocabulary, many sharing a stock phrase
        reply = rng.integers(0, 9, int(rng.integers(3, 25))).tolist()
        cut = int(rng.integers(0, len(reply)))
        out.append(reply[:cut] + phrase[: int(rng.integers(0, 12))] + reply[cut:])
    return out


def brute_match(docs: list[list[int]], tail: list[int]):
    for m in range(min(len(tail), MAX_MATCH), MIN_MATCH - 1, -1):
        found = {
            (d, e) for d, doc in enumerate(docs) for e in range(m - 1, len(doc)) if doc[e - m + 1 : e + 1] == tail[-m:]
        }
        if found:
            return m, found
    return 0, set()


@pytest.mark.parametrize("seed", range(3))
def test_longest_match_counts_and_continuations_are_brute_force_s(seed):
    docs = replies(seed)
    store = Datastore.build(docs, 10)
    starts = np.flatnonzero(store.corpus == SEPARATOR)[:-1] + 1  # each reply's first position
    rng = np.random.default_rng(seed + 10)
    for _ in range(60):
        tail = rng.integers(0, 9, int(rng.integers(1, 15))).tolist() if rng.random() < 0.5 else None
        if tail is None:  # a piece of a reply, with a token before it
            d = int(rng.integers(len(docs)))
            e = int(rng.integers(0, len(docs[d])))
            tail = [int(rng.integers(0, 9))] + docs[d][max(0, e - 10) : e + 1]
        m, ends = store.longest_match(tail)
        want_m, want = brute_match(docs, tail)
        assert m == want_m, tail
        for k in range(1, min(3, len(tail)) + 1):  # how often the last k tokens occur inside one reply
            want_count = sum(doc[e : e + k] == tail[-k:] for doc in docs for e in range(len(doc) - k + 1))
            assert store.count(tail[-k:]) == want_count, (tail, k)
        reply_of = np.searchsorted(starts, ends, "right") - 1  # [n_ends]
        where = set(zip(reply_of.tolist(), (ends - starts[reply_of]).tolist()))
        if len(want) <= MAX_ENDS:
            assert where == want
        for (d, e), row in zip(
            sorted(where, key=lambda de: starts[de[0]] + de[1]), store.continuations(ends, 6).tolist()
        ):
            follow = docs[d][e + 1 : e + 7]
            assert row == follow + [-1] * (6 - len(follow))


def test_many_occurrences_are_read_evenly_spread():
    store = Datastore.build([[1, 2, 3]] * (3 * MAX_ENDS), 5)
    m, ends = store.longest_match([1, 2])
    assert m == 2 and len(ends) == MAX_ENDS and (np.diff(ends) > 0).all()
    assert ends[0] < 4 * 10 and ends[-1] > len(store) - 4 * 10  # from the first replies to the last


def test_a_saved_datastore_loads_back_and_replaces_the_old_file(tmp_path):
    store = Datastore.build(replies(0), 10, {"model": "tiny"})
    path = store.save(tmp_path)
    assert path.stat().st_size == 6 * len(store) and oct(path.stat().st_mode & 0o777) == "0o644"
    back = Datastore.load(tmp_path, 10)
    np.testing.assert_array_equal(back.corpus, store.corpus)
    np.testing.assert_array_equal(back.ends, store.ends)
    assert back.card["model"] == "tiny" and back.card["n_replies"] == 30 and back.n_vocab == 10
    other = Datastore.build(replies(1), 10).save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([CARD, other.name])  # no temporary, no old file
    assert len(Datastore.load(tmp_path, 10)) == len(Datastore.build(replies(1), 10))


def damage(folder, what: str) -> None:
    card = json.loads((folder / CARD).read_text())
    path = folder / card["file"]
    data = bytearray(path.read_bytes())
    n = card["n_tokens"]
    if what == "bit flipped":
        data[7] ^= 1
    elif what == "truncated":
        data = data[:-4]
    elif what in ("token out of range", "not a permutation", "not sorted"):
        corpus = np.frombuffer(bytes(data[: 2 * n]), "<u2").copy()
        ends = np.frombuffer(bytes(data[2 * n :]), "<i4").copy()
        if what == "token out of range":
            corpus[3] = 10
        elif what == "not a permutation":
            ends[1] = ends[0]
        else:
            ends[[0, -1]] = ends[[-1, 0]]
        data = bytearray(corpus.astype("<u2").tobytes() + ends.astype("<i4").tobytes())
        card["sha256"] = hashlib.sha256(bytes(data)).hexdigest()  # a consistent card: the checks bite
    elif what == "a link":
        target = folder / "elsewhere.bin"
        path.rename(target)
        os.symlink(target, path)
        return
    elif what == "a folder":
        path.unlink()
        path.mkdir()
        return
    elif what == "a fifo":  # would hang a reader that waits for a writer
        path.unlink()
        os.mkfifo(path)
        return
    elif what == "card n_tokens":
        card["n_tokens"] = "many"
    elif what == "card file":
        card["file"] = "../../etc/passwd"
    path.write_bytes(bytes(data))
    (folder / CARD).write_text(json.dumps(card))


@pytest.mark.parametrize(
    "what,message",
    [
        ("bit flipped", "sha256"),
        ("truncated", "bytes, and the card's n_tokens makes"),
        ("token out of range", "token ids outside 0..9"),
        ("not a permutation", "not a permutation"),
        ("not sorted", "not sorted by the text read backwards"),
        ("a link", "symbolic link, which is not followed"),
        ("a folder", "not a regular file .it is a folder."),
        ("a fifo", "not a regular file"),
        ("card n_tokens", "'n_tokens' must be a whole number"),
        ("card file", "not a file specdec wrote"),
    ],
)
def test_a_damaged_datastore_is_refused_in_one_line(tmp_path, what, message):
    Datastore.build(replies(0), 10).save(tmp_path)
    damage(tmp_path, what)
    with pytest.raises(DatastoreFileError, match=message) as error:
        Datastore.load(tmp_path, 10)
    assert "\n" not in str(error.value) and "python -m specdec.train datastore" in str(error.value)


def test_another_vocabulary_or_no_datastore_is_refused(tmp_path):
    with pytest.raises(DatastoreFileError, match="no datastore here"):
        Datastore.load(tmp_path, 10)
    Datastore.build(replies(0), 10).save(tmp_path)
    with pytest.raises(DatastoreFileError, match="vocabulary of 10 tokens, the target has 12"):
        Datastore.load(tmp_path, 12)
    with pytest.raises(ValueError, match="outside 0..4"):
        Datastore.build([[1, 5]], 5)
    with pytest.raises(ValueError, match="uint16"):
        Datastore.build([[1]], 70_000)


def test_the_shipped_datastore_loads_checked_within_its_bound():
    """SmolLM2's shipped datastore: at most 10 MB, read through the same checks (sha256, ids, order) as any other,
    made from the model's own replies by the command its card records."""
    from specdec.checkpoints.registry import SHIPPED_DATASTORES, shipped_datastore

    assert set(SHIPPED_DATASTORES) == {"smollm2-135m"}
    folder = shipped_datastore("smollm2-135m")
    assert folder is not None and shipped_datastore("stdlib-6L") is None
    assert sum(f.stat().st_size for f in folder.iterdir()) <= 10_000_000
    store = Datastore.load(folder, 49152)
    assert store.card["model"] == "smollm2-135m" and store.card["n_tokens"] > 100_000
    assert store.card["command"].startswith("python -m specdec.train datastore --model smollm2-135m")
    with pytest.raises(ValueError, match="vocabulary"):
        Datastore.load(folder, 50257)  # GPT-2's vocabulary: another model's ids
