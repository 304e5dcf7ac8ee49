"""The cost model (Leviathan et al., section 3) and the timing harness."""

import math

import numpy as np
import pytest

from specdec.costmodel import CostModelK, best_k, expected_tokens_per_round, predicted_speedup, verify_cost
from specdec.harness import measure_costs, race

from conftest import tiny_model
from test_samplers import perturbed


def test_expected_tokens_per_round():
    assert expected_tokens_per_round(0.0, 4) == 1.0  # nothing accepted: the target's own token
    assert expected_tokens_per_round(1.0, 4) == 5.0  # everything accepted: K drafts + the bonus
    # 1 + a + a^2 + ... + a^K, summed by hand
    assert expected_tokens_per_round(0.7, 3) == pytest.approx(1 + 0.7 + 0.49 + 0.343)


def test_expected_tokens_match_simulated_rounds():
    """Rounds with i.i.d. acceptance: the closed form is the simulated mean."""
    rng = np.random.default_rng(0)
    alpha, k = 0.75, 5
    accepted = rng.random((200_000, k)) < alpha
    n_accepted = np.where(accepted.all(axis=1), k, accepted.argmin(axis=1))
    assert np.mean(n_accepted + 1) == pytest.approx(expected_tokens_per_round(alpha, k), rel=0.01)


def test_speedup_reduces_to_the_papers_formula_when_verifying_costs_one_step():
    # Leviathan et al., section 3 (walltime improvement): (1 - a^(g+1)) / ((1 - a)(g c + 1))
    for alpha, gamma, c in [(0.8, 4, 0.05), (0.6, 2, 0.3), (0.9, 7, 0.1)]:
        paper = (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + 1))
        assert predicted_speedup(alpha, gamma, c) == pytest.approx(paper)


def test_a_measured_verification_curve_lowers_the_prediction():
    r = [1.0, 1.5, 1.8, 2.0, 2.2, 2.5, 2.7, 3.0, 3.2]
    assert verify_cost(5, r) == 2.2 and verify_cost(1, r) == 1.0
    assert verify_cost(18, r) == pytest.approx(6.4)  # linear beyond the measured range
    assert predicted_speedup(0.8, 4, 0.1, r) == pytest.approx(predicted_speedup(0.8, 4, 0.1) * 1.4 / (0.4 + 2.2))


def test_best_k():
    k, s = best_k(0.9, 0.05)  # cheap draft, high acceptance, GPU-like verification: long drafts
    assert k >= 6 and s > 3
    k, s = best_k(0.9, 0.4, r=[1.0] + [3.0] * 9)  # a CPU where verifying costs 3 steps: nothing wins
    assert (k, s) == (0, 1.0)
    assert best_k(0.5, 0.01)[0] < best_k(0.95, 0.01)[0]  # more acceptance, longer drafts


def test_cost_model_k_policy_tracks_acceptance():
    policy = CostModelK(c=0.05, r=None, k_max=8, prior_alpha=0.5, prior_weight=4)
    k_start = policy.next_k()
    for _ in range(30):
        policy.update(policy.next_k(), policy.next_k())  # every draft accepted
    assert policy.alpha > 0.9 and policy.next_k() > k_start
    for _ in range(60):
        policy.update(policy.next_k(), 0)  # every first draft rejected
    assert policy.alpha < 0.5 and policy.next_k() >= 1


def test_measure_costs_and_race_explain():
    target = tiny_model(seed=1)
    draft = perturbed(target, 0.05, seed=4)
    costs = measure_costs(target, draft, [1, 2, 3], m_max=5, repeats=2)
    assert len(costs.r) == 5 and costs.r[0] == 1.0 and costs.c > 0
    result = race(target, draft, [1, 2, 3], 20, K=3, repeats=2)
    assert len(result.autoregressive) == len(result.speculative) == 2
    assert result.texts_identical
    spec = result.spec
    assert 0 < spec.draft_seconds + spec.verify_seconds <= spec.seconds
    explained = result.explain()
    assert explained["measured_speedup"] == pytest.approx(result.speedup)
    assert 0 <= explained["alpha"] <= 1 and explained["alpha"] >= explained["acceptance_rate"]
    assert math.isfinite(explained["predicted_speedup"])
    # The n-gram drafter has no model step; its cost is the lookup itself.
    ngram = measure_costs(target, "ngram", [1, 2, 1, 2], m_max=3, repeats=2)
    assert len(ngram.r) == 3 and ngram.draft_step > 0
