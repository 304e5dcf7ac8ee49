"""The cost model of speculative decoding (Leviathan et al., arXiv 2211.17192, section 3),
the K policies that decide how many tokens to draft each round, and the same for trees.

Pure arithmetic, shared by the timing harness, the benchmark and `--K auto`.
K policies (the KPolicy interface of interfaces.py): FixedK, AdaptiveK, CostModelK, made from
the K spec a user types by make_k_policy. Trees: TreeAcceptance, tree_tau, TreePolicy (below).

Notation (times are in units of one 1-token target forward step):
    alpha  acceptance rate: the chance a draft token is accepted, taken as the
           same i.i.d. chance at every position (the paper's simplifying assumption)
    k      draft tokens per round (the paper's gamma)
    c      cost of one draft step relative to one target step
    r(m)   cost of one target pass over m new tokens relative to one 1-token
           step. The paper assumes r(k+1) = 1 (a GPU has idle compute, so the
           verification pass is as fast as one step). On a CPU it is not:
           measure it (specdec.bench) and pass the curve in.
"""

from __future__ import annotations

import heapq
import numbers
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .interfaces import KPolicy
from .verify import children_of

K_LIMIT = 32  # the most drafts a round may ask for: a verification pass over 33 tokens is far past any gain
K_NAMES = ("adaptive", "auto")


def drafts_judged(k: int, n_accepted: int) -> int:
    """Drafts a round actually tested: up to and including the first rejection.

    A round that accepts all k judged k; one that rejects at position n judged
    n + 1, and the drafts after it were dropped unjudged. Estimating alpha as
    accepted / judged (not accepted / drafted) is what matches the i.i.d. model
    behind expected_tokens_per_round.
    """
    return k if n_accepted == k else n_accepted + 1


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """E[tokens emitted per round] = (1 - alpha^(k+1)) / (1 - alpha)  (Leviathan et al., section 3, eq. 1).

    A round emits the accepted drafts plus one target token: 1 + alpha + ... + alpha^k.

        expected_tokens_per_round(0.8, 4)  # 3.36
    """
    if alpha >= 1:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def round_cost(k: int, c: float, r: Callable[[int], float] | Sequence[float] | None = None) -> float:
    """Time of one round in target steps: k draft steps plus one verification pass over k+1 tokens."""
    return k * c + verify_cost(k + 1, r)


def verify_cost(m: float, r: Callable[[int], float] | Sequence[float] | None = None) -> float:
    """r(m), from a function, a measured list (r[m-1] for m = 1, 2, ...), or the paper's r = 1.

    A list is read linearly between its points (m may be a mean, 4.5 tokens a pass) and grows
    linearly beyond its end: the one reading of a measured curve everywhere (predictions, the race).
    """
    if r is None:
        return 1.0
    if callable(r):
        return r(m)
    if m > len(r):
        return r[-1] * m / len(r)
    i = int(m)  # the measured point at or below m (m >= 1)
    return r[i - 1] if i == m else r[i - 1] + (m - i) * (r[i] - r[i - 1])


def predicted_speedup(alpha: float, k: int, c: float, r=None) -> float:
    """Expected wall-time speedup over autoregressive decoding (Leviathan et al., section 3,
    "Walltime Improvement", when r = 1): tokens per round divided by the round's cost in target steps.

        predicted_speedup(0.8, 4, c=0.05)                 # 2.80: the paper's r = 1
        predicted_speedup(0.8, 4, c=0.05, r=costs.r)      # with a measured r(m) (timing.measure_costs)
    """
    return expected_tokens_per_round(alpha, k) / round_cost(k, c, r)


def speedup_from_rounds(n_tokens: int, k_per_round: Sequence[int], draft_steps: float, c: float, r=None) -> float:
    """The speedup a run's own rounds predict: n_tokens / (draft_steps * c + sum of r(k + 1) over the rounds).

    Eq. 1 (predicted_speedup) assumes every round drafts k tokens, each accepted
    with the same i.i.d. chance alpha; a real run's rounds vary (the n-gram
    drafter drafts nothing where the text has no match, and acceptances come in
    runs). This counts what the run did and prices it with the measured c and
    r(m): what is left between it and the wall clock is time the model does not
    describe (the sampler's own work) and noise.

        speedup_from_rounds(len(out.tokens), out.k_per_round, out.draft_steps, costs.c, costs.r)
    """
    steps = draft_steps * c + sum(verify_cost(k + 1, r) for k in k_per_round)
    return n_tokens / steps if steps else float("nan")


