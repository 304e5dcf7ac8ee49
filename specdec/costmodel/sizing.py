"""How many of a drafter's ranked candidates to verify: 0, a few or many, by expected gain against r(m).

A drafter without a model (a lookup in the text, a suffix tree, a datastore) proposes deterministic candidates
and can say how likely each one is to be accepted; drafting costs it nothing per token. What decides its size is
then the target's verification pass alone, and on a CPU that pass is far from the paper's r = 1: on 2 cores
SmolLM2's r(2) is about 1.6 (NumPy's first extra token leaves BLAS's matrix-vector kernel) while r(17) is under
3. So a round should verify nothing unless its first candidate is likely, and many tokens when they all are.

In the letters of Leviathan et al. (arXiv 2211.17192, section 3): a round that drafts gamma tokens emits
E[tokens] = 1 + alpha + ... + alpha^gamma for i.i.d. acceptance alpha (eq. 1) and costs gamma c + r(gamma + 1)
target steps, whose ratio is the walltime improvement. Here the candidates are a tree (a chain is its special
case) and their acceptance is not i.i.d.: node v of a proposed tree is on the accepted path with probability
P(v), the product along its path of each token's chance given the path before it (SpecInfer, Miao et al.,
arXiv 2305.09781; Sequoia, Chen et al., arXiv 2402.12374, section 3, sums the same way). Siblings are exclusive
events, so the round emits, on average, its accepted nodes plus the target's own token:

    E[tokens | the first n candidates] = 1 + P_1 + ... + P_n
    speedup(n) = (1 + P_1 + ... + P_n) / (c_0 + r(n + 1))

with the candidates listed best first (P_1 >= P_2 >= ...; a child is never likelier than its parent, so every
prefix of that list is a connected tree, and the best tree of n nodes). c_0 is what the drafter pays per round
whatever n is (a lookup: almost nothing); gamma c is 0, as a looked-up token costs no draft pass. best_size
returns the n in 0..n_max with the highest speedup(n); n = 0, verifying nothing, is speedup 1 / (c_0 + 1): plain
decoding. So the rule abstains unless P_1 > c_0 + r(2) - 1 (about 0.6 here: costmodel.confidence_bar's bar),
and drafts 16 tokens only where their sum of P beats r(17) - 1 (about 2).

Layer: as costmodel/ (arithmetic only; chain.verify_cost reads a curve the way the rest of specdec does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .chain import verify_cost

# r(m) for SmolLM2-135M on a 2-core AMD EPYC (AVX2), one process, load 2, measured with timing.measure_costs's
# interleaved passes: the default a model-free drafter prices its rounds with until it is given a measured curve.
SMOLLM2_CPU_R = {1: 1.0, 2: 1.59, 3: 1.85, 5: 2.13, 9: 2.31, 17: 2.92, 33: 3.84}


@dataclass(frozen=True)
class PointsCurve:
    """r(m) from measurements at a few m: straight lines between them, and r(m_last) m / m_last past the last
    (as chain.verify_cost grows a measured list past its end).

    >>> PointsCurve({1: 1.0, 2: 1.6, 5: 2.2})(3.5), PointsCurve({1: 1.0, 2: 1.6})(4)
    (1.9, 3.2)
    """

    points: Mapping[int, float]  # {m: r(m)}; must hold m = 1

    def __post_init__(self):
        if 1 not in self.points or any(m < 1 or r <= 0 for m, r in self.points.items()):
            raise ValueError(f"an r(m) curve needs r(1) and positive r at m >= 1, got {dict(self.points)}")

    def __call__(self, m: float) -> float:
        ms = sorted(self.points)
        if m >= ms[-1]:
            return self.points[ms[-1]] * m / ms[-1]
        return float(np.interp(m, ms, [self.points[x] for x in ms]))

    def values(self, m_max: int) -> np.ndarray:
        """r(1), .., r(m_max) at once.  [m_max]"""
        ms, last = sorted(self.points), max(self.points)
        m = np.arange(1, m_max + 1, dtype=np.float64)
        inside = np.interp(m, ms, [self.points[x] for x in ms])
        return np.where(m >= last, self.points[last] * m / last, inside)


def as_curve(r) -> Callable[[float], float] | Sequence[float] | None:
    """What verify_cost reads: a measured list (r[m-1]), a function, None (r = 1), or {m: r(m)} at a few m."""
    return PointsCurve(dict(r)) if isinstance(r, Mapping) else r


def curve_values(r, m_max: int) -> np.ndarray:
    """r(1), .., r(m_max) of any curve verify_cost reads, or of {m: r(m)}.  [m_max]

    >>> curve_values({1: 1.0, 3: 2.0}, 4).tolist()
    [1.0, 1.5, 2.0, 2.6666666666666665]
    """
    curve = as_curve(r)
    if isinstance(curve, PointsCurve):
        return curve.values(m_max)
    if isinstance(curve, (Sequence, np.ndarray)) and len(curve) >= m_max:
        return np.asarray(curve[:m_max], dtype=np.float64)  # measured that far: read as it is
    return np.array([verify_cost(m, curve) for m in range(1, m_max + 1)], dtype=np.float64)


def expected_tokens_by_size(path_probs: Sequence[float]) -> np.ndarray:
    """E[tokens per round] when the first n candidates are verified, for n = 0 .. len(path_probs).  [n + 1]

    >>> expected_tokens_by_size([0.9, 0.5]).tolist()
    [1.0, 1.9, 2.4]
    """
    return 1.0 + np.concatenate([[0.0], np.cumsum(np.asarray(path_probs, dtype=np.float64))])


def best_size(path_probs: Sequence[float], r=None, n_max: int | None = None, c0: float = 0.0) -> tuple[int, float]:
    """(n, speedup(n)): how many of the candidates (best first, P(v on the accepted path) each) pay the most.

    r: the verification curve (a list r[m-1], a function, {m: r(m)}, or None for the paper's r = 1).
    The smallest n wins a tie, so n = 0 (plain decoding) unless drafting is strictly better.

        best_size([0.95] * 20, SMOLLM2_CPU_R)   # (20, ...): a long certain run is worth r(21)
        best_size([0.4], SMOLLM2_CPU_R)         # (0, 1.0): one unsure token does not pay r(2) = 1.59
    """
    probs = list(path_probs)[:n_max]
    assert all(b <= a + 1e-9 for a, b in zip(probs, probs[1:])), "candidates must come best first"
    tau = expected_tokens_by_size(probs)  # [n + 1]
    cost = c0 + curve_values(r, len(tau))  # [n + 1] target steps: r(1) .. r(n + 1)
    speedups = tau / cost
    n = int(np.argmax(speedups))  # the first of equal maxima: the fewest tokens
    return n, float(speedups[n])
