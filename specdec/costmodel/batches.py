"""The cost model for batches: B sequences decoded together (batch.py), one target pass per round."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .chain import best_k

# B sequences decoded together (batch.py), each round ONE target pass over all of them.
#
# Rows are independent (each accepts its own drafts with the same alpha), so each
# row still emits expected_tokens_per_round(alpha, k) tokens per round. What a
# batch changes is the price of a round. Measured in units of T_B, one batched
# 1-token step (B rows of one token each):
#     c_B      one batched draft step (B rows) / T_B
#     r_B(m)   one target pass over B rows of m tokens / T_B
# so against batched autoregressive decoding at the same B,
#     S_B(k) = E[tokens per row per round] / (k c_B + r_B(k + 1)),
# the formula of predicted_speedup with the batch's own c_B and r_B.
#
# Why speculation stops paying: a 1-token step is memory-bound (its time is
# reading the weights), so B rows of one token cost little more than one row,
# and a pass over B*m rows is nearly free only while B*m rows stay memory-bound.
# As B grows the verification pass turns compute-bound: r_B(m) climbs from
# r_1(m) (about 2 for m = 5 here) towards m, while E[tokens] stays the same,
# so S_B falls and the best k shrinks, to 0 (no speculation) at some batch size.


def best_k_batch(alpha: float, costs: dict, k_max: int = 8) -> dict:
    """{B: (best k, predicted speedup)} for each batch size, from {B: (c_B, r_B)} (r_B a list or a function).

    k = 0 (speedup 1.0) where no k beats batched autoregressive decoding.

        best_k_batch(0.8, {1: (0.0, [1, 1.2, 1.4, 1.6, 1.8]), 16: (0.0, [1, 2, 3, 4, 5])})
        # {1: (4, 1.87), 16: (0, 1.0)}
    """
    return {b: best_k(alpha, c, r, k_max) for b, (c, r) in sorted(costs.items())}


def batch_break_even(best: dict) -> int | None:
    """The smallest batch size whose best k is 0 (speculation no longer pays), from best_k_batch; None if none."""
    return next((b for b, (k, _) in sorted(best.items()) if k == 0), None)


@dataclass
class BatchPassTimes:
    """Measured seconds of batched passes, for pricing a batch run's rounds (speedup_from_batch_rounds).

    step[b] = one b-row, 1-token target step (T_b); r[b][m-1] = r_b(m); c[b] = c_b.
    tokens[b], where measured, = (n_tok grid, seconds): a pass over n_tok new tokens
    in all, spread over min(b, n_tok) rows. A pass's price is mostly its weight
    products over all n_tok rows, and kernels.linear switches kernels at a row count
    (16), so a ragged round is priced by its own n_tok on this curve, with grid points
    on both sides of the switch; without it, by r_b at n_tok / b tokens per row.
    A round with b rows, not measured, is priced at the next measured batch size up
    (rows leave as they finish, so the last rounds of a run are smaller batches).
    """

    step: dict  # {b: seconds}
    r: dict  # {b: [r_b(1) = 1, r_b(2), ...]}
    c: dict  # {b: c_b}
    tokens: dict = field(default_factory=dict)  # {b: ([n_tok, ...] increasing, [seconds, ...])}

    def size(self, b: int) -> int:
        return min((s for s in self.step if s >= b), default=max(self.step))

    def pass_seconds(self, b: int, m: float) -> float:
        """One target pass over b rows of m tokens each on average (a ragged pass: m = n_tok / b)."""
        s = self.size(b)
        if s in self.tokens:  # the measured curve, at the round's own n_tok
            grid, seconds = self.tokens[s]
            n = m * b
        else:  # r_s as a curve over s rows of 1, 2, ... tokens, at s rows of m tokens
            grid = [s * i for i in range(1, len(self.r[s]) + 1)]
            seconds = [self.step[s] * r for r in self.r[s]]
            n = m * s
        # Linear between grid points; beyond the last, growing linearly (as verify_cost does).
        return float(np.interp(n, grid, seconds)) if n <= grid[-1] else seconds[-1] * n / grid[-1]

    def draft_seconds(self, b: int) -> float:
        s = self.size(b)
        return self.step[s] * self.c[s]


def speedup_from_batch_rounds(rounds, ar_steps, times: BatchPassTimes) -> float:
    """The speedup a batch run's own rounds predict over batched autoregressive decoding.

    rounds: per round (rows in the batch b, the drafts of each row [k_1 .. k_b], batched draft passes);
    a round costs draft passes x c_b T_b + one pass over the rows' sum(k + 1) tokens
    (BatchPassTimes.pass_seconds; rows that drafted fewer, or nothing, make the pass smaller).
    ar_steps: per autoregressive step, the rows in the batch (each step one b-row, 1-token pass).
    Both runs emit the same tokens, so the speedup is the ratio of the times. Prefill passes
    are left out of both (the same prompts either way).

        speedup_from_batch_rounds([(2, [4, 4], 4), (2, [4, 0], 4), (1, [2], 2)], [2] * 10, times)
    """
    spec = sum(
        n_draft * times.draft_seconds(b) + times.pass_seconds(b, sum(k + 1 for k in ks) / b)
        for b, ks, n_draft in rounds
    )
    ar = sum(times.pass_seconds(b, 1) for b in ar_steps)
    return ar / spec if spec else float("nan")