def best_k(alpha: float, c: float, r=None, k_max: int = 8) -> tuple[int, float]:
    """The k in 1..k_max with the highest predicted speedup (the paper's optimal gamma,
    section 3, "Choosing gamma"), and that speedup. Returns (0, 1.0) when no k beats plain decoding.

        best_k(0.9, c=0.05)   # (8, 4.38): cheap drafts, high acceptance, long drafts
    """
    best = max(range(1, k_max + 1), key=lambda k: predicted_speedup(alpha, k, c, r))
    speedup = predicted_speedup(alpha, best, c, r)
    return (best, speedup) if speedup > 1 else (0, 1.0)


@dataclass
class FixedK:
    """The papers' setting: k drafts every round. speculative_sample(..., K=4) means FixedK(4)."""

    k: int

    def __post_init__(self):
        if not isinstance(self.k, (int, np.integer)) or isinstance(self.k, bool) or self.k < 1:
            raise ValueError(f"K (draft tokens per round) must be an integer >= 1, got {self.k!r}")
        self.k = int(self.k)

    @property
    def k_max(self) -> int:
        return self.k

    def next_k(self) -> int:
        return self.k

    def update(self, k: int, n_accepted: int) -> None:
        """Nothing to learn: k stays."""


class AdaptiveK:
    """Grow K by one after a round whose drafts were all accepted; shrink it by one
    after a rejection; always within [k_min, k_max]. A simple heuristic: long
    runs of agreement (repetitive text, an easy stretch) earn longer drafts.

        speculative_sample(target, draft, ids, 40, K=AdaptiveK(k_start=4, k_min=1, k_max=8))
    """

    def __init__(self, k_start: int = 4, k_min: int = 1, k_max: int = 8):
        if not 1 <= k_min <= k_start <= k_max:
            raise ValueError(f"adaptive K needs 1 <= k_min <= K <= k_max, got {k_min}, {k_start}, {k_max}")
        self.k, self.k_min, self.k_max = k_start, k_min, k_max

    def next_k(self) -> int:
        return self.k

    def update(self, k: int, n_accepted: int) -> None:
        if n_accepted == k:
            self.k = min(self.k_max, self.k + 1)
        else:
            self.k = max(self.k_min, self.k - 1)


class CostModelK:
    """A K policy for speculative_sample (`--K auto`): before each round, pick the k
    with the best predicted speedup for the measured costs and the acceptance
    rate seen recently.

    The acceptance estimate is a decaying average over judged drafts (memory of
    about 1 / (1 - decay) rounds), so it follows the text: a repetitive stretch
    earns long drafts, a hard one short drafts. It starts from `prior_alpha`,
    weighted as `prior_weight` drafts. k never drops below 1: with no drafting
    there would be nothing left to learn the acceptance rate from.

        costs = measure_costs(target, draft, ids)
        speculative_sample(target, draft, ids, 40, K=CostModelK(costs.c, costs.r))   # or K="auto"
    """

    def __init__(
        self, c: float, r=None, k_max: int = 8, prior_alpha: float = 0.6, prior_weight: float = 8.0, decay: float = 0.9
    ):
        if not (0 <= prior_alpha <= 1 and c >= 0 and k_max >= 1 and 0 < decay <= 1):
            raise ValueError("CostModelK needs 0 <= prior_alpha <= 1, c >= 0, k_max >= 1 and 0 < decay <= 1")
        self.c, self.r, self.k_max, self.decay, self.prior_alpha = c, r, k_max, decay, prior_alpha
        self.accepted, self.judged = prior_alpha * prior_weight, prior_weight

    @property
    def alpha(self) -> float:
        return self.accepted / self.judged

    def next_k(self) -> int:
        return max(1, best_k(self.alpha, self.c, self.r, self.k_max)[0])

    def update(self, k: int, n_accepted: int) -> None:
        self.accepted = self.decay * self.accepted + n_accepted
        self.judged = self.decay * self.judged + drafts_judged(k, n_accepted)


