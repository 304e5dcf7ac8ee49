"""The suffix structure behind suffix decoding (drafters/suffix_index.py, drafters/suffix.py), against brute
force: the longest earlier match and its occurrences, what followed them, a bounded index of many interleaved
documents evicting the oldest, and the trie of candidates grown from them (its nodes, counts and path
probabilities)."""

from __future__ import annotations

import numpy as np
import pytest

from specdec.drafters.suffix import Calibration, grow_candidates
from specdec.drafters.suffix_index import MAX_ENDS, MAX_MATCH, MIN_MATCH, SuffixIndex, copied_on


def brute_match(docs: dict[int, list[int]], tail: list[int], before: dict[int, int] | None = None):
    """(m, {(doc, index in doc)}): the longest suffix of tail (MIN_MATCH..MAX_MATCH) ending anywhere in the docs,
    at an index below before[doc] where given, and where it ends; (0, set()) when none does."""
    for m in range(min(len(tail), MAX_MATCH), MIN_MATCH - 1, -1):
        want = tail[-m:]
        limit = before or {}
        found = {
            (d, e)
            for d, doc in docs.items()
            for e in range(m - 1, min(len(doc), limit.get(d, len(doc))))
            if doc[e - m + 1 : e + 1] == want
        }
        if found:
            return m, found
    return 0, set()


def as_doc_positions(index: SuffixIndex, ends) -> set[tuple[int, int]]:
    """Arena positions -> (doc, index within the doc), by walking back to each document's start."""
    out = set()
    for pos in ends.tolist():
        doc, i = int(index.doc_of[pos]), 0
        while index.prev[pos] >= 0:
            pos, i = int(index.prev[pos]), i + 1
        out.add((doc, i))
    return out


def texts(seed: int):
    """Random texts over small and large alphabets, and repetitive ones (loops, copied passages)."""
    rng = np.random.default_rng(seed)
    yield rng.integers(0, 3, 300).tolist()  # many short repeats
    yield rng.integers(0, 50, 300).tolist()  # few repeats
    passage = rng.integers(0, 1000, 40).tolist()
    yield passage + rng.integers(0, 1000, 30).tolist() + passage[:25] + [7] + passage[25:]  # a copy with an edit
    yield [5, 6, 7] * 40  # a loop
    yield ([1, 2] * 50 + [3]) * 2  # a loop longer than MAX_MATCH, twice


def brute_latest_match(text: list[int]) -> tuple[int, set[int]]:
    """The rule with its bound, by brute force: of the latest MAX_ENDS earlier occurrences of the text's last two
    tokens, the ones that agree with the text furthest back (at most MAX_MATCH tokens), and how far."""
    pairs = [e for e in range(1, len(text) - 1) if text[e - 1 : e + 1] == text[-2:]][-MAX_ENDS:]
    agree = {
        e: max(m for m in range(2, min(MAX_MATCH, e + 1) + 1) if text[e - m + 1 : e + 1] == text[-m:]) for e in pairs
    }
    m = max(agree.values(), default=0)
    return m, {e for e, n in agree.items() if n == m}


@pytest.mark.parametrize("seed", [0, 1])
def test_the_longest_earlier_match_is_brute_force_s_at_every_length_of_the_text(seed):
    for text in texts(seed):
        index = SuffixIndex()
        doc = index.start()
        for n in range(1, len(text) + 1):
            index.append(doc, text[n - 1])
            m, ends = index.longest_match(text[:n][-MAX_MATCH:], before=n - 1)
            want_m, want_ends = brute_latest_match(text[:n])
            assert (m, set(ends.tolist())) == (want_m, want_ends), (n, text[:n][-10:])
            pairs = sum(text[e - 1 : e + 1] == text[n - 2 : n] for e in range(1, n - 1))
            if pairs <= MAX_ENDS:  # nothing left unread: the longest match over the whole text
                whole = brute_match({doc: text[:n]}, text[:n][-MAX_MATCH:], {doc: n - 1})
                assert (m, {(doc, e) for e in want_ends}) == whole
            assert (np.diff(ends) > 0).all()


def test_only_the_latest_occurrences_are_read():
    text = [1, 2] * (MAX_ENDS + 10) + [9, 1, 2]
    index = SuffixIndex()
    doc = index.start()
    index.extend(doc, text)
    m, ends = index.longest_match(text, before=len(text) - 1)
    assert m == 2  # [1, 2], never after a 9 before
    assert ends.tolist() == list(range(len(text) - 4 - 2 * (MAX_ENDS - 1), len(text) - 3, 2))  # the latest 256
    loop = [1, 2] * (MAX_ENDS + 10)
    index = SuffixIndex()
    index.extend(index.start(), loop)
    assert index.longest_match(loop, before=len(loop) - 1)[0] == MAX_MATCH  # a loop matches as far as compared


