"""Exactness: speculative sampling reproduces the target's distribution.

The tests enumerate the exact target probability of every 3-token continuation
of a tiny 6-token-vocabulary model, draw many samples, and apply a chi-square
test (helpers.chi_square_passes). Each test also runs a deliberately broken
sampler through the same check and asserts that it fails, so the check is shown
to have teeth. The full-size runs are marked slow (CI runs them: `pytest -m slow`);
the default suite keeps a smaller run of the headline check with its broken controls.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import (
    BROKEN_RULES,
    N_BROKEN,
    N_SAMPLES,
    N_SAMPLES_MAIN,
    PROMPT,
    chi_square_passes,
    exact_continuations,
    perturbed,
    sample_many,
    small_model,
    verify_resample_target_on_reject,
)

import specdec.verify as verify
from specdec import Proposal, autoregressive_sample, speculative_sample
from specdec.drafters import ModelDrafter
from specdec.sampling import SamplingParams, probabilities


@pytest.fixture(scope="module")
def small_target():
    return small_model(seed=10)


@pytest.fixture(scope="module")
def small_draft(small_target):
    return perturbed(small_target, 0.15, seed=1)


@pytest.fixture(scope="module")
def exact_t1(small_target):
    return exact_continuations(small_target, PROMPT, 3, SamplingParams(1.0))


def check_exact_and_broken(run, exact, n_samples, monkeypatch, n_broken=N_BROKEN):
    ok, stat, df = chi_square_passes(sample_many(run, n_samples=n_samples), exact)
    assert ok, f"correct sampler failed: chi2={stat:.1f} df={df}"
    # The same check must reject broken variants of the verification step.
    for broken in BROKEN_RULES:
        monkeypatch.setattr(verify, "sampled_chain", broken)
        ok, stat, df = chi_square_passes(sample_many(run, n_samples=n_broken), exact)
        assert not ok, f"{broken.__name__} passed the check (chi2={stat:.1f}, df={df})"


def test_speculative_sampling_matches_the_target_distribution_quick(small_target, small_draft, exact_t1, monkeypatch):
    def run(rng):
        return speculative_sample(small_target, small_draft, PROMPT, 3, K=2, temperature=1.0, rng=rng)

    # 1,000 runs of each broken rule land at 2.5-10x the threshold (2,000: 3.7-39x; the slow test below)
    check_exact_and_broken(run, exact_t1, N_BROKEN, monkeypatch, n_broken=1000)


@pytest.mark.slow
def test_speculative_sampling_matches_the_target_distribution(small_target, small_draft, exact_t1, monkeypatch):
    def run(rng):
        return speculative_sample(small_target, small_draft, PROMPT, 3, K=2, temperature=1.0, rng=rng)

    check_exact_and_broken(run, exact_t1, N_SAMPLES_MAIN, monkeypatch)


@pytest.mark.slow
def test_autoregressive_sampling_matches_the_exact_distribution(small_target, exact_t1):
    samples = sample_many(lambda rng: autoregressive_sample(small_target, PROMPT, 3, temperature=1.0, rng=rng))
    ok, stat, df = chi_square_passes(samples, exact_t1)
    assert ok, f"chi2={stat:.1f} df={df}"


@pytest.mark.slow
def test_acceptance_rate_matches_theory(small_target, small_draft):
    """P(accept the first draft) = sum_x min(p(x), q(x)) (Leviathan et al., section 3, "Calculating alpha")."""
    params = SamplingParams(1.0)
    p = probabilities(small_target(PROMPT)[-1:], params)[0]
    q = probabilities(small_draft(PROMPT)[-1:], params)[0]
    alpha = float(np.minimum(p, q).sum())
    assert 0.2 < alpha < 0.95, "the test models should disagree sometimes and agree sometimes"

    rng = np.random.default_rng(5)
    first_kinds = []
    for _ in range(N_SAMPLES):
        kinds = []
        speculative_sample(
            small_target,
            small_draft,
            PROMPT,
            2,
            K=1,
            temperature=1.0,
            rng=rng,
            on_token=lambda t, kind: kinds.append(kind),
        )
        first_kinds.append(kinds[0] == "draft")
    measured = np.mean(first_kinds)
    stderr = np.sqrt(alpha * (1 - alpha) / N_SAMPLES)
    assert abs(measured - alpha) < 4.5 * stderr, f"measured {measured:.4f}, theory {alpha:.4f}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "params",
    # A high temperature leaves real mass outside the filter, so filtering
    # mistakes have visible effects.
    [SamplingParams(1.5, top_k=3), SamplingParams(1.5, top_p=0.7), SamplingParams(1.5, top_k=4, top_p=0.8)],
    ids=["top_k", "top_p", "top_k+top_p"],
)
def test_filtered_sampling_matches_the_filtered_target(small_target, small_draft, params):
    exact = exact_continuations(small_target, PROMPT, 3, params)
    assert sum(p == 0 for p in exact.values()) > 0, "the filter should remove something"

    def run(rng):
        return speculative_sample(
            small_target,
            small_draft,
            PROMPT,
            3,
            K=2,
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            rng=rng,
        )

    ok, stat, df = chi_square_passes(sample_many(run, seed=1), exact)
    assert ok, f"chi2={stat:.1f} df={df}"

    # BROKEN: the draft token is drawn from the filtered q, but the acceptance
    # test reads the unfiltered q (the "filtered on one side only" bug class).
    class OneSideFiltered(ModelDrafter):
        def propose(self, ids, k, params, rng, nodes=None):
            tokens = super().propose(ids, k, params, rng).tokens
            logits = self.model(list(ids) + tokens[:-1])[len(ids) - 1 :]  # [k, n_vocab]
            return Proposal.chain(tokens, probabilities(logits, SamplingParams(params.temperature)))

    def run_broken(rng):
        return speculative_sample(
            small_target,
            OneSideFiltered(small_draft),
            PROMPT,
            3,
            K=2,
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            rng=rng,
        )

    ok, stat, df = chi_square_passes(sample_many(run_broken, n_samples=N_BROKEN, seed=2), exact)
    assert not ok, f"one-side filtering passed the check (chi2={stat:.1f}, df={df})"


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["ngram", "early_exit:1"])
def test_other_drafters_keep_the_target_distribution(drafter, monkeypatch):
    model = small_model(seed=11, n_layer=2)
    # A prompt with repeats, so the n-gram drafter has something to propose.
    prompt = [1, 2, 1, 2, 3, 1, 2]
    exact = exact_continuations(model, prompt, 3, SamplingParams(1.0))

    def run(rng):
        return speculative_sample(model, drafter, prompt, 3, K=2, temperature=1.0, rng=rng)

    assert run(np.random.default_rng(0)).drafted > 0
    ok, stat, df = chi_square_passes(sample_many(run), exact)
    assert ok, f"chi2={stat:.1f} df={df}"
    monkeypatch.setattr(verify, "sampled_chain", verify_resample_target_on_reject)
    ok, stat, df = chi_square_passes(sample_many(run, n_samples=N_BROKEN), exact)
    assert not ok, f"a broken sampler passed with {drafter} (chi2={stat:.1f})"
