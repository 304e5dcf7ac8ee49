"""Drafts from a model with another tokenizer, verified exactly (Timor et al., arXiv 2502.05202).

What it adds over ModelDrafter: the draft model may read and write a different
vocabulary from the target's. Speculative sampling as Leviathan et al. state it
judges draft token i on the target's row i, which needs one vocabulary. Timor
et al., "Accelerating LLM Inference with Lossless Speculative Decoding
Algorithms for Heterogeneous Vocabularies" (ICML 2025), give rules that keep the
output exactly the target's; two are here, behind the ordinary Drafter
interface, so the round in speculative.py and verify.py are unchanged:

    "tli"   token-level intersection: the draft's q restricted to the tokens whose
            bytes are also ONE target token, renormalised, mapped to the target's
            ids; then the ordinary rejection test against p. Exact at any
            temperature, with top-k / top-p.
    "slem"  string-level exact match: the draft's greedy tokens decoded to bytes,
            re-encoded with the target's tokenizer, and the target's greedy tokens
            accept the longest matching prefix. Exact at temperature 0 only (greedy
            verification never reads q); sampling is refused.
    "slrs"  string-level rejection sampling is not implemented: its q of a string
            sums over every draft tokenization of that string.

Letters as in speculative.py: p is the TARGET's distribution, q the DRAFT's.

The boundary between the two tokenizations, and the caches. The text is the
target's token ids; the draft sees the same BYTES, tokenized its own way
(`spell`). Every round the drafter re-encodes the text with the draft's
tokenizer and rolls its KV cache back to the longest prefix its cached tokens
share with that encoding (`propose`): a boundary both tokenizations agree on,
since those draft tokens spell a prefix of the accepted text. The target's cache
rolls back as always (it keeps exactly the accepted target tokens). Nothing in
this affects exactness: what the draft conditions on only changes how good its
guesses are; exactness needs only that q is what the drafts were drawn from.

A worked boundary (SmolLM2 target, stdlib-2L draft, docs/cross-vocab.md): the
text "    total" is SmolLM2's "   " + " total" and the stdlib BPE's "   " + " t" +
"otal". TLI proposes only draft tokens whose bytes are a whole target token: it
may propose " t" (SmolLM2 has it too), which the target, wanting " total",
rejects. SLEM re-encodes the draft's bytes " t", "otal" as SmolLM2's " total",
and drops the last re-encoded token when more draft text could have extended it
(the draft stopping after " t" gives " t", a prefix of " total": dropped). Byte-level pieces need not be valid UTF-8 alone
("é" is two bytes; a draft token may end between them): everything is bytes
until the target's tokenizer reads them, and an incomplete trailing character
is left for the next round.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..interfaces import Proposal
from ..model.cache import KVCache
from ..model.tokenizer import control_ids
from ..sampling import SamplingParams, draw, probabilities

CROSS_VOCAB = ("slem", "slrs", "tli")  # the rules of Timor et al.; "slrs" is refused (not implemented)


def check_rule(rule: str, params: SamplingParams | None = None) -> None:
    """A ValueError with one sentence for a rule specdec does not offer, or cannot keep exact with params."""
    if rule not in CROSS_VOCAB:
        raise ValueError(f"cross_vocab must be 'tli', 'slem' or 'slrs', got {rule!r}")
    if rule == "slrs":
        raise ValueError("cross_vocab 'slrs' (string-level rejection sampling) is not implemented in specdec: use "
                         "'tli' (exact at any temperature) or 'slem' (temperature 0)")  # fmt: skip
    if rule == "slem" and params is not None and not params.greedy:
        raise ValueError("cross_vocab 'slem' is exact only at temperature 0 (greedy); for sampling use 'tli'")


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


class CrossVocabDrafter:
    """A draft model with its own tokenizer, proposing TARGET token ids by TLI or SLEM (module docstring).

        speculative_sample(smollm2, stdlib_2l, "def f(x):", 40, cross_vocab="tli")  # makes one of these
    """

    def __init__(self, model, target, rule: str):
        assert rule in ("tli", "slem"), f"unknown rule {rule!r}"
        self.model, self.rule = model, rule
        self.draft_tokenizer, self.target_tokenizer = model.tokenizer, target.tokenizer
        self.vocab = vocab_map(model.tokenizer, target.tokenizer, model.n_vocab, target.n_vocab)
        if not len(self.vocab.draft_ids):
            raise ValueError(f"the draft {model.name} and the target {target.name} share no token: no rule can use "
                             "its drafts")  # fmt: skip
        self.to_draft = dict(zip(self.vocab.target_ids.tolist(), self.vocab.draft_ids.tolist()))
        self.target_control = control_ids(target.tokenizer)
        self.target_names = target.tokenizer.special_tokens_set
        self.draft_control = {name: model.tokenizer.encode_single_token(name)
                              for name in model.tokenizer.special_tokens_set}  # fmt: skip
        self.extendable = extendable(target.tokenizer, target.n_vocab) if rule == "slem" else frozenset()
        self.n_vocab = target.n_vocab  # proposals are target ids
        self.n_ctx = None  # the draft's own limit is handled by a window (`context`)
        self.cache: KVCache = model.new_cache()
        self.cached: list[int] = []  # [cache.length] the draft tokens in self.cache, in order
        self.calls = 0

    def check(self, params: SamplingParams) -> None:
        """Refuse settings the rule cannot keep exact."""
        check_rule(self.rule, params)

    def begin(self, target, cache, prompt) -> None:
        self.cache.rollback(0)
        self.cached = []

    def context(self, ids: list[int], k: int) -> list[int]:
        """The draft's tokens for the text ids (target tokens): its ordinary text re-encoded from
        the bytes, a control token as the draft's control token of the same name (left out when
        the draft has none: <|im_start|> means nothing to a model never trained on it).

        Longer than the draft's context allows (with k more): only a window of its last
        tokens, whose start moves in steps of half the context so the cache stays reusable.
        """
        context: list[int] = []
        for control, run in itertools.groupby(ids, lambda i: i in self.target_control):
            if not control:
                context += spell(self.draft_tokenizer, self.target_tokenizer.decode_bytes(list(run)))
            else:
                names = (self.target_tokenizer.decode_single_token_bytes(i).decode() for i in run)
                context += [self.draft_control[name] for name in names if name in self.draft_control]
        context = context or [self.draft_tokenizer.eot_token]  # nothing the draft can read: start a document
        over = len(context) + k - self.model.n_ctx
        if over > 0:
            half = self.model.n_ctx // 2
            context = context[(over // half + 1) * half :]
        return context

    def propose(self, ids, k, params, rng, nodes=None) -> Proposal:
        """A chain of at most k target tokens (never a tree)."""
        context = self.context(ids, k)
        if not context:  # a draft context too short for k more tokens
            return Proposal.chain([])
        # Roll back to a boundary both tokenizations agree on: the longest prefix of the cached draft
        # tokens that is also a prefix of the draft's encoding of the accepted text (at least one
        # token is left to feed, for its logits).
        n = min(common_prefix(self.cached, context), len(context) - 1)
        self.cache.rollback(n)
        self.cached = context[:n]
        if self.rule == "slem":
            return self.propose_slem(context[n:], k)
        return self.propose_tli(context[n:], k, params, rng)

    def step(self, new: list[int]) -> np.ndarray:
        """Feed draft tokens; the last one's [n_draft] logits."""
        self.calls += 1
        self.cached += new
        return self.model.forward(new, self.cache, last_only=True)[0]

    def propose_tli(self, new: list[int], k: int, params: SamplingParams, rng) -> Proposal:
        """Token-level intersection (Timor et al.'s TLI).

        Draft step i: q_draft from the draft's logits (filtered like the target), then
            q_i(y) = q_draft(x) / sum_{x' shared} q_draft(x')   for y the target id of a shared x,
            q_i(y) = 0                                            for every other target token,
        and y_i is drawn from q_i; the draft then reads x (its own id for y_i).
        Why exact: q_i is a distribution over the target's vocabulary and y_i is drawn from it,
        given the earlier y's (the map is one-to-one, so the draft's tokens are a function of
        them). Leviathan et al.'s proof holds for ANY such q (verify.py's docstring): accept y_i
        with min(1, p_i(y_i) / q_i(y_i)), else draw from norm(max(0, p_i - q_i)) over the FULL
        target vocabulary, and the bonus from p over the full vocabulary too. A target token
        outside the intersection has q = 0, so the residual keeps all of its p: it is produced
        whenever the target wants it, just never guessed. (Restricting q changes its support,
        not p's: the same argument as a restricted draft head, restricted.py.)
        NOTE: q_i must be renormalised over the intersection: it is what y_i is drawn from.
        Reporting the unrenormalised row (summing to the shared mass) makes the acceptance
        test too generous and the output no longer p (tests/test_crossvocab.py).
        """
        tokens, q_rows = [], []
        for _ in range(k):
            logits = self.step(new)  # [n_draft]
            if params.greedy:  # the most likely shared token (greedy verification never reads q)
                j = int(np.argmax(logits[self.vocab.draft_ids]))
                x, y = int(self.vocab.draft_ids[j]), int(self.vocab.target_ids[j])
            else:
                q = self.intersect(probabilities(logits[None], params)[0])  # [n_target] or None
                if q is None:  # no mass on a shared token: stop drafting this round
                    break
                y = draw(q, rng)
                x = self.to_draft[y]
                q_rows.append(q)
            tokens.append(int(y))
            new = [x]
        return Proposal.chain(tokens, np.stack(q_rows) if q_rows else None)  # q: [n, n_target]

    def intersect(self, q_draft: np.ndarray) -> np.ndarray | None:
        """[n_draft] -> [n_target]: q_draft on the shared tokens, renormalised; None when they have no mass."""
        row = self.vocab.to_target(q_draft)  # [n_target], sums to the shared mass
        mass = row.sum()
        return row / mass if mass > 0 else None

    def propose_slem(self, new: list[int], k: int) -> Proposal:
        """String-level exact match (Timor et al.'s SLEM), greedy only.

        The draft writes k tokens greedily; their bytes are re-encoded with the target's
        tokenizer, starting at the text's end (the target's own tokens so far are kept as they
        are), and those target tokens are the proposal. The target's greedy verification
        (verify.greedy_chain) accepts the longest prefix equal to its own argmax tokens, and adds
        its own token: the output is the target's greedy decoding whatever was proposed.
        At the boundary: an incomplete trailing UTF-8 character is dropped, and so is the last
        re-encoded token when more draft text could have extended it (its bytes are a proper
        prefix of a longer target token): the target would likely continue with the longer one.
        """
        pieces, control = [], []
        for _ in range(k):
            x = int(np.argmax(self.step(new)))
            if x in self.draft_control.values():  # a control token ends the draft's text here
                name = self.draft_tokenizer.decode_single_token_bytes(x).decode()
                control = [self.target_tokenizer.encode_single_token(name)] if name in self.target_names else []
                break
            pieces.append(self.draft_tokenizer.decode_single_token_bytes(x))
            new = [x]
        tokens = spell(self.target_tokenizer, complete_utf8(b"".join(pieces)))
        if control and len(complete_utf8(b"".join(pieces))) == len(b"".join(pieces)):
            tokens += control  # the text ends here for sure: its last token cannot be extended
        elif tokens and self.target_tokenizer.decode_single_token_bytes(tokens[-1]) in self.extendable:
            tokens = tokens[:-1]
        return Proposal.chain(tokens[:k])

    def commit(self, ids, features) -> None:
        pass  # the next propose re-encodes the accepted text and rolls the cache back to agree with it