def test_continuations_are_what_followed_and_copy_on_past_the_end():
    rng = np.random.default_rng(3)
    text = rng.integers(0, 4, 80).tolist()
    index = SuffixIndex()
    doc = index.start()
    index.extend(doc, text)
    ends = np.arange(len(text) - 1)
    rows = index.continuations(ends, 6)
    for e, row in zip(ends, rows.tolist()):
        want = text[e + 1 : e + 7]
        assert row == want + [-1] * (6 - len(want))
    looped = copied_on(np.array(text), ends, 6)
    for e, row, known in zip(ends.tolist(), looped.tolist(), rows.tolist()):
        period = len(text) - 1 - e  # the text continued as its own last `period` tokens, again and again
        assert row == [text[e + 1 + j % period] for j in range(6)]
        assert row[:period] == known[:period]


def test_many_interleaved_documents_keys_and_skipping():
    rng = np.random.default_rng(4)
    index = SuffixIndex()
    docs = {index.start(key=k % 3): [] for k in range(6)}
    keys = {d: index.docs[d].key for d in docs}
    for _ in range(600):  # interleaved, as a batch's rows append
        d = int(rng.choice(list(docs)))
        token = int(rng.integers(0, 4))
        docs[d].append(token)
        index.append(d, token)
    assert len(index) == sum(map(len, docs.values()))
    for tail in (rng.integers(0, 4, 12).tolist() for _ in range(30)):
        for skip in (None, 0, 2):
            kept = {d: doc for d, doc in docs.items() if keys[d] != skip}
            m, ends = index.longest_match(tail, skip_key=skip)
            want_m, want_ends = brute_match(kept, tail)
            assert m == want_m
            if len(want_ends) <= MAX_ENDS:
                assert as_doc_positions(index, ends) == want_ends
            rows = index.continuations(ends, 5)
            for pos, row in zip(ends.tolist(), rows.tolist()):
                ((d, e),) = as_doc_positions(index, np.array([pos]))
                want = docs[d][e + 1 : e + 6]
                assert row == want + [-1] * (5 - len(want))


def test_a_bounded_index_evicts_the_oldest_documents_and_answers_for_the_rest():
    capacity = 200
    rng = np.random.default_rng(5)
    index = SuffixIndex(capacity)
    docs: dict[int, list[int]] = {}
    for _ in range(40):  # documents of 10-40 tokens, two growing at a time
        new = [index.start(), index.start()]
        for d in new:
            docs[d] = []
        lengths = rng.integers(10, 40, 2)
        for step in range(int(lengths.max())):
            for d, n in zip(new, lengths):
                if step < n:
                    token = int(rng.integers(0, 5))
                    if d in index.docs:  # (an evicted document takes no more tokens)
                        docs[d].append(token)
                    index.append(d, token)
        assert len(index) <= capacity
    kept = {d: docs[d] for d in index.docs}
    assert 0 < len(kept) < len(docs) and sum(map(len, kept.values())) == len(index)
    assert set(kept) == set(sorted(docs)[-len(kept) :])  # the oldest went first
    for d in kept:  # what the index holds is the document, in order
        assert [int(index.tokens[p]) for p in _positions(index, d)] == kept[d]
    for tail in (rng.integers(0, 5, 8).tolist() for _ in range(40)):
        m, ends = index.longest_match(tail)
        assert m == brute_match(kept, tail)[0]
        if m:
            assert as_doc_positions(index, ends) <= brute_match(kept, tail)[1]


def _positions(index: SuffixIndex, doc: int) -> list[int]:
    pos = index.docs[doc].last
    out = []
    while pos >= 0:
        out.append(pos)
        pos = int(index.prev[pos])
    return out[::-1]


# --- the trie of candidates ---------------------------------------------------------------------------------


