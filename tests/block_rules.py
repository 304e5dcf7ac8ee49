"""Block verification's test kit: the exact law of one round, and deliberately broken block rules.

A chain rule is written here as a *plan* (drafts, q, p) -> (stop [k+1], rows [k+1, n_vocab]):
the probability of keeping exactly the first i drafts, and the distribution of the token emitted
after them; verify.block_plan is the library's. `chain_rule(plan)` turns a plan into a rule with
verify.sampled_chain's signature (two draws, as verify.block_chain does), so the same broken plan
runs through both the exact enumeration (test_block.py) and the chi-square test.
"""

from __future__ import annotations

import itertools

import numpy as np

from specdec.sampling import draw


def generic_block_plan(drafts, q, p, carry=True, residual_weight="carried", first_coin_wins=False):
    """Block verification with one switch per classic mistake (all defaults: the correct rule).

    carry=False              w_i = min(1, p/q) of draft i alone, not carried along the block
    residual_weight          "carried": max(w_i p - q, 0) (correct); "none": max(p - q, 0), the
                             token-wise residual; "last_row": the weight of the last row's ratio only,
                             min(1, p/q) of draft i-1
    first_coin_wins=True     tau = the SMALLEST i whose coin succeeds (Algorithm 2 keeps the largest)
    """
    k = len(drafts)
    ratio = [min(1.0, float(p[i, x]) / float(q[i, x])) for i, x in enumerate(drafts)]
    w = [1.0]
    for i in range(k):
        w.append(min(1.0, w[-1] * float(p[i, drafts[i]]) / float(q[i, drafts[i]])) if carry else ratio[i])
    rows = np.zeros((k + 1, p.shape[-1]))
    h = np.ones(k + 1)
    for i in range(k):
        weight = {"carried": w[i], "none": 1.0, "last_row": ratio[i - 1] if i else 1.0}[residual_weight]
        residual = np.maximum(weight * p[i].astype(np.float64) - q[i], 0)
        rows[i] = residual / residual.sum() if residual.sum() > 0 else p[i]
        r = np.maximum(w[i] * p[i].astype(np.float64) - q[i], 0).sum()
        if i > 0:
            h[i] = r / (r + 1 - w[i]) if r + 1 - w[i] > 0 else 1.0
    rows[k] = p[k]
    h[k] = w[k]
    stop = np.zeros(k + 1)
    if first_coin_wins:  # coins 1..k in order, the first success wins; none: 0
        left = 1.0
        for i in range(1, k + 1):
            stop[i] = left * h[i]
            left *= 1 - h[i]
        stop[0] = left
    else:  # from the end: tau = the largest i with a success
        left = 1.0
        for i in range(k, -1, -1):
            stop[i] = left * h[i]
            left *= 1 - h[i]
    return stop, rows


def token_plan(drafts, q, p):
    """The token-wise rule (verify.sampled_chain) as a plan: accept draft i with min(1, p/q), in order."""
    k = len(drafts)
    stop, rows, keep = np.zeros(k + 1), np.zeros((k + 1, p.shape[-1])), 1.0
    for i, x in enumerate(drafts):
        a = min(1.0, float(p[i, x]) / float(q[i, x]))
        stop[i] = keep * (1 - a)
        residual = np.maximum(p[i].astype(np.float64) - q[i], 0)
        rows[i] = residual / residual.sum() if residual.sum() > 0 else p[i]
        keep *= a
    stop[k], rows[k] = keep, p[k]
    return stop, rows


def residual_without_weight(drafts, q, p):
    return generic_block_plan(drafts, q, p, residual_weight="none")


def residual_weight_from_last_row(drafts, q, p):
    return generic_block_plan(drafts, q, p, residual_weight="last_row")


def weights_not_carried(drafts, q, p):
    return generic_block_plan(drafts, q, p, carry=False)


def first_coin_wins(drafts, q, p):
    return generic_block_plan(drafts, q, p, first_coin_wins=True)


BROKEN_PLANS = (residual_weight_from_last_row, weights_not_carried, first_coin_wins, residual_without_weight)


def chain_rule(plan):
    """A plan as a chain rule with verify.sampled_chain's signature: draw how many to keep, then the next token."""

    def rule(drafts, q, p, rng):
        stop, rows = plan(drafts, q, p)
        n = draw(np.asarray(stop, np.float64), rng)
        return n, draw(np.asarray(rows[n], np.float64), rng)

    rule.__name__ = plan.__name__
    return rule


# --- small worlds: a target p and a draft q given every prefix ------------------------------


