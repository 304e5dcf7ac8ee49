"""A datastore for suffix decoding: a corpus of the target's own replies, and what followed any text's tail there.

REST (He et al., "REST: Retrieval-Based Speculative Decoding", arXiv 2311.08252, section 3) keeps a suffix
array over a datastore, finds the longest suffix of the current text in it by binary search, and merges
what followed its occurrences into a trie whose most frequent nodes are verified as a tree. Here the
corpus is replies the target wrote itself (`python -m specdec.train data`), so its stock phrases are
there; suffix.SuffixDrafter grows the trie and prices it (suffix.grow_candidates).

The index: every position of the corpus, sorted by the text read BACKWARDS from it
(tokens[i], tokens[i-1], ..., a suffix array of the reversed corpus). All positions where a text ends
with the same j tokens then form one range of that order, sorted by the token before those j, so the
text's tail, read backwards, narrows the range one token at a time by binary search: O(m log n) for
a match of m tokens, where REST searches its forward suffix array once per suffix length it tries. The
range left is the occurrences' end positions; what followed each is the corpus after it.

    corpus   [n] uint16: the replies end to end, each preceded and followed by SEPARATOR (0xFFFF, which no
             token id of a vocabulary under 65,535 can equal, so no match runs across two replies)
    ends     [n] int32: the positions of the corpus, sorted by the text read backwards from each

Files: DIR/datastore.json (the card: format, sizes, the vocabulary, where the replies came from, and the
sha256 of) DIR/datastore-<first 16 hex digits of its sha256>.bin: the corpus then the ends, little-endian,
6 bytes a token (1M tokens: 6 MB). Written bin first, card second (the switch), old bins removed last, as
checkpoints/pairs.py replaces a pair. Read: the card (bounded), then the bin opened once (a regular
file, its size exactly 6 n, read whole), its sha256 checked, every token checked below n_vocab (or the
separator), the ends checked to be a permutation of 0 .. n-1 sorted by their first token.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import safe_io
from ..checkpoints.pairs import show
from ..checkpoints.sizes import human_size
from .suffix_index import MAX_ENDS, MAX_MATCH, MIN_MATCH  # a match's shortest and longest, occurrences read

SEPARATOR = 0xFFFF  # between replies; never a token id (n_vocab <= SEPARATOR is checked)
FORMAT = "specdec-datastore-1"
CARD = "datastore.json"
STEM = "datastore"
MAX_TOKENS = 1 << 27  # what a datastore file may hold (768 MB): a bound checked before anything is read
SMALL_RANGE = 64  # a range this small is narrowed by one np.searchsorted over its column, not scalar probes
MAKE = "python -m specdec.train datastore --model MODEL --data DIR --out DIR"


class DatastoreFileError(ValueError):
    """A datastore folder that is missing, malformed, damaged or made for another vocabulary."""


def backward_order(corpus: np.ndarray) -> np.ndarray:
    """Every position i of `corpus`, sorted by corpus[i], corpus[i-1], ..., corpus[0] (shorter first on ties).

    Prefix doubling (Manber and Myers): rank the positions by their first h tokens read backwards, then by
    their first 2h, which are the first h of i and the first h of i - h (-1, the lowest, before the start):
    one sort of a pair of ranks per round, until every rank differs. O(n log n) per round, and
    log2(the longest repeated stretch) rounds.  [n] -> [n] int64

    >>> backward_order(np.array([3, 1, 3, 1])).tolist()   # backwards: 3; 1 3; 3 1 3; 1 3 1 3
    [1, 3, 0, 2]
    """
    n = len(corpus)
    rank = np.unique(corpus, return_inverse=True)[1].astype(np.int64)  # [n] i's rank by its first h = 1 tokens
    h = 1
    while True:
        before = np.full(n, -1, np.int64)
        before[h:] = rank[:-h]  # [n] the rank of the h tokens before i's first h (-1: past the start)
        key = rank * (n + 1) + (before + 1)  # [n] the pair as one number (0 <= before + 1 <= n)
        order = np.argsort(key, kind="stable")  # [n]
        ordered = key[order]
        rank = np.empty(n, np.int64)
        rank[order] = np.concatenate([[0], np.cumsum(ordered[1:] != ordered[:-1])])
        if n == 0 or rank[order[-1]] == n - 1:  # all distinct: the order is final
            return order
        h *= 2


@dataclass
class Datastore:
    """A corpus of replies and its backward order; `card` says where they came from (datastore.json)."""

    corpus: np.ndarray  # [n] uint16, SEPARATOR between replies
    ends: np.ndarray  # [n] int32, positions sorted by the text read backwards (backward_order)
    n_vocab: int
    card: dict

    @classmethod
    def build(cls, replies: Sequence[Sequence[int]], n_vocab: int, card: dict | None = None) -> Datastore:
        """The datastore of these replies (token ids < n_vocab)."""
        if not 1 <= n_vocab <= SEPARATOR:
            raise ValueError(f"a datastore stores token ids as uint16 below {SEPARATOR}; n_vocab is {n_vocab}")
        pieces = [np.array([SEPARATOR], np.uint16)]
        for reply in replies:
            reply = np.asarray(reply, dtype=np.int64)
            if len(reply) and (reply.min() < 0 or reply.max() >= n_vocab):
                raise ValueError(f"a reply holds ids outside 0..{n_vocab - 1}: not this vocabulary's")
            pieces += [reply.astype(np.uint16), np.array([SEPARATOR], np.uint16)]
        corpus = np.concatenate(pieces)
        if len(corpus) > MAX_TOKENS:
            raise ValueError(f"{len(corpus):,} tokens is more than a datastore holds ({MAX_TOKENS:,}): use fewer")
        card = {**(card or {}), "n_tokens": len(corpus), "n_replies": len(replies)}
        return cls(corpus, backward_order(corpus).astype(np.int32), n_vocab, card)

    def __len__(self) -> int:
        return len(self.corpus)

    # --- the query ---------------------------------------------------------------------------------------

    def _back(self, position: int, j: int) -> int:
        """The j-th token read backwards from a position (j = 0: its own), -1 past the start."""
        i = position - j
        return int(self.corpus[i]) if i >= 0 else -1

    def _narrow(self, lo: int, hi: int, j: int, token: int) -> tuple[int, int]:
        """Of ends[lo:hi] (which agree on their first j tokens read backwards, and are sorted by the next),
        the range whose j-th token read backwards is `token`."""
        if hi - lo <= SMALL_RANGE:
            positions = self.ends[lo:hi].astype(np.int64) - j  # [hi - lo]
            column = np.where(positions >= 0, self.corpus[np.maximum(positions, 0)], -1)
            return lo + int(np.searchsorted(column, token, "left")), lo + int(np.searchsorted(column, token, "right"))

        def back(k: int) -> int:  # the sort key of ends[k] at this column, for bisect
            return self._back(int(self.ends[k]), j)

        window = range(lo, hi)
        return lo + bisect.bisect_left(window, token, key=back), lo + bisect.bisect_right(window, token, key=back)

    def longest_match(self, tail: Sequence[int]) -> tuple[int, np.ndarray]:
        """(m, ends): the longest suffix of `tail` in the corpus, m tokens (MIN_MATCH <= m <= MAX_MATCH; 0 when
        none is), and where its occurrences end ([n_ends] increasing; MAX_ENDS of them, evenly spread over all).

        >>> store = Datastore.build([[5, 1, 2, 3], [9, 2, 3, 4]], 10)
        >>> store.longest_match([7, 1, 2, 3])   # [1, 2, 3] ends at 4 (after the separator at 0)
        (3, array([4]))
        """
        lo, hi, m = 0, len(self.ends), 0
        for j in range(min(len(tail), MAX_MATCH)):
            lo_j, hi_j = self._narrow(lo, hi, j, int(tail[-1 - j]))
            if lo_j == hi_j:
                break
            lo, hi, m = lo_j, hi_j, j + 1
        if m < MIN_MATCH:
            return 0, np.zeros(0, np.int64)
        picked = np.unique(np.linspace(lo, hi - 1, min(hi - lo, MAX_ENDS)).astype(np.int64))
        return m, np.sort(self.ends[picked].astype(np.int64))

    def count(self, tokens: Sequence[int]) -> int:
        """How often `tokens` (one or more token ids) occur in the corpus, inside one reply (the size of their
        range of `ends`).

        >>> store = Datastore.build([[5, 1, 2, 3], [9, 1, 2, 4]], 10)
        >>> store.count([1, 2]), store.count([2, 1]), store.count([3, 9])   # none across two replies
        (2, 0, 0)
        """
        assert len(tokens) and SEPARATOR not in tokens, "count one or more token ids"
        lo, hi = 0, len(self.ends)
        for j in range(len(tokens)):
            lo, hi = self._narrow(lo, hi, j, int(tokens[-1 - j]))
            if lo == hi:
                break
        return hi - lo

    def continuations(self, ends: np.ndarray, depth: int) -> np.ndarray:
        """What followed each end in its reply: [n_ends, depth] token ids, -1 from the reply's end on."""
        at = np.minimum(ends[:, None] + 1 + np.arange(depth), len(self.corpus) - 1)  # [n_ends, depth]
        tokens = self.corpus[at].astype(np.int64)
        over = np.cumsum(tokens == SEPARATOR, axis=1) > 0  # [n_ends, depth] at or after the reply's end
        return np.where(over, -1, tokens)

    # --- the files ---------------------------------------------------------------------------------------

    def save(self, folder: str | Path) -> Path:
        """Write DIR/datastore-<sha>.bin, then DIR/datastore.json naming it (the switch), then remove older bins.
        Returns the bin's path."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        data = self.corpus.astype("<u2").tobytes() + self.ends.astype("<i4").tobytes()
        sha256 = hashlib.sha256(data).hexdigest()
        path = folder / f"{STEM}-{sha256[:16]}.bin"
        safe_io.write_file(path, data, mode=0o644)
        sizes = {"n_tokens": len(self), "n_vocab": self.n_vocab, "separator": SEPARATOR}
        card = {"format": FORMAT, **self.card, **sizes, "file": path.name, "sha256": sha256}
        safe_io.write_json(folder / CARD, card, mode=0o644)
        for old in folder.glob(f"{STEM}-*.bin"):
            if old != path:
                old.unlink()
        return path

    @classmethod
    def load(cls, folder: str | Path, n_vocab: int) -> Datastore:
        """The datastore in `folder`, checked before use (see the module); DatastoreFileError of one line
        naming the file and what to do otherwise."""
        folder = Path(folder).expanduser()
        card_path = folder / CARD

        def bad(where: Path, what: str) -> DatastoreFileError:
            return DatastoreFileError(f"{where}: {what}; make one with: {MAKE}")

        if not card_path.is_file():
            raise bad(folder, f"no datastore here (no {CARD})")
        try:
            card = safe_io.read_json(card_path, follow_links=False)
        except (OSError, ValueError) as e:
            raise bad(card_path, str(e)) from e
        if card.get("format") != FORMAT:
            raise bad(card_path, f"'format' is {show(card.get('format'))}, not {FORMAT!r}")
        n = card.get("n_tokens")
        if type(n) is not int or not 1 <= n <= MAX_TOKENS:
            raise bad(card_path, f"'n_tokens' must be a whole number in 1..{MAX_TOKENS}, got {show(n)}")
        if card.get("n_vocab") != n_vocab or card.get("separator") != SEPARATOR:
            raise DatastoreFileError(
                f"{card_path}: this datastore holds ids of a vocabulary of {show(card.get('n_vocab'))} tokens, the "
                f"target has {n_vocab}: make one from this target's replies with: {MAKE}"
            )
        name, sha256 = card.get("file"), card.get("sha256")
        if not isinstance(name, str) or not re.fullmatch(rf"{STEM}-[0-9a-f]{{16}}\.bin", name):
            raise bad(card_path, f"'file' is {show(name)}, not a file specdec wrote")
        path = folder / name
        try:
            data = safe_io.read_bytes(path, 6 * n, follow_links=False)  # a regular file, read once, within 6 n
        except (OSError, ValueError) as e:
            raise bad(path, e.strerror if isinstance(e, OSError) and e.strerror else str(e)) from e
        if len(data) != 6 * n:
            raise bad(path, f"it holds {len(data):,} bytes, and the card's n_tokens makes {6 * n:,}")
        if hashlib.sha256(data).hexdigest() != sha256:
            raise bad(path, f"its sha256 is not the one {CARD} records (damaged or replaced)")
        corpus = np.frombuffer(data, "<u2", count=n).astype(np.uint16)
        ends = np.frombuffer(data, "<i4", count=n, offset=2 * n).astype(np.int32)
        if ((corpus >= n_vocab) & (corpus != SEPARATOR)).any():
            raise bad(path, f"it holds token ids outside 0..{n_vocab - 1}")
        if ends.min() < 0 or ends.max() >= n or (np.bincount(ends, minlength=n) != 1).any():
            raise bad(path, f"its order is not a permutation of the {n:,} positions")
        if (np.diff(corpus[ends].astype(np.int64)) < 0).any():
            raise bad(path, "its order is not sorted by the text read backwards")
        return cls(corpus, ends, n_vocab, card)

    def describe(self) -> str:
        return f"{self.card.get('n_replies', '?')} replies, {len(self):,} tokens ({human_size(6 * len(self))})"