def brute_trie(rows: list[list[int]], m: int, chance) -> dict[tuple, float]:
    """{path: P(path)} for every path that some continuation starts with, P multiplied down the path from
    chance(m + depth, share of the parent's continuations that go on through it)."""
    out: dict[tuple, float] = {(): 1.0}
    depth = len(rows[0]) if rows else 0
    for d in range(depth):
        for parent in [p for p in out if len(p) == d]:
            members = [r for r in rows if tuple(r[:d]) == parent]
            for token in {r[d] for r in members if r[d] >= 0}:
                through = [r for r in members if r[d] == token]
                out[parent + (token,)] = out[parent] * chance(m + d, len(through) / len(members))
    del out[()]
    return out


def paths_of(trie) -> list[tuple]:
    paths = []
    for token, parent in zip(trie.tokens, trie.parents):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    return paths


@pytest.mark.parametrize("seed", range(6))
def test_the_trie_is_brute_force_s_best_nodes_grown_best_first(seed):
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 3, (int(rng.integers(1, 12)), 5))
    rows[rng.random(rows.shape) < 0.1] = -1
    rows = np.where(np.cumsum(rows < 0, axis=1) > 0, -1, rows)  # a continuation stops where it is unknown
    calibration = Calibration()
    calibration.update(4, 1.0, False)  # a(L) below the prior at one length: P depends on the context length
    want = brute_trie(rows.tolist(), 3, calibration.chance)
    full = grow_candidates(rows, 3, calibration.chance, n_max=1000, min_prob=0.0)
    assert dict(zip(paths_of(full), full.probs)) == pytest.approx(want)
    assert full.probs == sorted(full.probs, reverse=True) and all(p < i for i, p in enumerate(full.parents))
    assert full.contexts == [3 + len(p) - 1 for p in paths_of(full)]
    for n in (1, 3, 7):  # the best n are the n highest P (a child never beats its parent)
        best = grow_candidates(rows, 3, calibration.chance, n_max=n, min_prob=0.0)
        assert sorted(best.probs) == pytest.approx(sorted(want.values())[::-1][:n][::-1])
    pruned = grow_candidates(rows, 3, calibration.chance, n_max=1000, min_prob=0.2)
    assert set(paths_of(pruned)) == {p for p, v in want.items() if v >= 0.2}
    chain = grow_candidates(rows, 3, calibration.chance, n_max=1000, chain=True, min_prob=0.0)
    assert chain.parents == list(range(-1, len(chain) - 1))
    path = ()
    for token in chain.tokens:  # each step the likeliest child
        children = {p[-1]: v for p, v in want.items() if p[:-1] == path}
        assert want[path + (token,)] == pytest.approx(max(children.values()))
        path += (token,)


def test_siblings_come_likeliest_first_and_the_most_recent_wins_ties():
    rows = np.array([[4, 1], [5, 1], [4, 2], [5, 3]])  # 4 and 5 twice each; the latest occurrence (last row) is 5's
    trie = grow_candidates(rows, 2, lambda L, f: f, 10, min_prob=0.0)
    assert trie.tokens[:2] == [5, 4] and trie.parents[:2] == [-1, -1]
    assert trie.top_path() == [0, trie.parents.index(0)]
    assert trie.tokens[trie.top_path()[1]] == 3  # after 5, its most recent continuation (3, against 1: one each)


def test_calibration_learns_how_often_candidates_are_right_by_context_length():
    cal = Calibration()
    prior_8, prior_2 = cal.rate(8), cal.rate(2)
    assert prior_2 < prior_8 < 1
    for _ in range(50):
        cal.update(9, 1.0, True)  # candidates with 8-15 tokens of context: always right
        cal.update(2, 0.5, False)  # with 2-3: never
    assert cal.rate(8) > 0.95 > prior_8 and cal.rate(15) == cal.rate(8)
    assert cal.rate(16) == pytest.approx(16 / 18)  # untouched: the prior
    assert cal.rate(3) < 0.2 < prior_2
    assert cal.chance(9, 0.5) == pytest.approx(cal.rate(9) * 0.5)
    for _ in range(20):
        cal.update(40, 0.1, True)  # rare candidates that were right anyway: a(L) f stays a chance below 1
    assert cal.rate(40) > 1 and cal.chance(40, 1.0) == 0.99
    for _ in range(100):
        cal.update(9, 1.0, False)  # the text stopped repeating: it forgets
    assert cal.rate(9) < 0.2
    assert [Calibration.bucket(n) for n in (1, 2, 3, 4, 7, 8, 63, 64, 500)] == [0, 1, 1, 2, 2, 3, 5, 6, 6]


def test_bad_capacity_is_refused():
    with pytest.raises(ValueError, match="capacity of at least 16"):
        SuffixIndex(3)
