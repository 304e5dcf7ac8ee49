"""The public API: what `import specdec` offers, bad requests as clear errors, the
spec parsers, text prompts and K given as a word."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import tiny_model

import specdec
from specdec import autoregressive_sample, speculative_sample
from specdec.costmodel import K_LIMIT, make_k_policy, parse_k
from specdec.drafters.specs import DraftSpec, parse_draft


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=1)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(K=0), "K"),
        (dict(K=2.5), "K"),
        (dict(K=K_LIMIT + 1), "at most"),
        (dict(K="lots"), "adaptive"),
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=0), "top_k"),
        (dict(prompt_ids=[]), "empty"),
        (dict(prompt_ids=[10**6]), "token ids"),
        (dict(prompt_ids="hello"), "no tokenizer"),
        (dict(n_tokens=-1), "n_tokens"),
        (dict(seed=1, rng=np.random.default_rng()), "either seed or rng"),
        (dict(draft="bogus"), "unknown drafter"),
        (dict(draft="early_exit:2"), "early exit"),
        (dict(draft="ngram:abc"), "ngram:N"),
    ],
)
def test_bad_requests_are_clear_errors(target, kwargs, message):
    args = dict(target=target, draft=target, prompt_ids=[1, 2], n_tokens=5)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        speculative_sample(**args)


def test_spec_parsers():
    assert parse_draft("ngram") == DraftSpec("ngram", 3) and str(parse_draft("ngram:4")) == "ngram:4"
    assert parse_draft("early_exit:6") == DraftSpec("early_exit", 6)
    assert parse_draft("openai-community/gpt2") == DraftSpec("model", "openai-community/gpt2")
    for bad in ("ngram:abc", "ngram:0", "ngram:", "early_exit:x", "early_exit:0", ""):
        with pytest.raises(ValueError):
            parse_draft(bad)
    assert [parse_k(k) for k in ("4", 6, np.int32(2), "auto", "adaptive")] == [4, 6, 2, "auto", "adaptive"]
    for bad in ("0", "-3", "200", "lots", 2.5, True, None):
        with pytest.raises(ValueError, match="K"):
            parse_k(bad)


def test_k_policies_from_specs():
    assert make_k_policy(3).next_k() == 3
    adaptive = make_k_policy("adaptive", k_max=6)
    assert (adaptive.next_k(), adaptive.k_max) == (4, 6)
    with pytest.raises(ValueError, match="measured costs"):
        make_k_policy("auto")
    with pytest.raises(ValueError, match="k_max"):
        make_k_policy("adaptive", k_max=K_LIMIT + 1)
    policy = specdec.AdaptiveK(2, 1, 5)
    assert make_k_policy(policy) is policy


def test_k_as_a_word_in_the_sampler(target):
    greedy = autoregressive_sample(target, [1, 2, 3], 20).tokens
    adaptive = speculative_sample(target, target, [1, 2, 3], 20, K="adaptive")
    assert adaptive.tokens == greedy and adaptive.k_per_round[:3] == [4, 5, 6]  # all accepted: K grows
    auto = speculative_sample(target, "ngram", [1, 2, 3], 20, K="auto")  # measures c and r(m) first
    assert auto.tokens == greedy and 1 <= max(auto.k_per_round) <= 8


def test_text_prompts_when_the_model_has_a_tokenizer(tiny_checkpoint):
    model = specdec.load_folder(tiny_checkpoint)
    ids = model.tokenizer.encode("the cat")
    assert autoregressive_sample(model, "the cat", 5).tokens == autoregressive_sample(model, ids, 5).tokens
    assert speculative_sample(model, "ngram", "the cat", 5).tokens == autoregressive_sample(model, ids, 5).tokens


def test_the_public_api():
    for name in ("race", "RaceReport", "measure_costs", "Costs", "best_k", "predicted_speedup",
                 "expected_tokens_per_round", "CostModelK", "AdaptiveK", "FixedK", "ModelDrafter", "NgramDrafter",
                 "EarlyExitDrafter", "Drafter", "KPolicy", "Proposal", "probabilities", "draw", "greedy",
                 "random_model", "DecodeResult", "SamplingParams", "load_model"):  # fmt: skip
        assert name in specdec.__all__ and getattr(specdec, name).__doc__, name
    assert specdec.__version__.count(".") == 2
    model = specdec.random_model(n_layer=2, n_embd=32, n_head=4, n_vocab=100, n_ctx=32, seed=0)
    assert model.n_layer == 2 and model.n_vocab == 100
    out = specdec.speculative_sample(model, "ngram", [1, 2, 1, 2], 6)
    assert out.tokens == specdec.autoregressive_sample(model, [1, 2, 1, 2], 6).tokens