def parse_k(spec) -> int | str:
    """An int in 1..K_LIMIT, "adaptive" or "auto", from a string, an int or a NumPy int.

    >>> parse_k("4"), parse_k(6), parse_k("auto")
    (4, 6, 'auto')
    """
    if isinstance(spec, str):
        if spec in K_NAMES:
            return spec
        spec = int(spec) if spec.strip().lstrip("-").isdigit() else spec
    if isinstance(spec, bool) or not isinstance(spec, numbers.Integral):
        raise ValueError(f"K must be an integer >= 1, 'adaptive' or 'auto', not {spec!r}")
    if spec < 1:
        raise ValueError(f"K must be at least 1 (it is the number of draft tokens per round), got {spec}")
    if spec > K_LIMIT:
        raise ValueError(f"K must be at most {K_LIMIT} (a verification pass over K+1 tokens), got {spec}")
    return int(spec)


def make_k_policy(spec, k_max: int = 8, costs: Callable | None = None) -> KPolicy:
    """A fresh K policy for one run.

    spec: an int (FixedK), "adaptive" (AdaptiveK from min(4, k_max) within 1..k_max),
    "auto" (CostModelK: best predicted speedup for the measured costs and the running
    acceptance rate; `costs()` is called to measure them), or a KPolicy, used as it is.
    """
    if isinstance(spec, KPolicy):
        return spec
    spec = parse_k(spec)
    if not 1 <= k_max <= K_LIMIT:
        raise ValueError(f"k_max must be in 1..{K_LIMIT}, got {k_max}")
    if spec == "adaptive":
        return AdaptiveK(min(4, k_max), 1, k_max)
    if spec == "auto":
        if costs is None:
            raise ValueError("K='auto' needs measured costs (c, r): pass costs=, or use race(), which measures them")
        measured = costs()
        return CostModelK(measured.c, measured.r, k_max=k_max)
    return FixedK(spec)


# ---------------------------------------------------------------------------
# Trees
# ---------------------------------------------------------------------------
# The cost model for trees: expected tokens per target pass, and the node budget that pays.
#
# What this adds over the chain model above (one acceptance rate alpha): a tree
# spends N draft nodes on several candidates per position, and one target pass
# over N + 1 tokens costs r(N + 1) steps, which on a CPU grows with N (r(5) is
# about 2, r(9) about 2.8 for GPT-2 124M here). Whether a wider tree pays
# depends on how often the second, third ... candidate is the one accepted.
#
# Acceptance by position (Sequoia, Chen et al., arXiv 2402.12374, section 3, makes
# the same "positional acceptance" assumption):
#     a[d, j]  the chance that, at depth d, the candidate of rank j (0 = tested
#              first) is accepted, given that the path reached its parent and
#              candidates 0 .. j-1 were rejected.
# A node of depth d and rank j is on the accepted path with probability
#     P(node) = P(parent) * (1 - a[d, 0]) * ... * (1 - a[d, j-1]) * a[d, j],   P(root) = 1,
# and since a round emits its accepted path plus one target token,
#     tau = E[tokens per target pass] = 1 + sum over nodes of P(node).
# For a chain, a[d, 0] = alpha for all d gives 1 + alpha + .. + alpha^k, the
# chain formula (expected_tokens_per_round above).
#
# Speed: a round drafts (cost `draft_cost(n)` in target steps) and verifies n + 1
# tokens (r(n + 1)), so the predicted speedup over plain decoding is
#     tau(n) / (draft_cost(n) + r(n + 1)).


