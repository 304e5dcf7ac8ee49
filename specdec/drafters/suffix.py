"""Suffix decoding: drafts copied from what was already written, as many tokens as the evidence pays for.

What it adds over prompt lookup (NgramDrafter: the latest occurrence of the last 3 tokens, a fixed K):
every earlier occurrence of the LONGEST suffix of the text that occurred before, merged into a tree of
continuations scored by how often each followed; earlier outputs and a datastore as further places to look;
and a size chosen each round by expected gain against the measured r(m), so that a round drafts nothing
where the evidence is weak and up to 32 tokens where the text is repeating. SuffixDecoding (Oliaro et al.,
arXiv 2411.04975; vLLM's `method="suffix"`) keeps suffix trees over the prompt and output so far and over
earlier outputs, and grows a speculation tree best-first by empirical probability; REST (He et al., arXiv
2311.08252) retrieves continuations from a datastore's suffix array (drafters/datastore.py).

Three sources answer the same question ("where did the text's tail occur before, and what followed?"):
    "text"      the request's own text, prompt and output so far (a SuffixIndex of one document)
    "earlier"   the outputs of earlier runs, or of a batch's other rows, that share one SuffixIndex
                (bounded: EARLIER_CAPACITY tokens, the oldest outputs evicted first)
    "datastore" a suffix array over a corpus of the target's own replies (datastore.py), read only
                where the other two propose nothing

One round, from the text ids so far:
  1. match: the longest suffix of ids (m tokens, 2 <= m <= MAX_MATCH) that occurred before in a source,
     and the positions where those occurrences end (the latest MAX_ENDS of them).
  2. candidates: what followed each occurrence, merged into a trie. A node v reached by f_v of its
     parent's occurrences gets
         P(v) = P(parent) * a(L_v) * f_v,     P(root) = 1,
     L_v the tokens of context that matched before v (m, plus v's depth - 1: once its ancestors are
     accepted, the match is that much longer), a(L) how often a candidate with L tokens of matched
     context was the next token (Calibration, learned from the text as it arrives). The trie is grown
     best-first by P, as SuffixDecoding grows its speculation tree (section 4), down to MIN_PROB.
  3. size: costmodel.best_size picks n, the candidates that maximise (1 + P_1 + .. + P_n) / r(n + 1);
     n = 0 proposes nothing (the round is a plain target step).
  4. proposal: the n best nodes as a tree (a chain, the likeliest path, when asked for a chain), each
     a point mass.

Where this differs from SuffixDecoding: (a) the structure is a pair index walked backwards (SuffixIndex,
suffix_index.py), not a suffix tree; it finds the longest match only, where the paper scores every match
length and keeps the best; (b) the paper's budget, factor x match length (capped), and its fixed floor 0.1
on the path probability are replaced by a(L), learned per context length, and the size that maximises
expected tokens per unit of r(m); the match length still sets the size, through a(L); (c) a match is also
judged by how common its last two tokens are in the target's own replies (the datastore): a pair they never
hold starts from a more trusting prior, as a rare phrase recurring is more often a copy than chance.

Exactness: the candidates are fixed tokens chosen from the text so far and from past rounds' outcomes,
before this round draws anything, so each one's q is a point mass and the rules of verify/ keep the
output exactly p: SpecInfer's multi-candidate rule (verify.sampled_tree) accepts a child x with
probability r(x) and, on rejection, zeroes x in the residual r before the next sibling; for a chain,
the token-wise rule or block verification (verify.block_chain), exact for any chain drawn from its q.
SpecTr's rule (verification="spectr") needs siblings drawn i.i.d. from one q, which these are not.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..costmodel.chain import K_LIMIT
from ..costmodel.sizing import SMOLLM2_CPU_R, best_size, curve_values
from ..interfaces import Proposal
from .suffix_index import MAX_MATCH, MIN_MATCH, SuffixIndex, copied_on

MIN_PROB = 0.1  # candidates less likely than this are not grown (SuffixDecoding's min_token_prob)
# a(L)'s prior is L / (L + offset): 2 for a match in the text or earlier outputs; 1 where the text's last two
# tokens never occur together in the datastore (measured on the request's own text: such a match is more often
# a copy than chance; earlier outputs follow the same rule); 8 for the datastore, whose long matches in free text
# are stock phrases another reply went on from differently. Chosen on the chat tasks' rounds priced
# (docs/suffix.md, "Settings tried"), checked on requests written after.
PRIOR_OFFSET, RARE_PRIOR_OFFSET, DATASTORE_PRIOR_OFFSET = 2.0, 1.0, 8.0
# When the target samples, a copied token is accepted with probability p(x), under 1 even where the target
# would copy: a match in the text or earlier outputs starts from L / (L + 4), rare pair or not (the datastore's
# stays 8). On the chat tasks at temperature 1 (6 free requests x 2 seeds, priced), every free run came to 0.99x
# or above on SmolLM2's curve (0.96x with the greedy priors) at the same copy median, though a lower copy mean
# (1.09x against 1.13x), and better on both on a cheaper curve (docs/suffix.md, "Settings tried"). Measured at
# T = 1 only: it applies at any temperature above 0.
SAMPLED_PRIOR_OFFSET = 4.0
EARLIER_CAPACITY = 1 << 16  # tokens of earlier outputs kept (about 2 MB of arrays; 250 replies of 256 tokens)


class Calibration:
    """a(L): how often a candidate with L tokens of matched context before it was the next token of the text.

    Read per bucket of L (1, 2-3, 4-7, .., 32-63, 64+: powers of two) from decayed counts:
        a(L) = (hits + w0 * a0(L)) / (support + w0)
    each scored candidate adding its frequency f to `support` and 1 to `hits` when it was right, as a
    candidate followed by a share f of its parent's occurrences is expected right a(L) * f of the time.
    The prior a0(L) = L / (L + offset) (at the bucket's smallest L; offset 2: 1/3 after one matching token,
    0.8 after 8; a second offset, sampled_offset, when the target samples), weighted as w0 = 4 scored
    candidates, is a guess that a few rounds override (on SmolLM2's chat requests w0 = 4 drafted a little
    better than 2: docs/suffix.md); each count decays by `decay` per update of its bucket, so a stretch of
    copying raises a(L) and free text lowers it again. The scoring needs no drafting: every round's likeliest
    path is checked against the tokens that arrive (SuffixDrafter.commit), and at any temperature the chance a
    point-mass candidate x is accepted is p(x), the chance x is the token emitted.
    """

    N_BUCKETS = 7

    def __init__(
        self,
        prior_weight: float = 4.0,
        decay: float = 0.95,
        prior_offset: float = PRIOR_OFFSET,
        sampled_offset: float | None = None,
    ):
        self.prior_weight, self.decay = prior_weight, decay
        self.greedy_offset = prior_offset  # the prior's offset when the target decodes greedily
        self.sampled_offset = prior_offset if sampled_offset is None else sampled_offset  # when it samples
        self.sampling = False  # which of the two the rounds use: set by the drafter from each round's settings
        self.hits = [0.0] * self.N_BUCKETS  # [bucket] decayed count of candidates that were right
        self.support = [0.0] * self.N_BUCKETS  # [bucket] decayed sum of the scored candidates' f

    @property
    def prior_offset(self) -> float:
        return self.sampled_offset if self.sampling else self.greedy_offset

    @classmethod
    def bucket(cls, context: int) -> int:
        return min(max(context, 1).bit_length() - 1, cls.N_BUCKETS - 1)

    def rate(self, context: int) -> float:
        b = self.bucket(context)
        smallest = 1 << b
        prior = smallest / (smallest + self.prior_offset)
        return (self.hits[b] + self.prior_weight * prior) / (self.support[b] + self.prior_weight)

    def chance(self, context: int, f: float) -> float:
        """The estimated chance a candidate followed by a share f of its parent's occurrences is accepted."""
        return min(0.99, self.rate(context) * f)

    def chances(self) -> Callable[[int, float], float]:
        """`chance` with a(L) read once for every bucket (a round asks it for every candidate)."""
        rates = [self.rate(1 << b) for b in range(self.N_BUCKETS)]
        last = self.N_BUCKETS - 1
        return lambda context, f: min(0.99, rates[min(max(context, 1).bit_length() - 1, last)] * f)

    def update(self, context: int, f: float, hit: bool) -> None:
        b = self.bucket(context)
        self.hits[b] = self.decay * self.hits[b] + hit
        self.support[b] = self.decay * self.support[b] + f


