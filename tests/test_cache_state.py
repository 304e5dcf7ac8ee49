"""Cache state: after every target pass both caches hold exactly the accepted text,
the drafter is handed the target's hidden states of the positions kept, and the
counters agree with each other."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import tiny_model
from helpers import assert_cache_holds, perturbed

from specdec import autoregressive_sample, speculative_sample
from specdec.drafters import EarlyExitDrafter, ModelDrafter


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=1)


@pytest.mark.parametrize("kind", ["model", "early_exit"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_caches_hold_exactly_the_accepted_text_after_each_round(target, kind, temperature):
    """At every commit (after the prefill and after every round): the target's cache
    holds all of the text but its newest token, the draft's holds a prefix of the
    text (never a rejected token), and the features are the target's hidden
    states at the positions just kept, the last one being the row that gave ids[-1]."""
    draft_model = perturbed(target, 0.05, seed=4)
    drafter = ModelDrafter(draft_model) if kind == "model" else EarlyExitDrafter(target, n_layer=1)
    prompt, emitted, checks = [5, 6, 7], [], []
    target_caches = []
    real_begin, real_commit = drafter.begin, drafter.commit

    def recording_begin(target_model, cache, prompt_ids):
        target_caches.append(cache)
        real_begin(target_model, cache, prompt_ids)

    def checking_commit(ids, features):  # called by the sampler after every target pass
        real_commit(ids, features)
        text = prompt + emitted
        checks.append(len(features))
        target_cache = target_caches[-1]
        assert list(ids) == text and len(text) - 1 == target_cache.length
        assert_cache_holds(target, target_cache, text)
        if kind == "model":
            assert drafter.cache.length <= len(text) - 1
            assert len(checks) == 1 or len(text) - 2 <= drafter.cache.length  # after a round: caught up but 1-2
            assert_cache_holds(draft_model, drafter.cache, text)
        _, hidden = target.forward(text[:-1], target.new_cache(), return_hidden=True)  # [len-1, n_embd]
        assert features.shape == (len(features), target.n_embd) and len(features) >= 1
        np.testing.assert_allclose(features, hidden[-len(features) :], atol=2e-5)

    drafter.begin, drafter.commit = recording_begin, checking_commit
    out = speculative_sample(
        target,
        drafter,
        prompt,
        25,
        K=4,
        temperature=temperature,
        seed=3,
        on_token=lambda token, kind: emitted.append(token),
    )
    assert len(checks) == out.rounds + 1  # every round, plus the prefill
    assert checks[0] == len(prompt) - 1 and checks[1:] == [n + 1 for n in out.accepted_per_round]
    assert 0 < out.accepted < out.drafted, "the test needs both accepted and rejected drafts"


def test_counters_are_consistent(target):
    out = speculative_sample(target, perturbed(target, 0.2, seed=5), [1, 2, 3], 40, K=3, temperature=1.0, seed=0)
    assert len(out.tokens) == 40
    assert out.rounds == len(out.k_per_round) == out.target_calls - 1
    assert sum(out.accepted_histogram) == out.rounds  # a round that drafted nothing accepted 0
    assert out.accepted == sum(n * c for n, c in enumerate(out.accepted_histogram))
    assert len(out.tokens) == out.accepted + out.rounds  # every round adds one target token
    assert out.drafted == sum(out.k_per_round) and out.draft_calls >= out.drafted
    ar = autoregressive_sample(target, [1, 2, 3], 40, temperature=1.0, seed=0)
    assert ar.target_calls == 40 and ar.draft_calls == 0 and ar.tau == 1.0


def test_a_reused_drafter_counts_each_run_alone(target):
    drafter = ModelDrafter(perturbed(target, 0.05, seed=4))
    first = speculative_sample(target, drafter, [1, 2, 3], 12, K=3)
    second = speculative_sample(target, drafter, [1, 2, 3], 12, K=3)
    assert first.tokens == second.tokens and first.draft_calls == second.draft_calls > 0
