"""The chain cost model (Leviathan et al., arXiv 2211.17192, section 3) and the K policies built on it.

Formulas: tokens per round, a round's cost, the predicted speedup, the best k, the draft confidence bar
that pays (confidence_bar). K policies (the KPolicy interface of interfaces.py): FixedK, AdaptiveK,
CostModelK; config.Setup.k_policy makes one from the K a user typed (config.parse_k reads it).
Notation in costmodel/__init__.py (times in 1-token target steps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np


K_LIMIT = 32  # the most drafts a round may ask for: a verification pass over 33 tokens is far past any gain
K_NAMES = ("adaptive", "auto")


def drafts_judged(k: int, n_accepted: int) -> int:
    """Drafts a round actually tested: up to and including the first rejection.

    A round that accepts all k judged k; one that rejects at position n judged
    n + 1, and the drafts after it were dropped unjudged. Estimating alpha as
    accepted / judged (not accepted / drafted) is what matches the i.i.d. model
    behind expected_tokens_per_round.
    """
    return k if n_accepted == k else n_accepted + 1


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """E[tokens emitted per round] = (1 - alpha^(k+1)) / (1 - alpha)  (Leviathan et al., section 3, eq. 1).

    A round emits the accepted drafts plus one target token: 1 + alpha + ... + alpha^k.

        expected_tokens_per_round(0.8, 4)  # 3.36

    alpha is a probability: one outside [0, 1] (1.5, a ratio typed by mistake) is a ValueError, not an answer.
    """
    if alpha < 0 or alpha > 1:  # (nan passes: "nothing was drafted", and every formula then gives nan)
        raise ValueError(f"alpha is an acceptance rate, a probability in [0, 1]; got {alpha}")
    if alpha >= 1:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def round_cost(k: int, c: float, r: Callable[[int], float] | Sequence[float] | None = None) -> float:
    """Time of one round in target steps: k draft steps plus one verification pass over k+1 tokens."""
    return k * c + verify_cost(k + 1, r)


def verify_cost(m: float, r: Callable[[int], float] | Sequence[float] | None = None) -> float:
    """r(m), from a function, a measured list (r[m-1] for m = 1, 2, ...), or the paper's r = 1.

    A list is read linearly between its points (m may be a mean, 4.5 tokens a pass) and grows
    linearly beyond its end: the one reading of a measured curve everywhere (predictions, the race).
    """
    if r is None:
        return 1.0
    if callable(r):
        return r(m)
    if m > len(r):
        return r[-1] * m / len(r)
    i = int(m)  # the measured point at or below m (m >= 1)
    return r[i - 1] if i == m else r[i - 1] + (m - i) * (r[i] - r[i - 1])


def predicted_speedup(alpha: float, k: int, c: float, r=None) -> float:
    """Expected wall-time speedup over autoregressive decoding (Leviathan et al., section 3,
    "Walltime Improvement", when r = 1): tokens per round divided by the round's cost in target steps.

        predicted_speedup(0.8, 4, c=0.05)                 # 2.80: the paper's r = 1
        predicted_speedup(0.8, 4, c=0.05, r=costs.r)      # with a measured r(m) (timing.measure_costs)
    """
    return expected_tokens_per_round(alpha, k) / round_cost(k, c, r)


def speedup_from_rounds(n_tokens: int, k_per_round: Sequence[int], draft_steps: float, c: float, r=None) -> float:
    """The speedup a run's own rounds predict: n_tokens / (draft_steps * c + sum of r(k + 1) over the rounds).

    Eq. 1 (predicted_speedup) assumes every round drafts k tokens, each accepted
    with the same i.i.d. chance alpha; a real run's rounds vary (the n-gram
    drafter drafts nothing where the text has no match, and acceptances come in
    runs). This counts what the run did and prices it with the measured c and
    r(m): what is left between it and the wall clock is time the model does not
    describe (the sampler's own work) and noise.

        speedup_from_rounds(len(out.tokens), out.k_per_round, out.draft_steps, costs.c, costs.r)
    """
    steps = draft_steps * c + sum(verify_cost(k + 1, r) for k in k_per_round)
    return n_tokens / steps if steps else float("nan")


def best_k(alpha: float, c: float, r=None, k_max: int = 8) -> tuple[int, float]:
    """The k in 1..k_max with the highest predicted speedup (the paper's optimal gamma,
    section 3, "Choosing gamma"), and that speedup. Returns (0, 1.0) when no k beats plain decoding.

        best_k(0.9, c=0.05)   # (8, 4.38): cheap drafts, high acceptance, long drafts
    """
    best = max(range(1, k_max + 1), key=lambda k: predicted_speedup(alpha, k, c, r))
    speedup = predicted_speedup(alpha, best, c, r)
    return (best, speedup) if speedup > 1 else (0, 1.0)


def confidence_bar(c: float, r=None) -> float:
    """The draft confidence bar this machine's costs set (draft_confidence="auto", drafters/stopping.py).

    A draft earns one token when it is accepted, and costs its draft step (c) and its row in the verification
    pass (r(2) - r(1) for a round's first draft, in target steps): against plain decoding it breaks even when its
    chance of acceptance is c + r(2) - 1. That is the bar for a round's first draft, and against plain decoding:
    a later draft's row costs r(j + 2) - r(j + 1), usually less, so one bar cuts deeper drafts a little early; and
    where speculation already runs at a speedup S, a draft lifts it only if its chance beats S times its cost,
    so on a GPU (r(2) about 1, the bar about c) the speedup-maximising bar is higher by about S. On 2 CPU cores
    (r(2) about 1.25, c about 0.03 for an EAGLE head, S about 1) it is about 0.3. A round that drafts nothing
    still paid for the draft step that judged its first position. Kept within [0.001, 1].

        confidence_bar(0.03, [1.0, 1.26, 1.39])   # 0.29
    """
    return round(min(1.0, max(1e-3, c + verify_cost(2, r) - 1)), 3)


@dataclass
class FixedK:
    """The papers' setting: k drafts every round. speculative_sample(..., K=4) means FixedK(4)."""

    k: int

    def __post_init__(self):
        if not isinstance(self.k, (int, np.integer)) or isinstance(self.k, bool) or self.k < 1:
            raise ValueError(f"K (draft tokens per round) must be an integer >= 1, got {self.k!r}")
        self.k = int(self.k)

    @property
    def k_max(self) -> int:
        return self.k

    def next_k(self) -> int:
        return self.k

    def update(self, k: int, n_accepted: int) -> None:
        """Nothing to learn: k stays."""


class AdaptiveK:
    """Grow K by one after a round whose drafts were all accepted; shrink it by one
    after a rejection; always within [k_min, k_max]. A simple heuristic: long
    runs of agreement (repetitive text, an easy stretch) earn longer drafts.

        speculative_sample(target, draft, ids, 40, K=AdaptiveK(k_start=4, k_min=1, k_max=8))
    """

    def __init__(self, k_start: int = 4, k_min: int = 1, k_max: int = 8):
        if not 1 <= k_min <= k_start <= k_max:
            raise ValueError(f"adaptive K needs 1 <= k_min <= K <= k_max, got {k_min}, {k_start}, {k_max}")
        self.k, self.k_min, self.k_max = k_start, k_min, k_max

    def next_k(self) -> int:
        return self.k

    def update(self, k: int, n_accepted: int) -> None:
        if n_accepted == k:
            self.k = min(self.k_max, self.k + 1)
        else:
            self.k = max(self.k_min, self.k - 1)


class CostModelK:
    """A K policy for speculative_sample (`--K auto`): before each round, pick the k
    with the best predicted speedup for the measured costs and the acceptance
    rate seen recently.

    The acceptance estimate is a decaying average over judged drafts (memory of
    about 1 / (1 - decay) rounds), so it follows the text: a repetitive stretch
    earns long drafts, a hard one short drafts. It starts from `prior_alpha`,
    weighted as `prior_weight` drafts. k never drops below 1: with no drafting
    there would be nothing left to learn the acceptance rate from.

        costs = measure_costs(target, draft, ids)
        speculative_sample(target, draft, ids, 40, K=CostModelK(costs.c, costs.r))   # or K="auto"
    """

    def __init__(
        self, c: float, r=None, k_max: int = 8, prior_alpha: float = 0.6, prior_weight: float = 8.0, decay: float = 0.9
    ):
        if not (0 <= prior_alpha <= 1 and c >= 0 and k_max >= 1 and 0 < decay <= 1):
            raise ValueError("CostModelK needs 0 <= prior_alpha <= 1, c >= 0, k_max >= 1 and 0 < decay <= 1")
        self.c, self.r, self.k_max, self.decay, self.prior_alpha = c, r, k_max, decay, prior_alpha
        self.accepted, self.judged = prior_alpha * prior_weight, prior_weight

    @property
    def alpha(self) -> float:
        return self.accepted / self.judged

    def next_k(self) -> int:
        return max(1, best_k(self.alpha, self.c, self.r, self.k_max)[0])

    def update(self, k: int, n_accepted: int) -> None:
        self.accepted = self.decay * self.accepted + n_accepted
        self.judged = self.decay * self.judged + drafts_judged(k, n_accepted)
