"""Drafts from a model with another tokenizer, verified exactly (Timor et al., arXiv 2502.05202).

What it adds over ModelDrafter: the draft model may read and write a different
vocabulary from the target's. Speculative sampling as Leviathan et al. state it
judges draft token i on the target's row i, which needs one vocabulary. Timor
et al., "Accelerating LLM Inference with Lossless Speculative Decoding
Algorithms for Heterogeneous Vocabularies" (ICML 2025), give rules that keep the
output exactly the target's; all three are here, behind the ordinary Drafter
interface, so the round in speculative.py and verify/ are unchanged:

    "tli"   token-level intersection: the draft's q restricted to the tokens whose
            bytes are also ONE target token, renormalised, mapped to the target's
            ids; then the ordinary rejection test against p. Exact at any
            temperature, with top-k / top-p.
    "slem"  string-level exact match: the draft's greedy tokens decoded to bytes,
            re-encoded with the target's tokenizer, and the target's greedy tokens
            accept the longest matching prefix. Exact at temperature 0 only (greedy
            verification never reads q); sampling is refused.
    "slrs"  string-level rejection sampling: the draft writes tokens until its string
            can no longer grow into a longer target token; the target token that string
            begins with is the proposal, and its q sums the draft's probability over every
            draft tokenization that leads to it. Exact at any temperature; the sum needs
            one draft pass per node of a tree that grows with the vocabularies, so it is
            refused where that tree is too large (SLRS_MAX_PASSES).

Letters as in speculative.py: p is the TARGET's distribution, q the DRAFT's.

The boundary between the two tokenizations, and the caches. The text is the
target's token ids; the draft sees the same BYTES, tokenized its own way
(`spell`). Every round the drafter re-encodes the text with the draft's
tokenizer and rolls its KV cache back to the longest prefix its cached tokens
share with that encoding (`sync`): a boundary both tokenizations agree on,
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
(the draft stopping after " t" gives " t", a prefix of " total": dropped).
SLRS lets the draft write on past " t" until no longer target token fits, and
proposes the longest one its string begins with (" t" + "otal" + " =" stops on
" total"). Byte-level pieces need not be valid UTF-8 alone ("é" is two bytes; a
draft token may end between them): everything is bytes until the target's
tokenizer reads them, and an incomplete trailing character is left for the
next round.

The two vocabularies side by side (shared tokens, spelling bytes, the size of SLRS's tree) are in
vocabmap.py; this file holds the rules.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ..interfaces import Proposal
from ..model.attention import KVCache
from ..model.tokenizer import control_ids
from ..sampling import SamplingParams, draw, probabilities
from .vocabmap import (
    common_prefix,
    complete_utf8,
    extendable,
    longest_token,
    ordinary_tokens,
    spell,
    tokenization_tree_size,
    vocab_map,
)

CROSS_VOCAB = ("slem", "slrs", "tli")  # the rules of Timor et al.
SLRS_MAX_PASSES = 4096  # draft passes one SLRS row may cost (nodes of its tokenization tree); more is refused


def check_rule(rule: str, params: SamplingParams | None = None) -> None:
    """A ValueError with one sentence for a rule specdec does not offer, or cannot keep exact with params."""
    if rule not in CROSS_VOCAB:
        raise ValueError(f"cross_vocab must be 'tli', 'slem' or 'slrs', got {rule!r}")
    if rule == "slem" and params is not None and not params.greedy:
        raise ValueError("cross_vocab 'slem' is exact only at temperature 0 (greedy); for sampling use 'tli'")


@dataclass(frozen=True)
class Branches:
    """Where each draft token leads from a node of SLRS's tree (CrossVocabDrafter.branches)."""

    ends: np.ndarray  # [m] int64 draft ids after which the string stops growing
    ys: np.ndarray  # [m] int64 the target token each stopped string begins with (ys[j] for ends[j])
    grows: frozenset[int]  # draft ids after which the string is still a proper prefix of a target token
    end_of: dict[int, int]  # ends[j] -> ys[j]


