"""Two tokenizers side by side, for a draft that reads another vocabulary (crossvocab.py).

The tokens they share (VocabMap, vocab_map), the tokens a longer text could still grow into
(extendable), and text as BYTES between them: spelling bytes with a tokenizer (spell), cutting an
incomplete trailing UTF-8 character (complete_utf8), and the size of SLRS's tree of draft
tokenizations (tokenization_tree_size).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..model.tokenizer import control_ids


@dataclass(frozen=True)
class VocabMap:
    """The tokens two vocabularies share: draft_ids[i] and target_ids[i] are the same bytes.

    Ordinary tokens match by their bytes, control tokens by their names ("<|endoftext|>"),
    never one with the other. Built once per pair of tokenizers (vocab_map).
    """

    draft_ids: np.ndarray  # [n_shared] int64, sorted
    target_ids: np.ndarray  # [n_shared] int64, target_ids[i] is draft_ids[i]'s string in the target's vocabulary
    n_draft: int  # the draft's n_vocab
    n_target: int  # the target's n_vocab

    def to_target(self, q_draft: np.ndarray) -> np.ndarray:
        """[n_draft] draft probabilities -> [n_target]: the shared tokens' mass at the target's ids, 0 elsewhere.
        Not renormalised (the row sums to the shared mass)."""
        row = np.zeros(self.n_target, dtype=q_draft.dtype)  # [n_target]
        row[self.target_ids] = q_draft[self.draft_ids]
        return row


def token_strings(tokenizer, n_vocab: int) -> dict[tuple[bytes, bool], int]:
    """{(bytes, is_control): id} for every id below n_vocab that the tokenizer has."""
    control = control_ids(tokenizer)
    out = {}
    for i in range(n_vocab):
        try:
            out[(tokenizer.decode_single_token_bytes(i), i in control)] = i
        except KeyError:  # an id with no token (a padded vocabulary)
            continue
    return out


@lru_cache(maxsize=8)
def vocab_map(draft_tokenizer, target_tokenizer, n_draft: int, n_target: int) -> VocabMap:
    """The shared tokens of two tokenizers, by comparing every token's bytes (once per pair)."""
    draft, target = token_strings(draft_tokenizer, n_draft), token_strings(target_tokenizer, n_target)
    pairs = sorted((i, target[s]) for s, i in draft.items() if s in target)
    ids = np.array(pairs, dtype=np.int64).reshape(-1, 2)  # [n_shared, 2]
    return VocabMap(ids[:, 0].copy(), ids[:, 1].copy(), n_draft, n_target)


@lru_cache(maxsize=8)
def extendable(tokenizer, n_vocab: int) -> frozenset[bytes]:
    """Every proper prefix of an ordinary token's bytes: text ending in one of these could still
    become a longer token if more text followed."""
    out = set()
    for (b, control), _ in token_strings(tokenizer, n_vocab).items():
        if not control:
            out.update(b[:j] for j in range(1, len(b)))
    return frozenset(out)


@lru_cache(maxsize=8)
def ordinary_tokens(tokenizer, n_vocab: int) -> dict[bytes, int]:
    """{bytes: id} for every ordinary (not control) token below n_vocab."""
    return {b: i for (b, control), i in token_strings(tokenizer, n_vocab).items() if not control}


def longest_token(data: bytes, tokens: dict[bytes, int], longest: int) -> int | None:
    """The id of the longest token whose bytes begin `data`; None when no token does.

    >>> longest_token(b"abc", {b"a": 0, b"ab": 3}, 2)
    3
    """
    for n in range(min(len(data), longest), 0, -1):
        if data[:n] in tokens:
            return tokens[data[:n]]
    return None


@lru_cache(maxsize=16)
def tokenization_tree_size(draft_tokenizer, target_tokenizer, n_draft: int, n_target: int, limit: int) -> int:
    """Draft passes one SLRS row costs: 1 + the number of draft tokenizations of every string
    that is a proper prefix of a target token (counting stops once it passes limit).

    Every such tokenization is a node of the tree CrossVocabDrafter.string_law walks: the draft
    may still be on its way to a longer target token there, so its next q is needed. ways[s],
    the tokenizations of s, is the sum over the draft tokens t that end s of ways[s without t].
    """
    prefixes = extendable(target_tokenizer, n_target)
    draft = ordinary_tokens(draft_tokenizer, n_draft)
    longest = max(map(len, draft))
    ways, total = {b"": 1}, 1
    for s in sorted(prefixes, key=len):  # a prefix's own prefixes come first
        ways[s] = sum(ways.get(s[:j], 0) for j in range(max(0, len(s) - longest), len(s)) if s[j:] in draft)
        total += ways[s]
        if total > limit:
            break
    return total


ESCAPED = re.compile(r"([\udc80-\udcff]+)")  # bytes that are not UTF-8, as surrogateescape writes them


def spell(tokenizer, data: bytes) -> list[int]:
    """Token ids that spell `data` with this tokenizer, as plain text.

    subtle: tiktoken encodes str, and byte-level pieces need not be valid UTF-8 alone. Valid runs
    are encoded as text; any other byte becomes its single-byte token. A character the vocabulary
    cannot spell (SmolLM2 has no token for 21 byte values) is left out: the drafter only reads
    this, so a gap costs acceptance, never exactness.
    """
    missing = getattr(tokenizer, "missing_bytes", frozenset())
    ids: list[int] = []
    for j, piece in enumerate(ESCAPED.split(data.decode("utf-8", errors="surrogateescape"))):
        if j % 2:  # a run of non-UTF-8 bytes
            raw = piece.encode("utf-8", errors="surrogateescape")
            ids += [tokenizer.encode_single_token(bytes([b])) for b in raw if b not in missing]
        elif piece:
            if missing:
                piece = "".join(c for c in piece if not missing.intersection(c.encode("utf-8")))
            ids += tokenizer.encode_ordinary(piece)
    return ids


def complete_utf8(data: bytes) -> bytes:
    """data without a trailing incomplete UTF-8 character (the draft may stop inside one).

    >>> complete_utf8("é".encode()[:1]), complete_utf8(b"ab")
    (b'', b'ab')
    """
    for n in range(1, min(4, len(data)) + 1):
        b = data[-n]
        if b & 0xC0 != 0x80:  # ASCII or a lead byte: the last character starts n bytes back
            size = 1 if b < 0x80 else 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return data[:-n] if b >= 0xC0 and size > n else data
    return data


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
