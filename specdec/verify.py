"""Verification: which drafted tokens the target accepts, and the token it adds.

Steps 3-4 of Leviathan et al. (arXiv 2211.17192), Algorithm 1; the same rule
as Chen et al. (arXiv 2302.01318), Algorithm 2. Letters as in Leviathan et al.:
p is the TARGET's distribution, q the DRAFT's (Chen et al. swap them).

`verify` takes a Proposal and the target's logits over [ids[-1], *tokens] and
returns (path, last): the indices of the accepted tokens, in order, and the
token the target emits after them. Row 0 of the logits is the target's
distribution for proposal node 0's position; row i + 1 for the children of node i.
For a chain that means: logits row i verifies tokens[i], and row n (after the
last draft) gives the bonus token when all n are accepted.

Chains have two exact rules, side by side below:
    sampled_chain    token-wise: each draft judged on its own row (Leviathan et al.)
    block_chain      block verification: the drafts judged jointly (Sun et al.,
                     arXiv 2403.10444): never fewer accepted tokens in expectation

Trees (several candidates per position, verified in the same one pass): the
same decisions made child by child, below. On a chain every tree rule makes
the chain rule's decisions with the same random draws, so `verify` uses the
chain rules for chains (they read as the papers do) and the tree rules for
the rest:
    greedy_tree      temperature 0: follow the child equal to the target's argmax
    sampled_tree     exact multi-candidate speculative sampling (SpecInfer)
    spectr_tree      SpecTr's k-sequential selection of i.i.d. siblings (Sun et al.)
    traversal_tree   traversal verification: leaves to root, whole sequences (Weng et al.)
    typical_tree     Medusa's typical acceptance: LOSSY, an explicit opt-in
and the ways of drawing siblings that sampled_tree keeps exact: draw_iid,
draw_without_replacement, top_k_distinct. At the end, what several drafts for
one position can be worth at best (optimal_acceptance: the bound no exact rule
passes) and SpecTr's rule (spectr_plan); then, for a whole drafted tree, each
rule's exact law of accepted tokens (accepted_law, expected_accepted) and the bound
for its first position (first_position_bound).

Why the sampled rule is exact: for any token y at a position,
    P(emit y) = q(y) min(1, p(y)/q(y)) + P(reject) * norm(max(0, p - q))(y)
              = min(q(y), p(y)) + (1 - sum_x min(p(x), q(x))) * max(0, p(y) - q(y)) / sum_x max(0, p(x) - q(x))
and since sum_x max(0, p - q) = 1 - sum_x min(p, q), the second term is
max(0, p(y) - q(y)); min(q, p) + max(0, p - q) = p(y). (Leviathan et al.,
Appendix A.1; Chen et al., Theorem 1.)
"""

from __future__ import annotations

import numpy as np

from .interfaces import Proposal
from .sampling import SamplingParams, draw, greedy, point_mass, probabilities

ACCEPTANCE = ("exact", "typical")  # the rules speculative_sample offers; "typical" is lossy
VERIFICATION = ("token", "block")  # how an exact rule judges a chain: draft by draft, or the block jointly
TREE_VERIFICATION = ("token", "spectr", "traversal")  # how it judges a tree: SpecInfer, SpecTr, or leaves to root


def verify(
    proposal: Proposal,
    logits: np.ndarray,
    params: SamplingParams,
    rng: np.random.Generator,
    acceptance: str = "exact",
    verification: str = "token",
) -> tuple[list[int], int]:
    """(accepted node indices, root first; the token the target emits after them).

    logits: [n+1, n_vocab], the target's rows over [ids[-1], *proposal.tokens].
    acceptance "typical" is Medusa's LOSSY rule (typical_tree), for T > 0 only.
    verification "block" judges a chain jointly (block_chain); "spectr" judges
    every node's i.i.d. siblings by SpecTr's k-sequential selection (spectr_tree;
    on a chain it is the token-wise rule); "traversal" judges the tree from the
    leaves towards the root, whole paths at a time (traversal_tree; on a chain it is
    block verification). Under greedy decoding every rule is the greedy walk, and
    "token" and "block" judge trees by sampled_tree.
    """
    tokens, parents = proposal.tokens, proposal.parents
    if params.greedy:
        if proposal.is_chain:
            n_accepted, last = greedy_chain(tokens, logits)
            return list(range(n_accepted)), last
        return greedy_tree(tokens, parents, logits)
    p = probabilities(logits, params)  # [n+1, n_vocab]
    if acceptance == "typical":
        return typical_tree(tokens, parents, p, rng)
    if verification == "spectr":
        return spectr_tree(tokens, parents, proposal.q, p, rng)
    if verification == "traversal":  # on a chain it is block verification; the tree code runs either way
        return traversal_tree(tokens, parents, proposal.q, p, rng)
    if proposal.is_chain:
        chain_rule = block_chain if verification == "block" else sampled_chain
        n_accepted, last = chain_rule(tokens, proposal.q, p, rng)
        return list(range(n_accepted)), last
    return sampled_tree(tokens, parents, proposal.q, p, rng)


