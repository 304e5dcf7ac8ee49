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
from .sampling import SamplingParams, draw, greedy, probabilities


def verify(
    proposal: Proposal, logits: np.ndarray, params: SamplingParams, rng: np.random.Generator
) -> tuple[list[int], int]:
    """(accepted node indices, root first; the token the target emits after them).

    logits: [n+1, n_vocab], the target's rows over [ids[-1], *proposal.tokens].
    """
    assert proposal.is_chain, "token trees need the tree rules; this module has the chain rules"
    if params.greedy:
        n_accepted, last = greedy_chain(proposal.tokens, logits)
    else:
        n_accepted, last = sampled_chain(proposal.tokens, proposal.q, probabilities(logits, params), rng)
    return list(range(n_accepted)), last


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
