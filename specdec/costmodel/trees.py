"""The cost model for trees: expected tokens per target pass, and the node budget that pays.

TreeAcceptance learns acceptance by depth and rank from verified rounds; TreePolicy picks each
round's node budget from it; make_tree_policy turns speculative_sample's `tree` into a policy,
with draft_step_cost's c when nothing was timed.
"""

from __future__ import annotations

import heapq

import numpy as np

from ..interfaces import priced_drafter
from ..verify.trees import children_of
from .chain import verify_cost

# What this adds over the chain model of chain.py (one acceptance rate alpha): a tree
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
# chain formula (chain.expected_tokens_per_round).
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

    def __init__(
        self,
        max_depth: int = 16,
        max_rank: int = 16,
        prior: float = 0.6,
        prior_weight: float = 2.0,
        decay: float = 0.95,
    ):
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
    drafter = priced_drafter(drafter)  # lookup first (drafters/lookup_first.py): its second drafter's step
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
