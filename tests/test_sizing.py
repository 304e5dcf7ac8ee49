"""How many ranked deterministic candidates a round verifies (costmodel/sizing.py): the size that maximises
(1 + P_1 + .. + P_n) / r(n + 1), against brute force, on hand-made r(m) curves."""

from __future__ import annotations

import numpy as np
import pytest

from specdec.costmodel import SMOLLM2_CPU_R, PointsCurve, best_size, curve_values, expected_tokens_by_size, verify_cost


def flat(m: float) -> float:  # the papers' r = 1 (a GPU's idle compute)
    return 1.0


def linear(m: float) -> float:  # no gain from verifying tokens together
    return float(m)


def test_weak_evidence_abstains_where_the_first_extra_token_is_dear_and_strong_evidence_drafts_long():
    assert best_size([0.4], SMOLLM2_CPU_R) == (0, 1.0)  # 1.4 tokens for r(2) = 1.59 steps
    assert best_size([0.4], flat)[0] == 1  # on a GPU it pays
    assert best_size([0.7], SMOLLM2_CPU_R)[0] == 1  # above r(2) - 1 = 0.59
    certain = [0.98**i for i in range(1, 33)]
    n, speedup = best_size(certain, SMOLLM2_CPU_R)
    assert n == 32 and speedup == pytest.approx((1 + sum(certain)) / 3.84)  # 32 tokens for r(33)
    assert best_size(certain, linear) == (0, 1.0)  # r(m) = m: nothing pays unless certain
    fading = [0.9**i for i in range(1, 33)]  # a few likely tokens, then a long unlikely tail
    assert 4 <= best_size(fading, SMOLLM2_CPU_R)[0] < 32
    assert best_size(certain, SMOLLM2_CPU_R, n_max=5)[0] == 5
    assert best_size([], SMOLLM2_CPU_R) == (0, 1.0)


def test_the_size_is_brute_force_s_best():
    rng = np.random.default_rng(0)
    for _ in range(200):
        probs = np.sort(rng.random(int(rng.integers(1, 33))) ** rng.uniform(0.1, 3))[::-1].tolist()
        points = {1: 1.0, **{m: 1.0 + float(rng.uniform(0.1, 1.0)) * np.log2(m) for m in (2, 4, 8, 16, 33)}}
        curve = PointsCurve(points)
        c0 = float(rng.uniform(0, 0.1))
        speedups = [(1 + sum(probs[:n])) / (c0 + curve(n + 1)) for n in range(len(probs) + 1)]
        want = int(np.argmax(speedups))
        assert best_size(probs, points, c0=c0) == (want, pytest.approx(speedups[want]))


def test_a_curve_from_a_few_points_and_its_values():
    curve = PointsCurve(SMOLLM2_CPU_R)
    assert curve(1) == 1.0 and curve(5) == 2.13 and curve(4) == pytest.approx((1.85 + 2.13) / 2)
    assert curve(66) == pytest.approx(3.84 * 2)  # past the last point: growing as m
    np.testing.assert_allclose(curve_values(SMOLLM2_CPU_R, 40), [curve(m) for m in range(1, 41)])
    measured = [1.0, 1.6, 1.9]  # a list, as timing.measure_costs returns: read as verify_cost reads it
    np.testing.assert_allclose(curve_values(measured, 5), [verify_cost(m, measured) for m in range(1, 6)])
    np.testing.assert_allclose(curve_values(flat, 3), [1.0, 1.0, 1.0])
    assert expected_tokens_by_size([0.9, 0.5]).tolist() == [1.0, 1.9, 2.4]
    with pytest.raises(ValueError, match="needs r\\(1\\)"):
        PointsCurve({2: 1.5})
    with pytest.raises(AssertionError, match="best first"):
        best_size([0.2, 0.5], SMOLLM2_CPU_R)
