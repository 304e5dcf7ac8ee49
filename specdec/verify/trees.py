"""Tree rules: several candidates per position, verified in the same one target pass.

On a chain, sampled_tree makes chain.sampled_chain's decisions with the same random draws, and
traversal_tree has block.block_chain's law. SpecTr's rule for i.i.d. siblings is in spectr.py;
how siblings are drawn, in siblings.py.

A tree of n drafted nodes is two lists, parents first (model/attention.tree_mask):
tokens[i] is node i's token, parents[i] its parent node or -1 for a child of
the root, the text's last token ids[-1]. The target pass over [ids[-1], *tokens]
gives row 0 (after the root) and row i + 1 (after node i: for node i's
children, or the bonus token when node i ends the accepted path as a leaf).
Every rule walks down from the root and returns (path, last); the round emits
[tokens[i] for i in path] + [last], between 1 and depth + 1 tokens per pass.
"""

from __future__ import annotations

import numpy as np

from ..sampling import draw, greedy

# How an exact rule judges a tree: SpecInfer (sampled_tree), SpecTr (spectr.spectr_tree), or leaves to root.
TREE_VERIFICATION = ("token", "spectr", "traversal")


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
