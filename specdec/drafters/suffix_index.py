"""The index behind suffix decoding: where the longest suffix of a text occurred before, and what followed it.

drafters/suffix.py asks one question of each of its sources ("where did the text's tail occur before, and
what followed?"); a SuffixIndex answers it for growing documents of token ids (the request's own text, or
many earlier outputs sharing one bounded index), and copied_on reads what followed each occurrence in the
text itself. SuffixDecoding (Oliaro et al., arXiv 2411.04975) keeps suffix trees for this; the index here is
a table of token pairs walked backwards (see SuffixIndex), which finds the longest match only.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MIN_MATCH = 2  # shortest suffix looked for: after a lone common token a copy is a guess (lookup_first.py)
MAX_MATCH = 64  # longest suffix compared; longer matches count as 64 (vLLM's max tree depth is 24-64)
MAX_ENDS = 64  # occurrences of the match read per source per round, the latest (REST reads up to 5000; 64
# estimate a share of 0.1 well enough, and growing a trie over 256 of them in Python cost 0.5 ms a round)
NO_ENDS = np.zeros(0, dtype=np.int64)


@dataclass(slots=True)
class _Document:
    key: int  # what a query may skip (SuffixDrafter: a hash of the prompt whose output this is)
    last: int = -1  # its last position, -1 while empty
    last_token: int = -1
    length: int = 0


class SuffixIndex:
    """Documents of token ids, each growing a token at a time, and for a text: where its longest suffix occurred.

    Storage: an arena of positions in the order tokens were appended (documents may interleave: the rows of
    a batch append side by side). Per position, its token, its document's key, and the positions before and
    after it in its document (-1 at the ends). Per pair of tokens (a, b), the positions holding a b right
    after an a, in increasing order.

    append: O(1), amortised over the arrays' doubling (one arena slot, one list append).
    longest_match: the positions where the text's last two tokens occurred (the latest MAX_ENDS) are walked
        backwards together, one NumPy comparison per further token, while any still agrees:
        O(min(occurrences, MAX_ENDS) x m) for a match of m tokens, m <= MAX_MATCH. In an index of one
        document that lost nothing (the request's own text), a position is its index in the document, so
        all MAX_MATCH tokens before every end are compared in one NumPy operation instead.
    Memory: with a capacity, at most `capacity` tokens; appending past it evicts the oldest documents until a
        quarter is free and rebuilds the arena from the rest (O(capacity), once per capacity / 4 appends).
        A document evicted while still growing takes no more tokens.
    """

    def __init__(self, capacity: int | None = None):
        if capacity is not None and capacity < 16:
            raise ValueError(f"a suffix index needs a capacity of at least 16 tokens (or None), got {capacity}")
        self.capacity = capacity
        self.docs: dict[int, _Document] = {}  # oldest first
        self.held = 0  # tokens in the documents kept
        self.contiguous = True  # one document so far, nothing evicted: a position is its index in the document
        self._ids = itertools.count()
        self._empty_arena(64)

    def _empty_arena(self, size: int) -> None:
        self.size = 0  # positions in use
        self.tokens = np.zeros(size, np.int64)  # [size] the token at each position
        self.prev = np.full(size, -1, np.int64)  # [size] the position before it in its document, -1 for its first
        self.next = np.full(size, -1, np.int64)  # [size] the position after it, -1 for its last (so far)
        self.keys = np.zeros(size, np.int64)  # [size] its document's key
        self.doc_of = np.zeros(size, np.int64)  # [size] its document
        self.pairs: dict[tuple[int, int], list[int]] = {}  # (a, b) -> positions of a b that follows an a

    def __len__(self) -> int:
        """Tokens held (in documents not evicted)."""
        return self.held

    def start(self, key: int = 0) -> int:
        """A new, empty document; its id."""
        doc = next(self._ids)
        self.docs[doc] = _Document(key)
        self.contiguous = doc == 0
        return doc

    def extend(self, doc: int, tokens: Sequence[int]) -> None:
        for token in tokens:
            self.append(doc, token)

    def append(self, doc: int, token: int) -> None:
        """Add a token at the end of a document (nothing, if the document was evicted)."""
        if doc not in self.docs:
            return
        if self.capacity is not None and len(self) >= self.capacity:
            self._evict()
            if doc not in self.docs:
                return
        if self.size == len(self.tokens):
            self._grow()
        d, pos, token = self.docs[doc], self.size, int(token)
        self.tokens[pos], self.prev[pos], self.next[pos] = token, d.last, -1
        self.keys[pos], self.doc_of[pos] = d.key, doc
        if d.last >= 0:
            self.next[d.last] = pos
            self.pairs.setdefault((d.last_token, token), []).append(pos)
        d.last, d.last_token, d.length = pos, token, d.length + 1
        self.size += 1
        self.held += 1

    def _grow(self) -> None:
        extra = len(self.tokens)
        self.tokens = np.concatenate([self.tokens, np.zeros(extra, np.int64)])
        self.prev = np.concatenate([self.prev, np.full(extra, -1, np.int64)])
        self.next = np.concatenate([self.next, np.full(extra, -1, np.int64)])
        self.keys = np.concatenate([self.keys, np.zeros(extra, np.int64)])
        self.doc_of = np.concatenate([self.doc_of, np.zeros(extra, np.int64)])

    def _evict(self) -> None:
        """Drop the oldest documents until a quarter of the capacity is free, and rebuild the arena from the rest."""
        held, self.contiguous = self.held, False
        while self.docs and held > self.capacity * 3 // 4:
            held -= self.docs.pop(next(iter(self.docs))).length
        tokens, doc_of, size = self.tokens, self.doc_of, self.size
        self._empty_arena(max(64, 2 * held))
        self.held = 0
        for d in self.docs.values():
            d.last, d.last_token, d.length = -1, -1, 0
        for pos in range(size):  # arena order is append order, so every document keeps its own order
            doc = int(doc_of[pos])
            if doc in self.docs:
                self.append(doc, int(tokens[pos]))

    def longest_match(
        self, tail: Sequence[int], skip_key: int | None = None, before: int | None = None
    ) -> tuple[int, np.ndarray]:
        """(m, ends): the longest suffix of `tail` that occurs here, m tokens (MIN_MATCH <= m <= MAX_MATCH;
        0 when none does), and the positions where its occurrences end ([n_ends], increasing; the latest
        MAX_ENDS of them). skip_key: ignore documents with this key. before: ignore occurrences ending at or
        after this position (the text's own tail, when the text itself is indexed here).

        >>> index = SuffixIndex(); doc = index.start(); index.extend(doc, [5, 1, 2, 3, 9, 2, 3, 1, 2, 3])
        >>> index.longest_match([1, 2, 3], before=9)   # [1, 2, 3] ended at 3 before; [2, 3] also at 6
        (3, array([3]))
        """
        if len(tail) < MIN_MATCH:
            return 0, NO_ENDS
        ends = np.asarray(self.pairs.get((int(tail[-2]), int(tail[-1])), [])[-4 * MAX_ENDS :], dtype=np.int64)
        if before is not None:
            ends = ends[ends < before]
        if skip_key is not None:
            ends = ends[self.keys[ends] != skip_key]
        ends = ends[-MAX_ENDS:]
        if not len(ends):
            return 0, NO_ENDS
        if self.contiguous:  # positions are the document's own: compare every length at once
            limit = min(len(tail), MAX_MATCH)
            back = ends[:, None] - np.arange(limit)  # [n_ends, limit] positions read backwards from each end
            agree = (back >= 0) & (self.tokens[np.maximum(back, 0)] == np.asarray(tail[::-1][:limit]))
            lengths = np.cumprod(agree, axis=1).sum(axis=1)  # [n_ends] the first disagreement, read backwards
            m = int(lengths.max())
            return m, ends[lengths == m]
        lengths = np.full(len(ends), MIN_MATCH)  # [n_ends] tokens matched so far, backwards from each end
        alive = np.arange(len(ends))  # the occurrences that still agree
        pos = self.prev[self.prev[ends]]  # [n_alive] the position before the pair, -1 at a document's start
        for j in range(MIN_MATCH + 1, min(len(tail), MAX_MATCH) + 1):
            agree = (pos >= 0) & (self.tokens[pos] == tail[-j])  # (tokens[-1] where pos is -1: masked)
            alive, pos = alive[agree], pos[agree]
            if not len(alive):
                break
            lengths[alive] = j
            pos = self.prev[pos]
        m = int(lengths.max())
        return m, ends[lengths == m]

    def continuations(self, ends: np.ndarray, depth: int) -> np.ndarray:
        """What followed each end in its document: [n_ends, depth] token ids, -1 past the document's end (so far)."""
        rows = np.full((len(ends), depth), -1, np.int64)
        pos = self.next[ends]  # [n_ends]
        for j in range(depth):
            live = pos >= 0
            if not live.any():
                break
            rows[live, j] = self.tokens[pos[live]]
            pos = np.where(live, self.next[pos], -1)
        return rows


def copied_on(text: np.ndarray, ends: np.ndarray, depth: int) -> np.ndarray:
    """What followed each end in the text itself, copied on past the text's end (LZ77-style): [n_ends, depth].

    An occurrence ending P = last - end tokens before the text's last token is followed by P known tokens;
    if the text goes on as it went after that occurrence, it repeats with period P, so the continuation is
    its first P tokens again and again (drafters/trees.continuation does the same for one occurrence).

    >>> copied_on(np.array([7, 1, 2, 1, 2]), np.array([2]), 5)   # [1, 2] ended at 2 before: the loop 1 2 1 2 1
    array([[1, 2, 1, 2, 1]])
    """
    period = len(text) - 1 - ends  # [n_ends] >= 1
    return text[ends[:, None] + 1 + np.arange(depth) % period[:, None]]  # [n_ends, depth]