@dataclass
class Candidates:
    """A trie of candidate continuations, best first: P never increases down the list, parents come first."""

    tokens: list[int] = field(default_factory=list)  # [n]
    parents: list[int] = field(default_factory=list)  # [n] -1: follows the text's last token
    probs: list[float] = field(default_factory=list)  # [n] P(v): estimated chance v is on the accepted path
    contexts: list[int] = field(default_factory=list)  # [n] L_v: tokens of matched context before v
    freqs: list[float] = field(default_factory=list)  # [n] f_v: share of its parent's occurrences through v

    def __len__(self) -> int:
        return len(self.tokens)

    def top_path(self) -> list[int]:
        """The likeliest path: from the root, each node's first (likeliest) child, as node indices."""
        path, parent = [], -1
        for i, p in enumerate(self.parents):
            if p == parent:
                path.append(i)
                parent = i
        return path


def grow_candidates(
    rows: np.ndarray,
    m: int,
    chance: Callable[[int, float], float],
    n_max: int,
    chain: bool = False,
    min_prob: float = MIN_PROB,
) -> Candidates:
    """Merge continuations into a trie and keep its best n_max nodes, grown best-first by P (see the module).

    rows: [n_ends, depth] what followed each occurrence of the match (-1 past what is known), the most
    recent occurrence last; m: the match's length; chance(L, f): a candidate's chance to be accepted given
    its parent was (Calibration.chance). chain: only each node's likeliest child (a chain). A node's
    children are ranked by count, the most recent occurrence first among equals; f counts every occurrence
    of the parent, those whose continuation is unknown too.

    >>> trie = grow_candidates(np.array([[7, 8], [7, 9], [7, 8]]), 4, lambda L, f: f, 3)
    >>> trie.tokens, trie.parents, [round(p, 2) for p in trie.probs]
    ([7, 8, 9], [-1, 0, 0], [1.0, 0.67, 0.33])
    """
    table = rows.tolist()  # [n_ends][depth] Python ints: the trie is grown a few nodes at a time
    depth = rows.shape[1] if rows.ndim == 2 else 0
    out = Candidates()
    heap: list = []  # (-P, order pushed, parent index, occurrences through it, its column, token, f)
    order = itertools.count()

    def expand(parent: int, members: list[int], column: int, p: float) -> None:
        """Push the children of a node (its occurrences `members`, latest first) at this column."""
        if column >= depth:
            return
        if len(members) == 1:  # one occurrence: one child, if its continuation is known (most rounds of a copy)
            ranked = [(table[members[0]][column], members)] if table[members[0]][column] >= 0 else []
        else:
            children: dict[int, list[int]] = {}
            for i in members:
                children.setdefault(table[i][column], []).append(i)  # insertion order: latest first
            ranked = sorted(((t, ms) for t, ms in children.items() if t >= 0), key=lambda kv: -len(kv[1]))
        for token, through in ranked[:1] if chain else ranked:
            f = len(through) / len(members)
            p_child = p * chance(m + column, f)
            if p_child >= min_prob:
                heapq.heappush(heap, (-p_child, next(order), parent, through, column + 1, token, f))

    expand(-1, list(range(len(table) - 1, -1, -1)), 0, 1.0)
    while heap and len(out) < n_max:
        neg_p, _, parent, through, column, token, f = heapq.heappop(heap)
        out.tokens.append(token)
        out.parents.append(parent)
        out.probs.append(-neg_p)
        out.contexts.append(m + column - 1)
        out.freqs.append(f)
        expand(len(out) - 1, through, column, -neg_p)
    return out


