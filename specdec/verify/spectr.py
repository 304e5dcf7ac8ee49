"""SpecTr's k-sequential selection (Sun et al., arXiv 2310.15141): one position, then a whole tree.

For siblings drawn i.i.d. from one q row: spectr_plan gives the rule for one node, spectr_tree
applies it at every node of a drafted tree.
"""

from __future__ import annotations

import numpy as np

from ..sampling import draw
from .trees import children_of


def spectr_plan(p: np.ndarray, q: np.ndarray, k: int) -> tuple[float, np.ndarray]:
    """SpecTr's k-sequential selection for k i.i.d. drafts from q: (gamma, residual [n_vocab], unnormalised).

    Sun et al., "SpecTr: Fast Speculative Decoding via Optimal Transport" (arXiv 2310.15141),
    the k-sequential selection (their K-SEQ), in specdec's letters (p target, q draft):

        for i = 1 .. k:  accept draft x_i with probability min(1, p(x_i) / (gamma q(x_i)))
        none accepted:   draw from norm(residual),
                         residual(y) = p(y) - c min(q(y), p(y) / gamma)

    with beta = sum_y min(q(y), p(y) / gamma), the chance one draft is accepted, and
    c = (1 - (1 - beta)^k) / beta = sum_(j<k) (1 - beta)^j.

    Why the output is exactly p. The drafts are i.i.d., so draft i is reached with probability
    (1 - beta)^(i-1) and is then y and accepted with probability q(y) min(1, p(y) / (gamma q(y)))
    = min(q(y), p(y) / gamma). Summed over i: P(accept, output y) = c min(q(y), p(y) / gamma), and
    P(none accepted) = (1 - beta)^k. The residual sums to 1 - c beta = (1 - beta)^k, so
        P(output y) = c min(q(y), p(y)/gamma) + (1 - beta)^k residual(y) / (1 - beta)^k = p(y),
    provided residual >= 0 everywhere, i.e. c min(q, p/gamma) <= p. Where p/gamma <= q that reads
    c <= gamma; where q < p/gamma, c q < c p / gamma <= p under the same condition. So any gamma with
    c(gamma) <= gamma is exact; gamma = k always is (c <= k). P(accept) = 1 - (1 - beta)^k grows as
    gamma shrinks, so this takes the smallest valid gamma in [1, k], by bisection (valid gammas
    form an interval up to k on every case the tests try); gamma = 1, k = 1 is the chain rule,
    with residual max(p - q, 0).

    NOTE: the proof needs the drafts i.i.d. from q: sibling i must not depend on siblings before it
    (drawn without replacement, the chance of reaching draft i is no longer (1 - beta)^(i-1)).
    Computed in float64 (a bisection on sums of the row); the residual comes back in float64.
    """
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)

    def beta_c(gamma: float) -> tuple[float, float]:
        beta = float(np.minimum(q, p / gamma).sum())
        return beta, (1 - (1 - beta) ** k) / beta if beta > 0 else float(k)

    lo, hi = 1.0, float(k)
    if beta_c(lo)[1] <= lo:  # k = 1, or p == q
        hi = lo
    for _ in range(50):  # invariant: hi is valid, lo is not (c(gamma) <= gamma on [hi, k])
        if hi - lo < 1e-9:
            break
        mid = (lo + hi) / 2
        if beta_c(mid)[1] <= mid:
            hi = mid
        else:
            lo = mid
    gamma = hi
    beta, c = beta_c(gamma)
    residual = np.maximum(p - c * np.minimum(q, p / gamma), 0)  # >= 0 up to rounding at a valid gamma
    return gamma, residual


def spectr_acceptance(p: np.ndarray, q: np.ndarray, k: int) -> float:
    """P(SpecTr's k-sequential selection accepts one of k i.i.d. drafts from q) = 1 - (1 - beta)^k."""
    gamma, _ = spectr_plan(p, q, k)
    beta = float(np.minimum(np.asarray(q, np.float64), np.asarray(p, np.float64) / gamma).sum())
    return 1 - (1 - beta) ** k


def spectr_tree(
    tokens: list[int], parents: list[int], q: np.ndarray, p: np.ndarray, rng: np.random.Generator
) -> tuple[list[int], int]:
    """SpecTr's k-sequential selection at every node of a tree whose siblings were drawn i.i.d.

    Same arguments and answer as sampled_tree. At the current node with target row r = p[row] and
    children x_1 .. x_k, all drawn i.i.d. from one q row: spectr_plan gives gamma; child i (in tree
    order) is accepted with probability min(1, r(x_i) / (gamma q(x_i))), the first success wins and
    the walk goes down to it; if none is accepted (or there are no children: the bonus), one token is
    drawn from the residual and the round ends. Each node emits a token with law r exactly
    (spectr_plan), whatever the tree below an accepted child is, since that subtree was drafted after
    the child and the coins here are fresh: the induction of sampled_tree, one level at a time.
    """
    children = children_of(parents)
    path: list[int] = []
    row = 0
    while True:
        kids = children[row]
        r = p[row]
        if not kids:
            return path, draw(r, rng)
        q_row = iid_row(q, kids)
        gamma, residual = spectr_plan(r, q_row, len(kids))
        for child in kids:
            x = tokens[child]
            # accept with min(1, r(x) / (gamma q(x))): u gamma q(x) < r(x); q(x) > 0, x was drawn from q.
            if rng.random() * gamma * q_row[x] < r[x]:
                path.append(child)
                row = child + 1
                break
        else:
            mass = residual.sum()
            # NOTE: the residual sums to (1 - beta)^k, not 1. Mass 0 means acceptance was certain up
            # to rounding; r is the right answer then, as in sampled_chain.
            return path, draw(residual / mass if mass > 0 else r, rng)


def iid_row(q: np.ndarray, kids: list[int]) -> np.ndarray:
    """The one q row siblings `kids` were drawn i.i.d. from; refuses siblings that report different rows."""
    q_row = q[kids[0]]
    if any(not np.array_equal(q[c], q_row) for c in kids[1:]):
        raise ValueError(
            "verification='spectr' needs the siblings of a node drawn i.i.d. from one q row; "
            "these siblings report different rows (drawn without replacement or distinct)"
        )
    return q_row
