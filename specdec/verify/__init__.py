"""Verification: which drafted tokens the target accepts, and the token it adds.

Steps 3-4 of Leviathan et al. (arXiv 2211.17192), Algorithm 1; the same rule
as Chen et al. (arXiv 2302.01318), Algorithm 2. Letters as in Leviathan et al.:
p is the TARGET's distribution, q the DRAFT's (Chen et al. swap them).

`verify` (below) takes a Proposal and the target's logits over [ids[-1], *tokens]
and returns (path, last): the indices of the accepted tokens, in order, and the
token the target emits after them. Row 0 of the logits is the target's
distribution for proposal node 0's position; row i + 1 for the children of node i.
For a chain that means: logits row i verifies tokens[i], and row n (after the
last draft) gives the bonus token when all n are accepted.

The rules, one file per idea, all importable from here (`from specdec.verify import block_chain`):
    chain.py       token-wise: each draft judged on its own row (greedy_chain, sampled_chain)
    block.py       block verification: the drafts judged jointly (Sun et al.,
                   arXiv 2403.10444): never fewer accepted tokens in expectation
    trees.py       several candidates per position, verified in the same one pass:
                   greedy_tree (temperature 0), sampled_tree (exact multi-candidate
                   speculative sampling, SpecInfer), traversal_tree (leaves to root,
                   whole sequences, Weng et al.), typical_tree (Medusa's typical
                   acceptance: LOSSY, an explicit opt-in)
    spectr.py      SpecTr's k-sequential selection of i.i.d. siblings (Sun et al.)
    siblings.py    the ways of drawing siblings that sampled_tree keeps exact:
                   draw_iid, draw_without_replacement, top_k_distinct
    multidraft.py  what several drafts for one position can be worth at best
                   (optimal_acceptance: the bound no exact rule passes); for a whole
                   drafted tree, each rule's exact law of accepted tokens
                   (accepted_law, expected_accepted) and the bound for its first
                   position (first_position_bound)
On a chain every tree rule makes the chain rule's decisions with the same random
draws, so `verify` uses the chain rules for chains (they read as the papers do)
and the tree rules for the rest.

Why the sampled rule is exact: for any token y at a position,
    P(emit y) = q(y) min(1, p(y)/q(y)) + P(reject) * norm(max(0, p - q))(y)
              = min(q(y), p(y)) + (1 - sum_x min(p(x), q(x))) * max(0, p(y) - q(y)) / sum_x max(0, p(x) - q(x))
and since sum_x max(0, p - q) = 1 - sum_x min(p, q), the second term is
max(0, p(y) - q(y)); min(q, p) + max(0, p - q) = p(y). (Leviathan et al.,
Appendix A.1; Chen et al., Theorem 1.)

Layer: the round's rules, beside speculative.py. May import NumPy, interfaces.py, sampling.py and
the modules of verify/ itself (the files above import only each other, downwards: chain and block
first, multidraft last); never model/, drafters or the samplers (tests/test_imports.py).
"""

from __future__ import annotations

import numpy as np

from ..interfaces import Proposal
from ..sampling import SamplingParams, probabilities
from .block import block_chain, block_plan, block_weights, token_weights
from .chain import greedy_chain, sampled_chain
from .multidraft import (
    WOR_SUPPORT_MAX,
    accepted_law,
    expected_accepted,
    first_position_bound,
    optimal_acceptance,
    specinfer_acceptance,
    specinfer_iid_acceptance,
)
from .siblings import draw_iid, draw_without_replacement, top_k_distinct, top_k_tokens
from .spectr import iid_row, spectr_acceptance, spectr_plan, spectr_tree
from .trees import (
    TREE_VERIFICATION,
    TYPICAL_DELTA,
    TYPICAL_EPS,
    children_of,
    greedy_tree,
    sampled_tree,
    traversal_tree,
    traversal_update,
    typical_tree,
)

ACCEPTANCE = ("exact", "typical")  # the rules speculative_sample offers; "typical" is lossy
VERIFICATION = ("token", "block")  # how an exact rule judges a chain: draft by draft, or the block jointly

__all__ = [
    "ACCEPTANCE",
    "VERIFICATION",
    "TREE_VERIFICATION",
    "verify",
    # chains
    "greedy_chain",
    "sampled_chain",
    "block_chain",
    "block_plan",
    "block_weights",
    "token_weights",
    # trees
    "children_of",
    "greedy_tree",
    "sampled_tree",
    "traversal_tree",
    "traversal_update",
    "typical_tree",
    "TYPICAL_EPS",
    "TYPICAL_DELTA",
    "spectr_plan",
    "spectr_acceptance",
    "spectr_tree",
    "iid_row",
    # siblings
    "draw_iid",
    "draw_without_replacement",
    "top_k_tokens",
    "top_k_distinct",
    # what several drafts are worth
    "WOR_SUPPORT_MAX",
    "optimal_acceptance",
    "specinfer_acceptance",
    "specinfer_iid_acceptance",
    "accepted_law",
    "expected_accepted",
    "first_position_bound",
]


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
