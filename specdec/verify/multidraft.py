"""What several drafts are worth: at one position, and over a whole drafted tree.

For one position with k drafts: the best acceptance any exact rule can reach (optimal_acceptance)
and SpecInfer's own (specinfer_acceptance, specinfer_iid_acceptance); SpecTr's is in spectr.py.
For a whole drafted tree: each rule's exact law of accepted tokens (accepted_law,
expected_accepted) and the bound for its first position (first_position_bound). No coin is
flipped here: these are the rules' laws, computed.
"""

from __future__ import annotations

import numpy as np

from .spectr import iid_row, spectr_plan
from .trees import TREE_VERIFICATION, children_of, traversal_update

WOR_SUPPORT_MAX = 16  # optimal_acceptance(replacement=False) enumerates subsets of q's support: 2**16 of them


def optimal_acceptance(p: np.ndarray, q: np.ndarray, k: int, replacement: bool = True) -> float:
    """The best P(accept a draft) any exact rule can reach with k drafts from q for one position of target p.

    p, q: [n_vocab] target and draft rows (filtered alike). The k drafts X_1..X_k are drawn from q
    i.i.d. (replacement=True) or one after another without replacement (as draw_without_replacement
    does; fewer when q has fewer than k tokens). An exact rule, whatever it does, outputs a token Y
    with law p, jointly with the drafts: a coupling of (X_1..X_k) and Y. It accepts when Y is one of
    the drafts, so the best rule is the coupling maximising P(Y in {X_1..X_k}) (SpecTr, Sun et al.,
    arXiv 2310.15141, section 3: an optimal-transport problem; Hu et al., arXiv 2502.18779, solve it
    through its dual). This returns that maximum.

    The dual, as a max-flow / min-cut. Send mass Q(xs) from each draft tuple xs to the tokens in it,
    and at most p(y) into each token y; the largest flow is the best acceptance (a flow is the
    accepted part of a coupling; the unaccepted rest of both laws can always be paired up
    afterwards, so every flow is reached by an exact rule). A cut picks a token set H and pays p(H)
    for its tokens' edges, plus Q(xs) for every tuple with a token outside H (its edges into the
    tokens outside H are unbounded, so the tuple itself must be cut). Max-flow = min-cut:

        alpha*  =  min over token sets H of   p(H) + P(not all k drafts lie in H)

    i.i.d.:  P(all in H) = q(H)^k, so alpha* = min_H p(H) + 1 - q(H)^k;  k = 1 gives
             min_H p(H) + 1 - q(H) = 1 - max_H (q(H) - p(H)) = sum_x min(p(x), q(x)), the chain rule's.

    Computing it for the i.i.d. case: the minimising H is a prefix of the tokens sorted by q/p,
    largest first (Hu et al. show the minimisers are nested along an ordering; this is the argument
    for this objective). Let H be optimal, y in H and z outside. Dropping y must not help and
    adding z must not help, with s = q(H):
        s^k - (s - q(y))^k >= p(y)        and        (s + q(z))^k - s^k <= p(z).
    t -> t^k is convex, so its slope over [s, s + q(z)] is at least its slope over [s - q(y), s]:
        p(z) / q(z)  >=  ((s + q(z))^k - s^k) / q(z)  >=  (s^k - (s - q(y))^k) / q(y)  >=  p(y) / q(y),
    i.e. q(y)/p(y) >= q(z)/p(z): every token in an optimal H has a ratio q/p at least that of every
    token outside. So H = every token above some ratio, plus some of the tokens AT that ratio; those
    have q = t p for one t, and over them the objective is p(H0) + a - (q(H0) + t a)^k in their p-mass
    a, concave, so its minimum over [0, their total] is at an end: none or all of them. Either is a
    prefix of the sorted order, so a sweep over the V + 1 prefixes (one cumulative sum each for p
    and q) finds the minimum exactly.

    Without replacement, P(all k drafts in H) is not a function of q(H): it is computed exactly by
    following the law of the SET of drafts, draw by draw, over the subsets of q's support, and the
    minimum is taken over all subsets H of that support (tokens outside it only add p(H)). That is
    exact but exponential: q must have at most WOR_SUPPORT_MAX nonzero tokens (filter it, top_k).
    """
    if k < 1:
        raise ValueError(f"k, the number of drafts, must be at least 1, got {k}")
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    p, q = p / p.sum(), q / q.sum()
    if replacement:
        # q/p largest first; p = 0 < q sorts first (inf), p = q = 0 anywhere (it adds nothing).
        ratio = np.divide(q, p, out=np.where(q > 0, np.inf, 0.0), where=p > 0)
        order = np.argsort(-ratio, kind="stable")
        p_prefix = np.concatenate([[0.0], np.cumsum(p[order])])  # [V+1]: p(H) for H = the first m tokens
        q_prefix = np.minimum(np.concatenate([[0.0], np.cumsum(q[order])]), 1.0)
        return float(np.min(p_prefix + 1 - q_prefix**k))
    support = np.flatnonzero(q > 0)
    n = len(support)
    if n > WOR_SUPPORT_MAX:
        raise ValueError(
            f"optimal_acceptance without replacement enumerates subsets of q's support: q has {n} "
            f"nonzero tokens, at most {WOR_SUPPORT_MAX} allowed; filter q (top_k) first"
        )
    all_in = _subset_law_without_replacement(q[support], min(k, n))  # [2**n]: P(the drawn set is S)
    masks = np.arange(1 << n)
    for i in range(n):  # zeta transform: all_in[H] becomes P(drawn set within H), the sum over S within H
        has = masks[(masks >> i) & 1 == 1]
        all_in[has] += all_in[has ^ (1 << i)]
    p_of = _subset_sums(p[support])  # [2**n]: p(H)
    return float(np.min(p_of + 1 - all_in))