class TreeAcceptance:
    """Online estimate of a[d, j] from verified rounds: decaying counts per (depth, rank).

    Counts forget with `decay` per update, like CostModelK, so the
    estimate follows the text. A cell seen rarely borrows from its neighbour,
    weighted as `prior_weight` trials: depth d from depth d - 1 at the same
    rank, and at the first depth rank j from half of rank j - 1 (later
    candidates are usually worse), starting from `prior` for the first
    candidate. So a policy that has only drafted short trees still predicts
    deeper ones from what it saw, rather than from a fixed guess it can never
    correct without trying.
    """

    def __init__(self, max_depth: int = 16, max_rank: int = 16, prior: float = 0.6, prior_weight: float = 2.0,
                 decay: float = 0.95):  # fmt: skip
        if not (0 <= prior <= 1 and prior_weight > 0 and 0 < decay <= 1):
            raise ValueError("TreeAcceptance needs 0 <= prior <= 1, prior_weight > 0 and 0 < decay <= 1")
        self.prior, self.prior_weight, self.decay = prior, prior_weight, decay
        self.trials = np.zeros((max_depth, max_rank))  # [depth, rank] candidates tested (decayed)
        self.hits = np.zeros((max_depth, max_rank))  # [depth, rank] of which accepted

    @property
    def rates(self) -> np.ndarray:
        """a[d, j], [max_depth, max_rank]: (hits + w * neighbour) / (trials + w)."""
        rates = np.zeros_like(self.trials)
        w = self.prior_weight
        for d in range(rates.shape[0]):
            for j in range(rates.shape[1]):
                borrowed = rates[d - 1, j] if d else (0.5 * rates[0, j - 1] if j else self.prior)
                rates[d, j] = (self.hits[d, j] + w * borrowed) / (self.trials[d, j] + w)
        return rates

    def update(self, parents: list[int], path: list[int]) -> None:
        """Count one verified tree: at every node the path reached, each child tested and whether it was accepted."""
        self.trials *= self.decay
        self.hits *= self.decay
        children = children_of(parents)
        max_depth, max_rank = self.trials.shape
        for depth, node in enumerate([-1, *path][:max_depth]):
            accepted = path[depth] if depth < len(path) else None
            for rank, child in enumerate(children[node + 1][:max_rank]):
                self.trials[depth, rank] += 1
                if child == accepted:
                    self.hits[depth, rank] += 1
                    break

    def node_probabilities(self, parents: list[int]) -> np.ndarray:
        """P(node on the accepted path) for every node of a tree (the formula in the module docstring).  [n]"""
        a = self.rates
        children = children_of(parents)
        reach = np.zeros(len(parents))
        depth = np.zeros(len(parents), dtype=int)
        for parent_row, kids in enumerate(children):  # parents come first, so P(parent) is known
            parent = parent_row - 1
            d = depth[parent] + 1 if parent >= 0 else 0
            rest = reach[parent] if parent >= 0 else 1.0  # P(parent reached, earlier siblings rejected)
            for rank, child in enumerate(kids):
                rate = a[min(d, a.shape[0] - 1), min(rank, a.shape[1] - 1)]
                reach[child], depth[child] = rest * rate, d
                rest *= 1 - rate
        return reach

    def expected_tokens(self, parents: list[int]) -> float:
        """tau for a given tree: 1 + sum of P(node)."""
        return 1.0 + float(self.node_probabilities(parents).sum())

    def best_trees(self, n_max: int) -> tuple[list[float], list[int]]:
        """tau(n) and depth(n) of the best trees of n = 0 .. n_max nodes, grown greedily.

        Start from the root; repeatedly add the candidate node with the highest
        P(node): the next untried rank under a node already in the tree, or the
        first child of one. (A greedy stand-in for Sequoia's dynamic program.)
        """
        a = self.rates
        max_depth, max_rank = a.shape
        taus, depths = [1.0], [0]
        # Candidates: (-P(node), depth, rank, P(parent reached and ranks < rank rejected)).
        heap = [(-a[0, 0], 0, 0, 1.0)]
        tau, deepest = 1.0, 0
        while len(taus) <= n_max and heap:
            neg_p, d, j, rest = heapq.heappop(heap)
            tau += -neg_p
            deepest = max(deepest, d + 1)
            taus.append(tau)
            depths.append(deepest)
            if j + 1 < max_rank:  # its next sibling
                rest_after = rest * (1 - a[d, j])
                heapq.heappush(heap, (-rest_after * a[d, j + 1], d, j + 1, rest_after))
            if d + 1 < max_depth:  # its first child
                heapq.heappush(heap, (neg_p * a[d + 1, 0], d + 1, 0, -neg_p))
        return taus, depths


def predicted_tree_speedup(tau: float, n: float, draft_cost: float, r=None) -> float:
    """Tokens per round over the round's cost in target steps: tau / (draft_cost + r(n + 1))."""
    return tau / (draft_cost + verify_cost(n + 1, r))