@dataclass
class _Prediction:
    """A source's likeliest path, made when ids had `start` tokens: scored against the tokens that follow."""

    start: int
    calibration: Calibration  # the a(L) it scores
    tokens: list[int]
    contexts: list[int]
    freqs: list[float]


class SuffixDrafter:
    """Suffix decoding: drafts from the request's own text, earlier outputs and a datastore (see the module).

        SuffixDrafter(target.n_vocab)                                   # the text alone
        SuffixDrafter(target.n_vocab, earlier=SuffixIndex(EARLIER_CAPACITY), datastore=Datastore.load(d, 49152))
        # what draft="suffix:d" builds (drafters.suffix_drafter)
        speculative_sample(target, drafter, ids, 200, K=32, tree=32)   # K and tree: the most it may draft

    earlier: an index shared by the runs whose outputs should be read (a chat's turns, a benchmark's
    requests, a batch's rows: `fresh` shares it); the drafter adds its own output there as it is accepted,
    and never reads the outputs of runs with the same prompt (a repeat of one request would otherwise
    copy its own earlier answer: a cache hit in a server, not a measurement). datastore: datastore.Datastore.
    r: the target's verification curve the size is priced with (a list r[m-1], {m: r(m)} or a function;
    None: a run sets the target's, timed once per process, and SMOLLM2_CPU_R prices rounds until then). cap: the most
    tokens a round drafts, also bounded by the round's k (chain depth) and nodes (tree size).
    """

    SOURCES = ("text", "earlier", "datastore")
    k_default = K_LIMIT  # a run's K when none is given: it sizes its own rounds, up to the most a round may verify

    def __init__(self, n_vocab: int, earlier: SuffixIndex | None = None, datastore=None, r=None, cap: int = K_LIMIT):
        if not 1 <= cap <= K_LIMIT:
            raise ValueError(f"the suffix drafter's cap must be in 1..{K_LIMIT} tokens, got {cap}")
        if datastore is not None and datastore.n_vocab != n_vocab:
            raise ValueError(
                f"the datastore holds ids of a {datastore.n_vocab}-token vocabulary, the target has {n_vocab}: "
                "build one from this target's replies"
            )
        self.n_vocab = n_vocab
        self.n_ctx = None  # no context limit of its own
        self.calls = 0  # it makes no forward passes
        self.earlier, self.datastore, self.cap = earlier, datastore, cap
        self.r = r
        sampled = SAMPLED_PRIOR_OFFSET
        self.calibration = {  # a(L) per source, and for the text's and earlier outputs' matches of a rare pair
            "text": Calibration(sampled_offset=sampled),
            "earlier": Calibration(sampled_offset=sampled),
            "datastore": Calibration(prior_offset=DATASTORE_PRIOR_OFFSET),
            "text, rare pair": Calibration(prior_offset=RARE_PRIOR_OFFSET, sampled_offset=sampled),
            "earlier, rare pair": Calibration(prior_offset=RARE_PRIOR_OFFSET, sampled_offset=sampled),
        }
        self.proposed: Counter = Counter()  # rounds that drafted, by source
        self.text = SuffixIndex()  # the request's own text (set by begin)
        self.text_doc = self.text.start()
        self.n_prompt, self.key, self.output_doc = 0, 0, None
        self.pending: dict[str, _Prediction] = {}

    @property
    def r(self):
        """The verification curve rounds are priced with; None until given, when SMOLLM2_CPU_R prices them (and a
        run times the target's: config.setup). Setting it reads r(1) .. r(K_LIMIT + 1) once."""
        return self._r

    @r.setter
    def r(self, r) -> None:
        self._r = r
        self._r_values = curve_values(SMOLLM2_CPU_R if r is None else r, K_LIMIT + 1)  # [K_LIMIT + 1] r(1) ..

    def fresh(self) -> SuffixDrafter:
        """A drafter for another sequence (a batch gives each row one): the same earlier outputs and datastore."""
        return SuffixDrafter(self.n_vocab, self.earlier, self.datastore, self.r, self.cap)

    def begin(self, target, cache, prompt: list[int]) -> None:
        self.text = SuffixIndex()
        self.text_doc = self.text.start()
        self.n_prompt, self.key = len(prompt), hash(tuple(prompt))
        self.output_doc = None  # made in `earlier` at the first output token
        self.pending = {}
        self._catch_up(prompt)

    def commit(self, ids: list[int], features) -> None:
        self._score(ids)
        self._catch_up(ids)

    def _catch_up(self, ids: list[int]) -> None:
        """Index the tokens of ids not indexed yet; output tokens go to the earlier outputs too."""
        start = len(self.text)
        assert start <= len(ids), f"the text shrank from {start} to {len(ids)} tokens"
        for i in range(start, len(ids)):
            self.text.append(self.text_doc, ids[i])
            if self.earlier is not None and i >= self.n_prompt:
                if self.output_doc is None:
                    self.output_doc = self.earlier.start(self.key)
                self.earlier.append(self.output_doc, ids[i])

    def _score(self, ids: list[int]) -> None:
        """Check each source's last likeliest path against the tokens that arrived since, and learn a(L)."""
        for guess in self.pending.values():
            for token, context, f, actual in zip(guess.tokens, guess.contexts, guess.freqs, ids[guess.start :]):
                guess.calibration.update(context, f, actual == token)
                if actual != token:
                    break
        self.pending = {}

    def lookup(self, source: str, tail: list[int], depth: int) -> tuple[int, np.ndarray]:
        """(m, rows): a source's longest match of the text's tail and what followed its occurrences, or (0, None)."""
        if source == "text":
            # One document that evicts nothing: its positions are the text's, its arena the text itself.
            text = self.text.tokens[: len(self.text)]
            m, ends = self.text.longest_match(tail, before=len(text) - 1)
            return m, copied_on(text, ends, depth) if m else None
        index = self.earlier if source == "earlier" else self.datastore
        if index is None:
            return 0, None
        m, ends = index.longest_match(tail, skip_key=self.key) if source == "earlier" else index.longest_match(tail)
        return m, index.continuations(ends, depth) if m else None

    def candidates(self, ids: list[int], depth: int, n_max: int, chain: bool) -> dict[str, tuple]:
        """{source: (its candidates, the size n that pays best, speedup(n))}; the datastore only where no other
        source drafts. Each source's likeliest path is kept, to be scored against the tokens that arrive.

        A match in the text or earlier outputs is judged by the a(L) of matches of a rare pair where the text's
        last two tokens never occur together in the datastore (the target's own replies): by chance such a pair
        seldom recurs, so its match is more often a copy under way."""
        tail = list(ids[-MAX_MATCH:])
        rare = None  # read once, at the first match
        found = {}
        for source in self.SOURCES:
            if source == "datastore" and any(n for _, n, _ in found.values()):
                break
            m, rows = self.lookup(source, tail, depth)
            if not m:
                continue
            if rare is None:  # the first source with a match: is the text's last pair one the datastore never saw?
                rare = self.datastore is not None and self.datastore.count(tail[-2:]) == 0
            calibration = self.calibration[f"{source}, rare pair" if rare else source]  # (the datastore: never rare)
            trie = grow_candidates(rows, m, calibration.chances(), n_max, chain)
            path = trie.top_path()
            tokens, contexts, freqs = ([getattr(trie, a)[i] for i in path] for a in ("tokens", "contexts", "freqs"))
            self.pending[source] = _Prediction(len(ids), calibration, tokens, contexts, freqs)
            found[source] = (trie, *best_size(trie.probs, self._r_values, n_max))
        return found

    def propose(self, ids, k, params, rng, nodes=None) -> Proposal:
        self._catch_up(ids)
        for calibration in self.calibration.values():  # a sampling target: the text's priors doubt more
            calibration.sampling = not params.greedy
        depth = min(k, self.cap)
        n_max = depth if nodes is None else min(nodes, self.cap)
        if depth < 1 or n_max < 1 or len(ids) < MIN_MATCH:
            return Proposal.chain([])
        found = self.candidates(ids, depth, n_max, chain=nodes is None)
        best, best_speedup = None, 1.0  # plain decoding
        for source, (_, n, speedup) in found.items():
            if n and speedup > best_speedup:
                best, best_speedup = source, speedup
        if best is None:
            return Proposal.chain([])
        trie, n, _ = found[best]
        self.proposed[best] += 1
        tokens, parents = trie.tokens[:n], trie.parents[:n]
        if params.greedy:
            return Proposal(tokens, parents)  # greedy verification never reads q
        q = np.zeros((n, self.n_vocab), np.float32)  # [n, n_vocab] a point mass on each candidate
        q[np.arange(n), tokens] = 1
        return Proposal(tokens, parents, q)
