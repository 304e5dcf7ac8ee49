"""Greedy equivalence: at temperature 0 speculative decoding emits exactly the
target's greedy tokens, whatever the drafter and K, up to the context window."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import tiny_model
from helpers import perturbed

from specdec import autoregressive_sample, speculative_sample
from specdec.model.gpt2 import GPT2, HParams


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=1)


def test_greedy_speculative_equals_greedy_autoregressive(target):
    good = perturbed(target, 0.05, seed=3)
    bad = tiny_model(seed=99)  # unrelated random weights
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, target.n_vocab, size=n)) for n in (1, 2, 9)]
    prompts.append([7, 8, 9, 7, 8, 9, 7, 8])  # repetitive: n-gram drafts get accepted
    drafters = {"good": good, "bad": bad, "self": target, "ngram": "ngram", "early_exit": "early_exit:1"}
    accepted = {name: 0 for name in drafters}
    for prompt in prompts:
        expected = autoregressive_sample(target, prompt, 30).tokens
        for name, draft in drafters.items():
            for K in (1, 2, 3, 5, 8):  # the K range's ends and the lengths between
                out = speculative_sample(target, draft, prompt, 30, K=K)
                assert out.tokens == expected, f"draft={name} K={K} prompt={prompt}"
                accepted[name] += out.accepted
    assert accepted["self"] > 0 and accepted["good"] > 0 and accepted["ngram"] > 0


def test_draft_equal_to_target_accepts_everything(target):
    out = speculative_sample(target, target, [3, 4], 20, K=4)
    assert out.alpha == 1.0
    assert out.rounds == 4 and out.target_calls == 5  # 4 rounds of 5 tokens, plus the prefill
    assert out.accepted_histogram == [0, 0, 0, 0, 4]
    out = speculative_sample(target, target, [3, 4], 18, K=4)
    assert out.k_per_round == [4, 4, 4, 2]  # 3 tokens left: draft 2, and the bonus makes 3
    assert out.accepted_histogram == [0, 0, 1, 0, 3]
    out = speculative_sample(target, target, [3, 4], 20, K=4, temperature=0.9, seed=1)
    assert out.alpha > 0.99


@pytest.mark.parametrize("n_tokens,K", [(1, 4), (2, 4), (3, 8), (7, 1)])
def test_short_generations(target, n_tokens, K):
    expected = autoregressive_sample(target, [9], n_tokens).tokens
    out = speculative_sample(target, target, [9], n_tokens, K=K)  # a one-token prompt
    assert out.tokens == expected and len(out.tokens) == n_tokens
    assert all(k <= n_tokens - 1 for k in out.k_per_round)


def test_tiny_temperature_is_greedy_and_numpy_scalars_are_accepted(target):
    greedy_tokens = autoregressive_sample(target, [1, 2, 3], 8).tokens
    assert autoregressive_sample(target, [1, 2, 3], 8, temperature=1e-40, seed=0).tokens == greedy_tokens
    assert speculative_sample(target, target, [1, 2, 3], 8, temperature=1e-40, seed=0).tokens == greedy_tokens
    out = speculative_sample(
        target,
        target,
        [1, 2, 3],
        8,
        K=np.int64(3),
        temperature=np.float32(0.7),
        top_k=np.int32(20),
        top_p=np.float32(0.9),
        seed=0,
    )
    assert len(out.tokens) == 8


def test_a_draft_with_a_shorter_context_stops_drafting_at_its_end(target):
    short = HParams(**{**vars(target.hparams), "n_ctx": 24})
    draft = GPT2(short, target.weights)  # same weights; only the first 24 positions
    prompt = list(range(1, 19))
    out = speculative_sample(target, draft, prompt, 30, K=4)
    assert out.tokens == autoregressive_sample(target, prompt, 30).tokens
    # Every round kept its verification within the draft's 24 positions:
    # k <= n_ctx - len(text), so drafting shrinks to nothing near the end.
    length = len(prompt)
    for k, n_accepted in zip(out.k_per_round, out.accepted_per_round):
        assert k <= max(0, 24 - length)
        length += n_accepted + 1
    assert max(out.k_per_round) == 4 and out.k_per_round[-1] == 0


def test_running_into_the_context_window(target):
    n_ctx = target.n_ctx
    prompt = list(range(1, n_ctx - 10 + 1))
    expected = autoregressive_sample(target, prompt, 10).tokens
    for K in (1, 4, 8):
        out = speculative_sample(target, target, prompt, 10, K=K)
        assert out.tokens == expected
    with pytest.raises(ValueError, match="context window of 64"):
        speculative_sample(target, target, prompt, 11)
    with pytest.raises(ValueError, match="context window"):
        autoregressive_sample(target, list(range(64)), 1)