class TreePolicy:
    """`tree="auto"`: before each round, the node budget n in 1..n_max with the best predicted speedup.

    c: a draft pass's cost in target steps (0 for the n-gram drafter); the
    drafting cost of an n-node tree is taken as c per layer of the best n-node
    tree. r: the measured verification curve (verify_cost).
    """

    def __init__(self, c: float, r=None, n_max: int = 15, acceptance: TreeAcceptance | None = None):
        if c < 0 or n_max < 1:
            raise ValueError("TreePolicy needs c >= 0 and n_max >= 1")
        self.c, self.r, self.n_max = c, r, n_max
        self.acceptance = acceptance or TreeAcceptance()

    def predictions(self) -> list[float]:
        """Predicted speedup for n = 1 .. n_max nodes."""
        taus, depths = self.acceptance.best_trees(self.n_max)
        return [predicted_tree_speedup(taus[n], n, self.c * depths[n], self.r) for n in range(1, len(taus))]

    def next_nodes(self) -> int:
        speedups = self.predictions()
        return 1 + int(np.argmax(speedups))

    def update(self, parents: list[int], path: list[int]) -> None:
        self.acceptance.update(parents, path)


# A verification curve r(m), m = 1 .. 16, for GPT-2 124M's shapes on a 2-core CPU
# (python -m specdec.bench --only tree-r --sizes 124M --repeats 10, rounded and made monotone): the
# default for tree="auto" when none is measured. A 17-token pass left the few-row path and cost
# 40+ steps there, so trees stop at 15 nodes (TreePolicy's n_max).
CPU_R = [1.0, 1.33, 1.52, 1.67, 1.82, 2.18, 2.2, 2.32, 2.6, 2.88, 3.28, 3.4, 3.45, 3.94, 4.33, 4.35]


class ChainPolicy:
    """tree=None: every round drafts a chain (nodes = None)."""

    n_max = 0

    def next_nodes(self) -> None:
        return None

    def update(self, parents: list[int], path: list[int]) -> None:
        pass


class FixedTree:
    """tree=N: every round may draft a tree of up to N nodes."""

    def __init__(self, nodes: int):
        if not isinstance(nodes, (int, np.integer)) or isinstance(nodes, bool) or nodes < 1:
            raise ValueError(f"tree must be None (a chain), a node budget >= 1, or 'auto'; got {nodes!r}")
        self.n_max = self.nodes = int(nodes)

    def next_nodes(self) -> int:
        return self.nodes

    def update(self, parents: list[int], path: list[int]) -> None:
        pass


OTHER_DRAFT_COST = 0.1  # c assumed for a drafter whose model cannot say what it reads (one without step_weights)


def draft_step_cost(drafter, target) -> float:
    """c, estimated without timing: a model's step on a CPU is memory-bound, so a
    draft step costs about the weights it reads over the target's, each model
    counting its own (`step_weights`: a draft model, a restricted head, the first
    L blocks of the target for early exit). 0 for a drafter without a model
    (n-gram); OTHER_DRAFT_COST for a drafter whose model cannot count them. Pass a
    TreePolicy with measured costs instead where timings exist (main.py and race do)."""
    model = getattr(drafter, "model", None)
    if model is None:
        return 0.0
    if not hasattr(model, "step_weights"):
        return OTHER_DRAFT_COST
    n_layer = getattr(drafter, "n_layer", model.n_layer)  # early exit: the first n_layer blocks
    return model.step_weights(n_layer) / target.step_weights()


def make_tree_policy(tree, drafter, target):
    """What speculative_sample's `tree` means: None a chain, N a node budget, "auto" a TreePolicy."""
    if tree is None:
        return ChainPolicy()
    if isinstance(tree, str):
        if tree != "auto":
            raise ValueError(f"tree must be None (a chain), a node budget >= 1, or 'auto'; got {tree!r}")
        return TreePolicy(c=draft_step_cost(drafter, target), r=CPU_R)
    if hasattr(tree, "next_nodes") and hasattr(tree, "update"):
        return tree  # a policy object, such as a TreePolicy with measured costs
    return FixedTree(tree)


# ---------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------
# B sequences decoded together (batch.py), each round ONE target pass over all of them.
#
# Rows are independent (each accepts its own drafts with the same alpha), so each
# row still emits expected_tokens_per_round(alpha, k) tokens per round. What a
# batch changes is the price of a round. Measured in units of T_B, one batched
# 1-token step (B rows of one token each):
#     c_B      one batched draft step (B rows) / T_B
#     r_B(m)   one target pass over B rows of m tokens / T_B
# so against batched autoregressive decoding at the same B,
#     S_B(k) = E[tokens per row per round] / (k c_B + r_B(k + 1)),
# the formula of predicted_speedup with the batch's own c_B and r_B.
#
# Why speculation stops paying: a 1-token step is memory-bound (its time is
# reading the weights), so B rows of one token cost little more than one row,
# and a pass over B*m rows is nearly free only while B*m rows stay memory-bound.
# As B grows the verification pass turns compute-bound: r_B(m) climbs from
# r_1(m) (about 2 for m = 5 here) towards m, while E[tokens] stays the same,
# so S_B falls and the best k shrinks, to 0 (no speculation) at some batch size.