class World:
    """Context-dependent p(. | prefix) and q(. | prefix) on a vocabulary of V tokens, drawn at random.

    sharpness: Dirichlet concentration (small = peaky rows). Rows are float32, as specdec's are.
    point_q: the draft is deterministic (a point mass on a random token), as n-gram drafts are.
    """

    def __init__(self, V: int, seed: int, sharpness: float = 0.7, point_q: bool = False):
        self.V, self.rng, self.sharpness, self.point_q = V, np.random.default_rng(seed), sharpness, point_q
        self._p: dict[tuple, np.ndarray] = {}
        self._q: dict[tuple, np.ndarray] = {}

    def _row(self) -> np.ndarray:
        row = self.rng.dirichlet(np.full(self.V, self.sharpness)).astype(np.float32)
        return row / row.sum()

    def p(self, prefix: tuple) -> np.ndarray:
        if prefix not in self._p:
            self._p[prefix] = self._row()
        return self._p[prefix]

    def q(self, prefix: tuple) -> np.ndarray:
        if prefix not in self._q:
            if self.point_q:
                row = np.zeros(self.V, np.float32)
                row[self.rng.integers(self.V)] = 1
                self._q[prefix] = row
            else:
                self._q[prefix] = self._row()
        return self._q[prefix]

    def target(self, seq: tuple) -> float:
        """P(seq) under the target, by the chain rule."""
        return float(np.prod([self.p(seq[:i])[t] for i, t in enumerate(seq)], dtype=np.float64))


def round_law(world: World, plan, k: int) -> dict[tuple, float]:
    """{output: probability} of one round: k drafts from q, judged by `plan` against p.

    Outputs have 1..k+1 tokens (the accepted drafts and the token after them).
    """
    law: dict[tuple, float] = {}
    for drafts in itertools.product(range(world.V), repeat=k):
        prob_drafts = float(np.prod([world.q(drafts[:i])[x] for i, x in enumerate(drafts)], dtype=np.float64))
        if prob_drafts == 0:
            continue
        q = np.stack([world.q(drafts[:i]) for i in range(k)]) if k else np.zeros((0, world.V), np.float32)
        p = np.stack([world.p(drafts[:i]) for i in range(k + 1)])
        stop, rows = plan(list(drafts), q, p)
        rows = rows / rows.sum(axis=-1, keepdims=True)  # verify.block_plan's rows are unnormalised
        for n in range(k + 1):
            for y in range(world.V):
                mass = prob_drafts * float(stop[n]) * float(rows[n][y])
                if mass > 0:
                    out = (*drafts[:n], y)
                    law[out] = law.get(out, 0.0) + mass
    return law


def completed_law(world: World, law: dict[tuple, float], length: int) -> dict[tuple, float]:
    """The round's output continued by the target itself to `length` tokens: what the next rounds see.

    Exactness of a round means this equals the target's own law of `length` tokens, for every
    sequence (the target alone, or a round and then the target, give the same text).
    """
    out: dict[tuple, float] = {}
    for seq in itertools.product(range(world.V), repeat=length):
        total = 0.0
        for n in range(1, length + 1):
            head = seq[:n]
            if head in law:  # the round emitted `head`; the target writes the rest
                rest = [world.p(seq[:j])[seq[j]] for j in range(n, length)]
                total += law[head] * float(np.prod(rest, dtype=np.float64))
        out[seq] = total
    return out


def law_error(world: World, plan, k: int) -> float:
    """max over (k+1)-token sequences of |P(round, then target) - P(target)|."""
    completed = completed_law(world, round_law(world, plan, k), k + 1)
    return max(abs(v - world.target(s)) for s, v in completed.items())


def draft_rounds(world: World, k: int):
    """Every draft sequence of length k the draft can propose: (drafts, its probability, q [k, V], p [k+1, V])."""
    for drafts in itertools.product(range(world.V), repeat=k):
        prob_drafts = float(np.prod([world.q(drafts[:i])[x] for i, x in enumerate(drafts)], dtype=np.float64))
        if prob_drafts == 0:
            continue
        q = np.stack([world.q(drafts[:i]) for i in range(k)])
        p = np.stack([world.p(drafts[:i]) for i in range(k + 1)])
        yield list(drafts), prob_drafts, q, p


def expected_accepted(world: World, plan, k: int) -> float:
    """E[accepted drafts in one round], exactly: sum over drafts of Q(drafts) * sum_i i * stop[i]."""
    total = 0.0
    for drafts, prob_drafts, q, p in draft_rounds(world, k):
        stop, _ = plan(drafts, q, p)
        total += prob_drafts * float(np.arange(k + 1) @ np.asarray(stop, np.float64))
    return total
