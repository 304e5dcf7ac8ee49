"""Drawing the siblings of one tree node, with the q row each was drawn from.

Each returns (tokens, q_rows [n_drawn, n_vocab]) to put into the tree; trees.sampled_tree is
exact for all three as long as the rows are the ones the tokens were drawn from.
"""

from __future__ import annotations

import numpy as np

from ..sampling import draw, point_mass


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