def _subset_sums(w: np.ndarray) -> np.ndarray:
    """[n] weights -> [2**n]: the total weight of every subset, subsets as bit masks."""
    sums = np.zeros(1 << len(w))
    for i, wi in enumerate(w):
        sums[1 << i : 1 << (i + 1)] = sums[: 1 << i] + wi
    return sums


def _subset_law_without_replacement(q: np.ndarray, k: int) -> np.ndarray:
    """[2**n]: P(the set of the first k draws without replacement from q [n] is S), S as a bit mask.

    Draw by draw: from set S (mass q(S) already drawn), token y outside S comes next with
    probability q(y) / (1 - q(S)): the row renormalised without S, as draw_without_replacement draws.
    """
    n = len(q)
    masks = np.arange(1 << n)
    q_of = _subset_sums(q)
    law = np.zeros(1 << n)
    law[0] = 1.0
    for _ in range(k):
        nxt = np.zeros(1 << n)
        left = np.maximum(1 - q_of, 1e-300)
        for y in range(n):
            free = (masks >> y) & 1 == 0
            nxt[masks[free] | (1 << y)] += law[free] * q[y] / left[free]
        law = nxt
    return law


def specinfer_acceptance(p: np.ndarray, tokens: list[int], q_rows: np.ndarray) -> float:
    """P(sampled_tree accepts one of these siblings | they were drawn), at a node with target row p.

    Sibling s is accepted with min(1, r_(s-1)(x_s) / q_s(x_s)), r updated after each rejection
    as sampled_tree does; averaged over the draws this is the rule's acceptance at the node.
    """
    r, rejected = np.asarray(p, np.float64), 1.0
    for x, q in zip(tokens, np.asarray(q_rows, np.float64)):
        rejected *= 1 - min(1.0, r[x] / q[x])
        residual = np.maximum(r - q, 0)
        if residual.sum() > 0:
            r = residual / residual.sum()
    return 1 - rejected


def specinfer_iid_acceptance(p: np.ndarray, q: np.ndarray, k: int) -> float:
    """P(sampled_tree accepts one of k i.i.d. siblings from q), exactly: 1 - prod_s (1 - sum min(r_(s-1), q)).

    With i.i.d. siblings the residuals r_s do not depend on which tokens were rejected, so
    sibling s is accepted, given it is reached, with probability sum_x min(r_(s-1)(x), q(x)).
    """
    r, q, rejected = np.asarray(p, np.float64), np.asarray(q, np.float64), 1.0
    for _ in range(k):
        rejected *= 1 - float(np.minimum(r, q).sum())
        residual = np.maximum(r - q, 0)
        if residual.sum() > 0:
            r = residual / residual.sum()
    return 1 - rejected