def best_k_batch(alpha: float, costs: dict, k_max: int = 8) -> dict:
    """{B: (best k, predicted speedup)} for each batch size, from {B: (c_B, r_B)} (r_B a list or a function).

    k = 0 (speedup 1.0) where no k beats batched autoregressive decoding.

        best_k_batch(0.8, {1: (0.0, [1, 1.2, 1.4, 1.6, 1.8]), 16: (0.0, [1, 2, 3, 4, 5])})
        # {1: (4, 1.87), 16: (0, 1.0)}
    """
    return {b: best_k(alpha, c, r, k_max) for b, (c, r) in sorted(costs.items())}


def batch_break_even(best: dict) -> int | None:
    """The smallest batch size whose best k is 0 (speculation no longer pays), from best_k_batch; None if none."""
    return next((b for b, (k, _) in sorted(best.items()) if k == 0), None)


@dataclass
class BatchPassTimes:
    """Measured seconds of batched passes, for pricing a batch run's rounds (speedup_from_batch_rounds).

    step[b] = one b-row, 1-token target step (T_b); r[b][m-1] = r_b(m); c[b] = c_b.
    tokens[b], where measured, = (n_tok grid, seconds): a pass over n_tok new tokens
    in all, spread over min(b, n_tok) rows. A pass's price is mostly its weight
    products over all n_tok rows, and kernels.linear switches kernels at a row count
    (16), so a ragged round is priced by its own n_tok on this curve, with grid points
    on both sides of the switch; without it, by r_b at n_tok / b tokens per row.
    A round with b rows, not measured, is priced at the next measured batch size up
    (rows leave as they finish, so the last rounds of a run are smaller batches).
    """

    step: dict  # {b: seconds}
    r: dict  # {b: [r_b(1) = 1, r_b(2), ...]}
    c: dict  # {b: c_b}
    tokens: dict = field(default_factory=dict)  # {b: ([n_tok, ...] increasing, [seconds, ...])}

    def size(self, b: int) -> int:
        return min((s for s in self.step if s >= b), default=max(self.step))

    def pass_seconds(self, b: int, m: float) -> float:
        """One target pass over b rows of m tokens each on average (a ragged pass: m = n_tok / b)."""
        s = self.size(b)
        if s in self.tokens:  # the measured curve, at the round's own n_tok
            grid, seconds = self.tokens[s]
            n = m * b
        else:  # r_s as a curve over s rows of 1, 2, ... tokens, at s rows of m tokens
            grid = [s * i for i in range(1, len(self.r[s]) + 1)]
            seconds = [self.step[s] * r for r in self.r[s]]
            n = m * s
        # Linear between grid points; beyond the last, growing linearly (as verify_cost does).
        return float(np.interp(n, grid, seconds)) if n <= grid[-1] else seconds[-1] * n / grid[-1]

    def draft_seconds(self, b: int) -> float:
        s = self.size(b)
        return self.step[s] * self.c[s]


def speedup_from_batch_rounds(rounds, ar_steps, times: BatchPassTimes) -> float:
    """The speedup a batch run's own rounds predict over batched autoregressive decoding.

    rounds: per round (rows in the batch b, the drafts of each row [k_1 .. k_b], batched draft passes);
    a round costs draft passes x c_b T_b + one pass over the rows' sum(k + 1) tokens
    (BatchPassTimes.pass_seconds; rows that drafted fewer, or nothing, make the pass smaller).
    ar_steps: per autoregressive step, the rows in the batch (each step one b-row, 1-token pass).
    Both runs emit the same tokens, so the speedup is the ratio of the times. Prefill passes
    are left out of both (the same prompts either way).

        speedup_from_batch_rounds([(2, [4, 4], 4), (2, [4, 0], 4), (1, [2], 2)], [2] * 10, times)
    """
    spec = sum(n_draft * times.draft_seconds(b) + times.pass_seconds(b, sum(k + 1 for k in ks) / b)
               for b, ks, n_draft in rounds)  # fmt: skip
    ar = sum(times.pass_seconds(b, 1) for b in ar_steps)
    return ar / spec if spec else float("nan")