class CrossVocabDrafter:
    """A draft model with its own tokenizer, proposing TARGET token ids by TLI, SLEM or SLRS (module docstring).

    speculative_sample(smollm2, stdlib_2l, "def f(x):", 40, cross_vocab="tli")  # makes one of these
    """

    def __init__(self, model, target, rule: str):
        assert rule in CROSS_VOCAB, f"unknown rule {rule!r}"
        self.model, self.rule, self.target_name = model, rule, target.name
        self.draft_tokenizer, self.target_tokenizer = model.tokenizer, target.tokenizer
        self.vocab = vocab_map(model.tokenizer, target.tokenizer, model.n_vocab, target.n_vocab)
        if not len(self.vocab.draft_ids):
            raise ValueError(
                f"the draft {model.name} and the target {target.name} share no token: no rule can use its drafts"
            )
        self.to_draft = dict(zip(self.vocab.target_ids.tolist(), self.vocab.draft_ids.tolist()))
        self.target_control = control_ids(target.tokenizer)
        self.target_names = target.tokenizer.special_tokens_set
        self.draft_control = {
            name: model.tokenizer.encode_single_token(name) for name in model.tokenizer.special_tokens_set
        }
        self.extendable = extendable(target.tokenizer, target.n_vocab) if rule != "tli" else frozenset()
        # What SLRS reads at every node of its tree (branches); empty for the other rules.
        slrs = rule == "slrs"
        self.target_tokens = ordinary_tokens(target.tokenizer, target.n_vocab) if slrs else {}
        self.longest = max(map(len, self.target_tokens), default=0)  # the longest target token, in bytes
        pieces = {i: b for b, i in ordinary_tokens(model.tokenizer, model.n_vocab).items()} if slrs else {}
        self.pieces = [pieces.get(x) for x in range(model.n_vocab)]  # [n_draft] bytes, None: not ordinary
        self.control_to_target = {
            x: target.tokenizer.encode_single_token(name)  # a control token, by its name
            for name, x in self.draft_control.items()
            if name in self.target_names
        }
        self.branching: dict[bytes, Branches] = {}  # string -> its branches, filled as SLRS meets strings
        self.n_vocab = target.n_vocab  # proposals are target ids
        self.n_ctx = None  # the draft's own limit is handled by a window (`context`)
        self.cache: KVCache = model.new_cache()
        self.cached: list[int] = []  # [cache.length] the draft tokens in self.cache, in order
        self.calls = 0

    def check(self, params: SamplingParams) -> None:
        """Refuse settings the rule cannot keep exact, or (SLRS sampling) cannot afford."""
        check_rule(self.rule, params)
        if self.rule == "slrs" and not params.greedy:
            draft, target = self.draft_tokenizer, self.target_tokenizer
            passes = tokenization_tree_size(draft, target, self.model.n_vocab, self.n_vocab, SLRS_MAX_PASSES)
            if passes > SLRS_MAX_PASSES:
                raise ValueError(
                    f"cross_vocab 'slrs' sums over every {self.model.name} tokenization of every "
                    f"{self.target_name} token: more than {SLRS_MAX_PASSES:,} draft passes per drafted "
                    "token (SLRS_MAX_PASSES) for these vocabularies; sample with 'tli', or run 'slrs' "
                    "at temperature 0"
                )

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
        new = self.sync(ids, k)
        if new is None:
            return Proposal.chain([])
        if self.rule == "slem":
            return self.propose_slem(new, k)
        if self.rule == "slrs":
            return self.propose_slrs(ids, new, k, params, rng)
        return self.propose_tli(new, k, params, rng)

    def sync(self, ids: list[int], k: int) -> list[int] | None:
        """Roll the draft's cache back to a boundary both tokenizations agree on: the longest prefix
        of the cached draft tokens that is also a prefix of the draft's encoding of the text ids
        (at least one token is left to feed, for its logits). The draft tokens to feed next; None
        when the draft's context is too short for k more tokens."""
        context = self.context(ids, k)
        if not context:
            return None
        n = min(common_prefix(self.cached, context), len(context) - 1)
        self.cache.rollback(n)
        self.cached = context[:n]
        return context[n:]

    def step(self, new: list[int]) -> np.ndarray:
        """Feed draft tokens; the last one's [n_draft] logits."""
        self.cached += new
        return self.look(new)

    def look(self, new: list[int]) -> np.ndarray:
        """Feed draft tokens without recording them (a branch SLRS rolls back); the last one's [n_draft] logits."""
        self.calls += 1
        return self.model.forward(new, self.cache, last_only=True)[0]

    def propose_tli(self, new: list[int], k: int, params: SamplingParams, rng) -> Proposal:
        """Token-level intersection (Timor et al.'s TLI).

        Draft step i: q_draft from the draft's logits (filtered like the target), then
            q_i(y) = q_draft(x) / sum_{x' shared} q_draft(x')   for y the target id of a shared x,
            q_i(y) = 0                                            for every other target token,
        and y_i is drawn from q_i; the draft then reads x (its own id for y_i).
        Why exact: q_i is a distribution over the target's vocabulary and y_i is drawn from it,
        given the earlier y's (the map is one-to-one, so the draft's tokens are a function of
        them). Leviathan et al.'s proof holds for ANY such q (verify/__init__.py's docstring): accept y_i
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

    def propose_slrs(self, ids: list[int], new: list[int], k: int, params: SamplingParams, rng) -> Proposal:
        """String-level rejection sampling (Timor et al.'s SLRS), in specdec's form.

        Draft step i, from the text so far (the accepted text and y_0 .. y_(i-1), re-spelt for
        the draft): the draft writes tokens x_1, x_2, ... from its own q; their bytes make a
        string s, and the draft stops as soon as s is not a proper prefix of any target token
        (s can no longer grow into a longer one). y_i is the longest target token s begins with.
        The probability of proposing y,

            q_i(y) = sum over draft paths x_1..x_m that stop on y of q(x_1) q(x_2 | x_1) ... q(x_m | x_1..x_(m-1)),

        is a sum over draft tokenizations: SmolLM2's " total" is reached through the stdlib
        BPE's " t" + "otal" + (a token that ends the growth), through " to" + "tal" + ..., and
        more. string_law computes the whole row by walking the tree of paths whose string is
        still a proper prefix of a target token (one draft pass per node); walk draws y_i by
        running the draft down one path of that same tree. Then the ordinary test against the
        target's p (verify/): accept y_i with min(1, p_i(y_i) / q_i(y_i)), else draw from
        norm(max(0, p_i - q_i)) over the full target vocabulary.

        Why exact: q_i is exactly the law y_i is drawn with, given the earlier y's (the draft's
        context is a function of them), and Leviathan et al.'s proof holds for any such q. A path
        that stops on no target token (a byte the target cannot spell, a control token it lacks)
        ends this round's drafting; given that it did not, y_i's law is q_i renormalised, the row
        reported. NOTE: the sum must take every path. Reporting one tokenization of y (the
        draft's own spelling of it) gives a q_i smaller than the law y_i is drawn from: the test
        accepts too often and the output is no longer p (tests/test_crossvocab.py). The paper
        states SLRS on strings; the stopping rule that makes the string one target token is
        specdec's, so that q_i is a row over the target's vocabulary and verify/ reads it as any.

        Cost: the tree has a node for every draft tokenization of every proper prefix of a target
        token (tokenization_tree_size): 3 for the tests' tiny pair, more than 10^12 for SmolLM2
        with the stdlib BPE (its single bytes spell a run of spaces in exponentially many ways),
        so sampling is refused above SLRS_MAX_PASSES. At temperature 0 only the draft's argmax
        path is walked (greedy verification never reads q): cheap with any vocabularies.
        """
        tokens, q_rows = [], []
        for i in range(k):
            if i:  # the text now ends in the drafted tokens: re-spell it for the draft
                new = self.sync([*ids, *tokens], k - i)
                if new is None:
                    break
            if params.greedy:
                y = self.greedy_walk(new)
            else:
                row, nodes = self.string_law(new, params)  # [n_target], {path: [n_draft]}
                y = self.walk(nodes, rng)
                if y is not None:
                    q_rows.append(row / row.sum())  # y's law given that the path stopped on a target token
            self.cache.rollback(len(self.cached))  # the tree's branches dropped: the cache holds the context
            if y is None:
                break
            tokens.append(y)
        return Proposal.chain(tokens, np.stack(q_rows) if q_rows else None)  # q: [n, n_target]

    def string_law(self, new: list[int], params: SamplingParams) -> tuple[np.ndarray, dict]:
        """SLRS's row after feeding `new`: [n_target] float32 q(y) summed over every draft path that
        stops on y, and the draft's [n_draft] q at every node of the tree, keyed by its path."""
        row = np.zeros(self.n_vocab, np.float32)  # [n_target]
        nodes: dict[tuple[int, ...], np.ndarray] = {}

        def expand(path: tuple[int, ...], logits: np.ndarray, s: bytes, mass: np.float32) -> None:
            q = probabilities(logits[None], params)[0]  # [n_draft], filtered like the target
            nodes[path] = q
            b = self.branches(s)
            np.add.at(row, b.ys, mass * q[b.ends])  # the string stops here, on ys
            length = self.cache.length
            for x in b.grows:  # the string may still become a longer target token: one node deeper
                if q[x] > 0:
                    expand((*path, x), self.look([x]), s + self.pieces[x], mass * q[x])
                    self.cache.rollback(length)

        expand((), self.step(new), b"", np.float32(1))
        return row, nodes

    def walk(self, nodes: dict, rng) -> int | None:
        """SLRS's draw: the draft writes tokens, each from its q at the node it has reached, until
        the string stops growing; the target token the string begins with (None: none does)."""
        path, s = (), b""
        while True:
            x = draw(nodes[path], rng)
            b = self.branches(s)
            if x not in b.grows:
                return b.end_of.get(x)
            path, s = (*path, x), s + self.pieces[x]

    def greedy_walk(self, new: list[int]) -> int | None:
        """SLRS at temperature 0: the draft's argmax tokens until the string stops growing."""
        logits, s = self.step(new), b""
        while True:
            x = int(np.argmax(logits))
            b = self.branches(s)
            if x not in b.grows:
                return b.end_of.get(x)
            logits, s = self.look([x]), s + self.pieces[x]

    def branches(self, s: bytes) -> Branches:
        """Where each draft token x leads from a node whose string is s (once per string).

        s + x still a proper prefix of a target token: the string grows (a node one deeper).
        Otherwise it stops, on the longest target token it begins with; a control token stops it
        at s (at an empty s: on the target's control token of the same name). A stop on no target
        token (a byte the target cannot spell, a control token it lacks) is in neither set.
        """
        if s not in self.branching:
            control = set(self.draft_control.values())
            ends, ys, grows = [], [], set()
            for x, piece in enumerate(self.pieces):
                if piece is not None and s + piece in self.extendable:
                    grows.add(x)
                    continue
                if piece is not None:
                    y = longest_token(s + piece, self.target_tokens, self.longest)
                elif x in control:
                    y = longest_token(s, self.target_tokens, self.longest) if s else self.control_to_target.get(x)
                else:  # an id with no token
                    y = None
                if y is not None:
                    ends.append(x)
                    ys.append(y)
            self.branching[s] = Branches(
                np.array(ends, np.int64), np.array(ys, np.int64), frozenset(grows), dict(zip(ends, ys))
            )
        return self.branching[s]

    def commit(self, ids, features) -> None:
        pass  # the next propose re-encodes the accepted text and rolls the cache back to agree with it