def accepted_law(
    tokens: list[int], parents: list[int], q: np.ndarray, p: np.ndarray, verification: str = "token"
) -> np.ndarray:
    """[depth + 1] float64: P(the round accepts exactly d drafted tokens | this drafted tree), d = 0..depth.

    tokens, parents, q [n, n_vocab], p [n + 1, n_vocab]: a drafted tree and its target rows, as
    sampled_tree reads them. verification: "token" (SpecInfer, sampled_tree; on a chain the
    token-wise rule), "spectr" (spectr_tree: i.i.d. siblings) or "traversal" (traversal_tree; on a
    chain block verification). No coin is flipped: the law is the rule's own recursion with each
    coin replaced by its probability, so it is exact given the tree (the drafts are held fixed;
    averaged over drafted trees it is the rule's law of accepted tokens per round).

        token, spectr   node rules: at a node of row r with children x_1..x_k, child s is reached
                        when every earlier child was rejected and accepted with probability
                        min(1, r_(s-1)(x_s) / q_s(x_s)) (SpecInfer: r updated after each rejection) or
                        min(1, r(x_s) / (gamma q(x_s))) (SpecTr's gamma, spectr_plan); the round stops
                        at the node with the probability that none is accepted.
        traversal       leaves to root: a child's subtree is judged with the weight carried down to
                        it, min(1, w r(x) / q(x)); it is accepted (somewhere inside) with the
                        probability its own recursion gives, else the parent's (w, r) update
                        (traversal_update) before the next child; a node with no children left is
                        accepted with its w (the root always).

    The expected number accepted is law @ arange(depth + 1) (expected_accepted); tokens per
    verification pass, tau, is one more (the corrected or bonus token). Computed in float64 (the
    rules' own coins compare float32 rows; the law is a measurement, read to 1e-8 in the tests).
    """
    if verification not in TREE_VERIFICATION:
        raise ValueError(f"verification must be one of {TREE_VERIFICATION} for a tree's law, got {verification!r}")
    children = children_of(parents)
    depth = [0] * (len(parents) + 1)  # depth[row]: drafted tokens on the path to row (0: the root)
    for i, parent in enumerate(parents):
        depth[i + 1] = depth[parent + 1] + 1
    law = np.zeros(max(depth) + 1)  # [depth + 1]
    p64, q64 = np.asarray(p, np.float64), np.asarray(q, np.float64)

    def node_rule(row: int, reach: float) -> None:
        """Spread the probability `reach` of arriving at this node over where the round ends."""
        kids, r = children[row], p64[row]
        gamma = spectr_plan(r, iid_row(q64, kids), len(kids))[0] if verification == "spectr" and kids else 1.0
        for child in kids:
            x = tokens[child]
            accept = min(1.0, r[x] / (gamma * q64[child, x]))
            node_rule(child + 1, reach * accept)
            reach *= 1 - accept
            if verification == "token":  # SpecInfer's r_s = norm(max(0, r_(s-1) - q_s)), as in sampled_tree
                residual = np.maximum(r - q64[child], 0)
                if residual.sum() > 0:
                    r = residual / residual.sum()
        law[depth[row]] += reach  # no child accepted, or a leaf: the round ends here

    def judge(row: int, w: float) -> np.ndarray:
        """[depth + 1]: P(this subtree is accepted, ending at depth d), judged with weight w (traversal_tree)."""
        out = np.zeros_like(law)
        r, rejected = p64[row], 1.0  # rejected: P(every child so far rejected, subtree and all)
        for child in children[row]:
            x = tokens[child]
            below = judge(child + 1, min(1.0, w * r[x] / q64[child, x]))
            out += rejected * below
            rejected *= 1 - below.sum()
            w, r = traversal_update(w, r, q64[child])
        out[depth[row]] += rejected * (1.0 if row == 0 else w)
        return out

    if verification == "traversal":
        law += judge(0, 1.0)
    else:
        node_rule(0, 1.0)
    return law


def expected_accepted(
    tokens: list[int], parents: list[int], q: np.ndarray, p: np.ndarray, verification: str = "token"
) -> float:
    """E[drafted tokens accepted | this drafted tree] under a rule: accepted_law's mean."""
    law = accepted_law(tokens, parents, q, p, verification)
    return float(law @ np.arange(len(law)))


def first_position_bound(tokens: list[int], parents: list[int], q: np.ndarray, p: np.ndarray) -> float:
    """The best P(accept at least one drafted token) any exact rule can reach with the root's children.

    The bound where it applies to a whole tree: its first position, k candidates for one token
    (optimal_acceptance). It is a bound on the average over drafted trees of 1 - accepted_law(...)[0],
    for trees whose root children are drawn as these were, told apart by their q rows:
        point masses       deterministic candidates D (top_k_distinct): p(D), accept Y ~ p when Y is in D
        all rows equal     i.i.d. from that row: optimal_acceptance(p[0], row, k)
        otherwise          without replacement from the first row (draw_without_replacement):
                           optimal_acceptance(..., replacement=False), so q's support must be small
                           (at most WOR_SUPPORT_MAX tokens)
    Deeper positions have no such closed form here: what a rule may accept below a node depends on
    the whole subtree it judges.
    """
    kids = children_of(parents)[0]
    if not kids:
        return 0.0
    rows = q[kids]  # [k, n_vocab]
    if np.all(rows.max(axis=-1) == 1):
        return float(np.asarray(p[0], np.float64)[sorted({tokens[c] for c in kids})].sum())
    iid = all(np.array_equal(row, rows[0]) for row in rows[1:])
    return optimal_acceptance(p[0], rows[0], len(kids), replacement=iid)
