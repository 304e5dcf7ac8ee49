"""Token-wise verification of a chain: each draft judged on its own row of the target.

Steps 3-4 of Leviathan et al. (arXiv 2211.17192), Algorithm 1; the same rule as Chen et al.
(arXiv 2302.01318), Algorithm 2, and its temperature-0 branch. p is the TARGET's distribution,
q the DRAFT's; logits row i verifies drafts[i], row k gives the bonus token (verify/__init__.py).
"""

from __future__ import annotations

import numpy as np

from ..sampling import draw, greedy


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