def greedy_chain(drafts: list[int], logits: np.ndarray) -> tuple[int, int]:
    """Temperature 0: keep drafts while each equals the target's argmax.

    Returns (number accepted, the token to emit after them): the target's argmax
    at the first mismatch, or at row k (the bonus) when all match. This is the
    sampled rule with p and q both point masses on their argmax.
    """
    for i, x in enumerate(drafts):
        best = greedy(logits[i])
        if x != best:
            return i, best
    return len(drafts), greedy(logits[len(drafts)])


def sampled_chain(drafts: list[int], q: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> tuple[int, int]:
    """Rejection sampling over a chain of drafts (Algorithm 1, steps 3-4).

    drafts: k tokens; q: [k, n_vocab] draft distributions they were drawn from;
    p: [k+1, n_vocab] target distributions (already filtered like q).
    """
    for i, x in enumerate(drafts):
        # Step 3: accept x with probability min(1, p(x)/q(x)): r < p/q, written
        # without the division. q[i, x] > 0 because x was drawn from q[i].
        if rng.random() * q[i, x] < p[i, x]:
            continue
        # Step 4, rejected: draw from the residual max(0, p - q).
        # NOTE: it must be renormalised; it sums to 1 - sum(min(p, q)), not 1.
        residual = np.maximum(p[i] - q[i], 0)
        mass = residual.sum()
        if mass <= 0:  # p == q up to rounding: then the rejection itself had
            return i, draw(p[i], rng)  # probability ~0, and p is the right answer
        return i, draw(residual / mass, rng)
    # NOTE: all k accepted: the target's row k is a free extra token (the bonus).
    return len(drafts), draw(p[len(drafts)], rng)


def block_chain(drafts: list[int], q: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> tuple[int, int]:
    """Block verification: the drafts judged jointly (Sun et al., arXiv 2403.10444, Algorithm 2).

    Same arguments and answer as sampled_chain: drafts, k tokens; q: [k, n_vocab]
    the rows they were drawn from; p: [k+1, n_vocab] target rows (filtered like q).
    Returns (n accepted, the token emitted after them). Two draws: how many drafts
    to keep, then the token after them; block_plan holds all the math.

    Why jointly. Token-wise, a draft the draft model over-proposes (q > p) is
    rejected with probability 1 - p/q even when the drafts before it were ones
    the target likes more than the draft does (p > q): that surplus is thrown
    away. Block verification carries it along the block as a weight, so a later
    token can spend it. The paper's binary example (target P(a) = 1/3, draft
    P(a) = 2/3, two drafts): 10/9 accepted drafts per round token-wise, 11/9 here.
    """
    stop, rows = block_plan(drafts, q, p)  # [k+1], [k+1, n_vocab]
    n = draw(stop, rng)  # accept the first n drafts
    # n < k: the block residual at row n; n == k: the bonus from p[k].
    # NOTE: the residual must be renormalised; it sums to r_n, not 1.
    return n, draw(rows[n] / rows[n].sum(), rng)


def block_plan(drafts: list[int], q: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(stop [k+1]: P(accept exactly the first i drafts), rows [k+1, n_vocab]: what to draw after them).

    rows are unnormalised: row i < k is the block residual max(w_i p[i] - q[i], 0),
    row k is p[k] (the bonus); the token after i accepted drafts follows rows[i] / rows[i].sum().

    The paper's letters -> specdec's. Sun et al. write M_b for the target and M_s
    for the draft, gamma for the block length, X_1..X_gamma for the drafts and p_i
    for a *weight*; here the target is p, the draft q, the block length k, and
    the weight is w (p is taken). With 0-based rows as everywhere in specdec:
    drafts[i] was drawn from q[i] and is judged on p[i]; "stop at i" means keep
    drafts[:i] and draw the next token at row i.

    Algorithm 2, in specdec's letters:
        w_0 = 1,   w_i = min(1, w_(i-1) p[i-1](x_(i-1)) / q[i-1](x_(i-1)))   for i = 1..k
            (the weight carried along the block: NOT a per-token min(1, p/q))
        r_i = sum_x max(w_i p[i](x) - q[i](x), 0)                            for i < k
            (the mass of the block residual at row i)
        h_k = w_k,   h_i = r_i / (r_i + 1 - w_i)                             for 1 <= i < k
        coins u_1..u_k uniform; tau = the LARGEST i with u_i <= h_i (0 if none)
        tau == k: emit all drafts and a bonus from p[k]
        tau < k:  emit drafts[:tau] and a token from the block residual
                  norm(max(w_tau p[tau] - q[tau], 0))
    Going from the end, tau = k with probability h_k, else k-1 with probability
    h_(k-1), ...; so P(tau = i) = h_i prod_(j > i) (1 - h_j), with h_0 = 1. This
    function returns that law (stop) instead of flipping k coins: one draw.

    Why the output is exactly p (a proof sketch, written for this code; the
    paper proves it its own way). Write Q(x_:i) = prod_(j<i) q[j](x_j), P(x_:i)
    likewise with p, all rows along the drafted path.
    (1) P(tau >= i and the first i drafts are x_:i) = Q(x_:i) w_i.  From the end:
        at i = k it is Q h_k = Q w_k. If it holds at i + 1, summing over the
        next draft y gives Q(x_:i) sum_y min(q[i](y), w_i p[i](y)) = Q (w_i - r_i),
        so P(tau < i + 1, x_:i) = Q (1 - w_i + r_i), and the fresh coin at i
        stops there with probability h_i: P(tau = i, x_:i) = Q r_i. Together
        P(tau >= i, x_:i) = Q (w_i - r_i + r_i) = Q w_i.  (This is what h_i is for.)
    (2) Let A_m(s) = P(tau >= m, drafts start with s) = Q(s) w_m and B_m(s) the
        probability that the round stops earlier and its output, continued by
        the target itself, starts with s (|s| = m). Claim: A_m + B_m = P(s).
        True at m = 0 (1 + 0). Step m -> m + 1 with s' = s + (y,):
            A_(m+1) = Q(s) q[m](y) w_(m+1) = Q(s) min(q[m](y), w_m p[m](y))
            B_(m+1) = B_m p[m](y) + P(tau = m, s) norm(residual)(y)
                    = B_m p[m](y) + Q(s) max(w_m p[m](y) - q[m](y), 0)     (by (1))
        and min(q, w p) + max(w p - q, 0) = w p, so A + B = (A_m + B_m) p[m](y)
        = P(s'). At m = k the bonus is drawn from p[k], so every sequence of
        k + 1 tokens has probability P(s): the round's output, continued by the
        target, is distributed exactly as the target's own sampling.
    Never fewer accepted in expectation than token-wise: E[tau] = sum_i E_q[w_i]
    by (1), and w_i >= prod_(j<i) min(1, p[j](x_j) / q[j](x_j)), token-wise's
    P(accept the first i), draft by draft (block_weights, token_weights).

    NOTE: the residual carries the weight w_i. norm(max(p - q, 0)), the
    token-wise residual, is wrong here, and so nearly right that only the exact
    law of a round shows it (tests/test_block.py).
    """
    k = len(drafts)
    w = block_weights(drafts, q, p)  # [k+1]
    if k == 0:  # nothing drafted: draw from p[0] (q may be None)
        return np.ones(1, np.float32), p[:1]
    rows = np.empty((k + 1, p.shape[-1]), np.float32)  # [k+1, n_vocab]
    residual = rows[:k]  # [k, n_vocab]: the block residual max(w_i p[i] - q[i], 0) at rows 0..k-1, in place
    np.multiply(w[:k, None], p[:k], out=residual)
    residual -= q
    np.maximum(residual, 0, out=residual)
    r = residual.sum(axis=-1)  # [k]: r_i
    # h_i = r_i / (r_i + 1 - w_i) for 1 <= i < k. A zero denominator (r_i = 0 and w_i = 1: p[i] == q[i]
    # up to rounding) means stopping at i has probability 0; h_i = 1 then, any value would do.
    denominator = r[1:] + 1 - w[1:k]  # [k-1]
    h = np.ones(k + 1, np.float32)  # h_0 = 1: when every later coin fails, the round keeps 0 drafts
    h[1:k] = np.divide(r[1:], denominator, out=np.ones_like(denominator), where=denominator > 0)
    h[k] = w[k]
    # P(tau = i) = h_i prod_(j > i) (1 - h_j): the coins from the end, the first success wins.
    later = np.cumprod((1 - h)[::-1])[::-1]  # [k+1]: later[i] = prod_(j >= i) (1 - h_j)
    stop = h * np.append(later[1:], np.float32(1))  # [k+1]; sums to 1 because h_0 = 1
    # NOTE: the residual rows are NOT renormalised here (k x n_vocab divisions per round for one row
    # drawn): block_chain renormalises the row it draws from. A row of mass 0 is replaced by p[i]:
    # it is drawn from only where stopping had probability ~0 (h_i = 1 above, or h_0 with p[0] == q[0]
    # up to rounding), and p is the right answer there, as in sampled_chain.
    empty = np.flatnonzero(r <= 0)
    rows[empty] = p[empty]
    rows[k] = p[k]  # all k accepted: the bonus token
    return stop, rows


def block_weights(drafts: list[int], q: np.ndarray, p: np.ndarray) -> np.ndarray:
    """[k+1] float32: w_0 = 1, w_i = min(1, w_(i-1) p[i-1](x) / q[i-1](x)): the weight carried along the block.

    w_i is also P(block verification keeps at least i drafts | the first i drafts),
    averaged over the later drafts (block_plan, step (1)): sum(w[1:]) is the
    expected number of drafts a round accepts, from the drafted path alone.
    """
    w = np.ones(len(drafts) + 1, np.float32)
    for i, x in enumerate(drafts):
        # q[i, x] > 0: x was drawn from q[i].
        w[i + 1] = min(np.float32(1), w[i] * p[i, x] / q[i, x])
    return w


def token_weights(drafts: list[int], q: np.ndarray, p: np.ndarray) -> np.ndarray:
    """[k+1] float32: prod_(j<i) min(1, p[j](x_j) / q[j](x_j)), token-wise's P(accept the first i drafts).

    Never above block_weights, draft by draft: min(1, w r) >= w min(1, r) for w <= 1.
    """
    ratios = np.array([min(1, p[i, x] / q[i, x]) for i, x in enumerate(drafts)], np.float32)  # [k]
    return np.cumprod(np.append(np.float32(1), ratios)).astype(np.float32)


# ---------------------------------------------------------------------------
# Trees. A tree of n drafted nodes is two lists, parents first (model/attention.tree_mask):
# tokens[i] is node i's token, parents[i] its parent node or -1 for a child of
# the root, the text's last token ids[-1]. The target pass over [ids[-1], *tokens]
# gives row 0 (after the root) and row i + 1 (after node i: for node i's
# children, or the bonus token when node i ends the accepted path as a leaf).
# Every rule walks down from the root and returns (path, last); the round emits
# [tokens[i] for i in path] + [last], between 1 and depth + 1 tokens per pass.
# ---------------------------------------------------------------------------


def children_of(parents) -> list[list[int]]:
    """[n] parents -> n + 1 lists of children, indexed like the target's logit rows.

    children[0] are the root's children (parent -1); children[i + 1] are node i's,
    in the order they appear in the tree, which is the order they are tested in.
    """
    children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, parent in enumerate(parents):
        assert -1 <= parent < i, f"node {i}'s parent {parent} must be -1 or an earlier node"
        children[parent + 1].append(i)
    return children


def greedy_tree(tokens: list[int], parents: list[int], logits: np.ndarray) -> tuple[list[int], int]:
    """Temperature 0: from the root, follow the child equal to the target's argmax.

    logits: [n + 1, n_vocab], the target's rows (row 0 after the root, row i + 1
    after node i). At the first node with no matching child, `last` is the
    target's argmax there; after a leaf it is the bonus token. The output is
    exactly greedy autoregressive decoding: every emitted token is the target's
    argmax after the accepted text before it. Siblings should be distinct (with
    duplicates the first one wins; the others are wasted nodes).
    """
    children = children_of(parents)
    path: list[int] = []
    row = 0
    while True:
        best = greedy(logits[row])
        match = next((c for c in children[row] if tokens[c] == best), None)
        if match is None:
            return path, best
        path.append(match)
        row = match + 1


def sampled_tree(
    tokens: list[int], parents: list[int], q: np.ndarray, p: np.ndarray, rng: np.random.Generator
) -> tuple[list[int], int]:
    """Exact multi-candidate speculative sampling: the emitted tokens follow p exactly.

    tokens, parents: the tree; q: [n, n_vocab], row i the distribution node i was
    drawn from; p: [n + 1, n_vocab] target rows, filtered like q (temperature,
    top-k, top-p). SpecInfer (Miao et al., arXiv 2305.09781), Algorithm 2
    ("VerifyStochastic"), Theorem 4.2. At the current node, with children
    x_1 .. x_k drawn from q_1 .. q_k (in tree order):

        r_0 = p (the target's row at this node)
        for s = 1 .. k:
            accept x_s with probability min(1, r_(s-1)(x_s) / q_s(x_s)):
                emit x_s, go down to x_s (r is reset to x_s's own p row), repeat
            else r_s = norm(max(0, r_(s-1) - q_s))
        all k rejected (or no children): emit one token drawn from r_k; stop.

    Why every emitted token follows p. Claim: from sibling s on, the procedure
    emits a token distributed as r_(s-1), whatever q_s .. q_k are, as long as
    x_s is drawn from q_s. After the last sibling it draws from r_k directly.
    At sibling s, for any token y (write r = r_(s-1)):
        P(emit y) = q_s(y) min(1, r(y)/q_s(y))  +  P(reject x_s) * r_s(y)
                  = min(q_s(y), r(y))  +  (1 - sum_x min(q_s(x), r(x))) * max(0, r(y) - q_s(y)) / Z
    with Z = sum_x max(0, r(x) - q_s(x)) = 1 - sum_x min(q_s(x), r(x)), so the
    second term is max(0, r(y) - q_s(y)), and the sum is r(y). (The chain
    rule's algebra, once per sibling; Leviathan et al., Appendix A.1.) The
    second term needs only that the rest emits r_s: r_s is a function of r and
    q_s alone, not of which x_s was drawn, so it holds by induction from the
    last sibling back to the first, and at s = 1 the token follows r_0 = p.
    Once x_s is accepted, its subtree was drafted after x_s, so the same
    argument applies one level down against p's row after x_s.

    NOTE: the q rows must be the distributions the tokens were actually drawn
    from, *given the path and the earlier siblings*. Then the three ways of
    drawing siblings are all this one rule, with no special cases:
      - i.i.d. siblings: every q_s is the same draft row (SpecInfer, Medusa).
      - Without replacement (EAGLE): q_s is the draft row with the earlier
        siblings' tokens zeroed and renormalised. Sibling s+1 then depends on
        x_s, but the claim above holds for any q_(s+1): after a rejection the
        rest is a valid sampler of r_s whatever the rejected token was.
      - Deterministic distinct candidates (top-k of the draft, an n-gram trie):
        q_s is a point mass on x_s, so x_s is accepted with probability
        r(x_s), and on rejection r_s is r with x_s zeroed and renormalised.
    Drawing a sibling from anything else than the q row handed in here (p, an
    unfiltered q, the row before zeroing) breaks exactness: the tests show it.
    Exactness also needs fresh coins: the tree may depend on earlier draft
    draws in any way, never on these acceptance draws or on p.

    On a chain (one child per node) this is sampled_chain, draw for draw.
    """
    children = children_of(parents)
    path: list[int] = []
    row = 0
    while True:
        r = p[row]  # r_0: the target's distribution at this node
        for child in children[row]:
            x = tokens[child]
            # Accept with probability min(1, r(x) / q(x)): u < r/q, written without
            # the division. q[child, x] > 0 because x was drawn from q[child].
            if rng.random() * q[child, x] < r[x]:
                path.append(child)
                row = child + 1
                break
            # Rejected: r_s = norm(max(0, r_(s-1) - q_s)) before the next sibling.
            # NOTE: it must be renormalised; it sums to 1 - sum(min(r, q)), not 1.
            residual = np.maximum(r - q[child], 0)
            mass = residual.sum()
            if mass > 0:  # else r == q up to rounding, and this rejection had
                r = residual / mass  # probability ~0: keep r (the chain rule draws from p here too)
        else:
            # All children rejected, or a leaf (the bonus token): draw from r_k.
            return path, draw(r, rng)



def traversal_tree(
    tokens: list[int], parents: list[int], q: np.ndarray, p: np.ndarray, rng: np.random.Generator
) -> tuple[list[int], int]:
    """Traversal verification: the tree judged from the leaves towards the root, whole sequences at a time.

    Same arguments and answer as sampled_tree. Weng et al., "Traversal Verification for Speculative
    Tree Decoding" (arXiv 2505.12398, NeurIPS 2025), its verification algorithm in specdec's letters
    (p target, q draft). Every node v carries a *sequence* weight w_v (the paper's sequence-level
    acceptance probability p_alpha) and a row r_v, its target row p[v] until a child of v is rejected:

        w_root = 1,   w_c = min(1, w_v r_v(x_c) / q_c(x_c))   for a child c of v with token x_c
            (block verification's carried weight, block_weights, read along each path of the tree)
        visit the tree in post-order, first child first: a node is judged once all its children
        are gone (a leaf at once). Judging v: with probability w_v accept the whole path
        root -> v, emit a token drawn from r_v, stop. Else delete v, and at its parent u:
            s   = sum_y max(w_u r_u(y) - q_v(y), 0)        (what v's rejection leaves to be accepted)
            r_u = norm(max(w_u r_u - q_v, 0))               the SEQUENCE residual (w_u inside)
            w_u = s / (s + 1 - w_u)                          the sequence-level weight update
        and the next child of u is weighed with the new w_u and r_u. The root's weight stays 1
        (s / (s + 1 - 1)): with every child rejected, it emits a token from its residual.

    On a chain this has block verification's law (block_plan): its coins, flipped from the end, are
    block_plan's h_i (w_u after the update). On a tree a deep node can be accepted although its parent's own
    ratio p/q is small: the path is judged as a whole, and a rejected subtree leaves its residual
    to the next sibling instead of ending the round.

    Why the output law is exactly p (a proof written for this code; the paper proves it its own
    way). Claim (R): judging the subtree of a node c with weight w, given c's token,
        P(the accepted path goes through c, and what follows c, continued by the target, is s)
            = w P_target(s | the text up to c)
    for every sequence s, whatever the subtree below c is, as long as each node's children were
    drawn from their q rows (given the path and the earlier siblings). For a leaf it is the last
    step: accept with w, emit from r_c = p[c]. For a node v with children c_1 .. c_m, by induction
    over the siblings: judging from c_1 on with (w, r) must accept with total w and law r. Child
    c_1 = y (drawn from q_1) is accepted through its subtree with probability min(1, w r(y) /
    q_1(y)) by (R), which is min(q_1(y), w r(y)) unconditionally, and then its continuation follows
    p. What is missing from w r(y) is max(w r(y) - q_1(y), 0), in all s, while c_1's subtree is
    rejected with probability 1 - w + s. Conditional on that rejection, the rest must supply
    max(w r - q_1, 0) / (1 - w + s) = w' r' with w' = s / (s + 1 - w), r' = norm(max(w r - q_1, 0)):
    the same claim one sibling later, with the updated weight and row, so it holds by induction
    down to "no children left", where v itself is accepted with w' and emits from r'. Nothing in
    w', r' depends on which token c_1 was, and (R) holds for any shape of c_1's subtree, so c_1's
    subtree being rejected tells nothing about c_2's draws: the induction goes through for i.i.d.
    siblings, siblings drawn without replacement and deterministic candidates (point-mass q rows),
    and for trees whose shape reads the tokens of other branches (EAGLE-2's expansion), as long as
    a node's number of children never depends on those children's own tokens. At the root, w = 1.

    NOTE: both updates are sequence-level. The token-wise residual norm(max(r - q, 0)), or a w_u
    left unchanged after a rejection, is wrong, and only the exact law of a round shows it
    (tests/test_multidraft.py).
    """
    children = children_of(parents)

    def judge(row: int, w: float) -> tuple[list[int], int] | None:
        """The accepted (path below this node, last token), or None when this node is rejected."""
        r = p[row]  # the node's row: p[row] until a child is rejected
        for child in children[row]:
            x = tokens[child]
            # q[child, x] > 0: x was drawn from q[child].
            found = judge(child + 1, min(1.0, w * float(r[x]) / float(q[child, x])))
            if found is not None:
                below, last = found
                return [child, *below], last
            w, r = traversal_update(w, r, q[child])
        # No children left (all rejected, or a leaf): accept the path to here with probability w.
        # At the root w is 1 and this always accepts; below it, rng.random() < w fails when w = 0.
        if row == 0 or rng.random() < w:
            return [], draw(r, rng)
        return None

    found = judge(0, 1.0)
    assert found is not None, "the root is always accepted"
    return found


def traversal_update(w: float, r: np.ndarray, q: np.ndarray) -> tuple[float, np.ndarray]:
    """After a child drawn from q is rejected at a node of weight w and row r: (new w, new r).

    r -> norm(max(w r - q, 0)), the sequence residual, and w -> s / (s + 1 - w) with s its mass
    (traversal_tree). s = 0 leaves nothing to accept: w -> 0, unless w = 1 too (r == q up to
    rounding, so the rejection had probability ~0): then w stays 1 and r stays (as in sampled_chain).
    """
    residual = np.maximum(w * r - q, 0)  # [n_vocab]
    s = float(residual.sum())
    if s <= 0:
        return (1.0 if w >= 1 else 0.0), r
    # NOTE: the residual must be renormalised; it sums to s, not 1.
    # (1 - w) first: s + 1 - w rounds to 0 when s is tiny and w within rounding of 1.
    return s / (s + (1 - w)), residual / np.asarray(s, residual.dtype)

# Medusa's defaults (Cai et al., arXiv 2401.10774, section 2.3.1): epsilon and delta = sqrt(epsilon).
TYPICAL_EPS = 0.09
TYPICAL_DELTA = 0.3


def typical_tree(
    tokens: list[int],
    parents: list[int],
    p: np.ndarray,
    rng: np.random.Generator,
    eps: float = TYPICAL_EPS,
    delta: float = TYPICAL_DELTA,
) -> tuple[list[int], int]:
    """LOSSY: Medusa's typical acceptance. The output does NOT follow p.

    A drafted token x is accepted when the target finds it plausible enough:
        p(x) > min(eps, delta * exp(-H(p)))
    with H(p) the entropy of the target's row before x (Medusa, Cai et al.,
    arXiv 2401.10774, section 2.3.1; eps = 0.09, delta = 0.3 there). Of all
    root-to-node paths whose tokens all pass, the longest is kept (the first in
    tree order on ties), and `last` is drawn from p after it.

    It accepts more than the exact rule, because it never compares p with q: a
    token the draft over-proposes is accepted as often as the draft proposes
    it. So the emitted text is biased towards the draft, and the exactness
    tests fail it (a documented negative control). Use only when you accept
    that trade; nothing in specdec picks it by default.
    """
    n = len(tokens)
    entropy = -np.sum(p * np.log(np.where(p > 0, p, 1)), axis=-1)  # [n + 1]
    threshold = np.minimum(np.float32(eps), np.float32(delta) * np.exp(-entropy))  # [n + 1]
    passes = [bool(p[parent + 1, tokens[i]] > threshold[parent + 1]) for i, parent in enumerate(parents)]
    depth = [0] * n  # accepted path length through node i, 0 when some token on it fails
    for i, parent in enumerate(parents):
        if passes[i] and (parent < 0 or depth[parent] > 0):
            depth[i] = 1 + (depth[parent] if parent >= 0 else 0)
    if not any(depth):
        return [], draw(p[0], rng)
    end = int(np.argmax(depth))  # the first deepest accepted node
    path = [end]
    while parents[path[0]] >= 0:
        path.insert(0, parents[path[0]])
    return path, draw(p[end + 1], rng)


# ---------------------------------------------------------------------------
# Drawing the siblings of one node, with the q row each was drawn from.
# Each returns (tokens, q_rows [n_drawn, n_vocab]) to put into the tree.
# ---------------------------------------------------------------------------


def draw_iid(q: np.ndarray, n: int, rng: np.random.Generator) -> tuple[list[int], np.ndarray]:
    """n siblings drawn independently from the draft row q [n_vocab]; each row is q.

    Duplicates happen: a repeated token is tested again against the residual,
    which the first copy's rejection has already pushed below q there, so it is
    rarely accepted and mostly a wasted node.
    """
    tokens = [draw(q, rng) for _ in range(n)]
    return tokens, np.repeat(q[None], len(tokens), axis=0)


def draw_without_replacement(q: np.ndarray, n: int, rng: np.random.Generator) -> tuple[list[int], np.ndarray]:
    """Up to n distinct siblings: each drawn from q with the earlier ones removed, renormalised.

    Sibling s's q row is that renormalised row (EAGLE's sampling without
    replacement). Fewer than n come back when q has fewer nonzero tokens.
    """
    tokens, rows = [], []
    left = q.astype(np.float32)  # a copy
    for _ in range(n):
        mass = left.sum()
        if mass <= 0:
            break
        row = left / mass  # [n_vocab]
        token = draw(row, rng)
        tokens.append(token)
        rows.append(row)
        left[token] = 0
    return tokens, np.stack(rows)


def top_k_tokens(scores: np.ndarray, n: int, floor: float = 0.0) -> list[int]:
    """The n highest-scoring tokens of a [n_vocab] row, best first.

    scores: probabilities (tokens at probability `floor` = 0 are never proposed)
    or logits (pass floor=-np.inf). Fewer than n come back when fewer tokens
    score above the floor. Ties go to the lowest id, as in sampling.greedy.
    """
    n = min(n, int(np.count_nonzero(scores > floor)))
    if n == 0:
        return []
    kth = np.partition(scores, -n)[-n]  # the n-th highest score, without sorting 50257 values
    above = np.flatnonzero(scores > kth)
    ties = np.flatnonzero(scores == kth)[: n - len(above)]  # the lowest ids among equals
    return sorted([*above.tolist(), *ties.tolist()], key=lambda t: (-scores[t], t))


def top_k_distinct(scores: np.ndarray, n: int, floor: float = 0.0) -> tuple[list[int], np.ndarray]:
    """top_k_tokens with their q rows: deterministic siblings, so each row is a point mass on its token."""
    tokens = top_k_tokens(scores, n, floor)
    if not tokens:
        return [], np.zeros((0, len(scores)), np.float32)
    return tokens, np.stack([point_mass(t, len(scores)) for t in tokens])


# ---------------------------------------------------------------------------
# Several drafts for one position: how much can they be worth, and SpecTr's rule.
# ---------------------------------------------------------------------------

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
        raise ValueError(f"optimal_acceptance without replacement enumerates subsets of q's support: q has {n} "
                         f"nonzero tokens, at most {WOR_SUPPORT_MAX} allowed; filter q (top_k) first")  # fmt: skip
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


# ---------------------------------------------------------------------------
# Whole trees: how many drafted tokens each rule accepts on one drafted tree, in expectation.
# ---------------------------------------------------------------------------


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


def expected_accepted(tokens: list[int], parents: list[int], q: np.ndarray, p: np.ndarray,
                      verification: str = "token") -> float:  # fmt: skip
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


def iid_row(q: np.ndarray, kids: list[int]) -> np.ndarray:
    """The one q row siblings `kids` were drawn i.i.d. from; refuses siblings that report different rows."""
    q_row = q[kids[0]]
    if any(not np.array_equal(q[c], q_row) for c in kids[1:]):
        raise ValueError("verification='spectr' needs the siblings of a node drawn i.i.d. from one q row; "
                         "these siblings report different rows (drawn without replacement or distinct)")  # fmt: skip
    return q_row
