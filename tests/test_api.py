"""The public API: what `import specdec` offers, bad requests as clear errors, the
spec parsers, text prompts and K given as a word."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from conftest import tiny_model

import specdec
from specdec import autoregressive_sample, speculative_sample
from specdec.config import Config, parse_k, setup
from specdec.costmodel import K_LIMIT
from specdec.drafters.specs import DraftSpec, parse_draft
from specdec.race import race


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


BAD_PROMPTS = [
    ([2**70], "whole numbers in 0..261; got 1180591620717411303424 at position 0"),
    ([1, 2.0], "got 2.0 at position 1"),
    ([1, 2.7], "got 2.7 at position 1"),
    ([[1, 2], [3]], "got [1, 2] at position 0"),
    ([1, True], "got True at position 1"),
    ([1, -1], "got -1 at position 1"),
    (None, "text or a flat list of token ids, got NoneType"),
    (5, "text or a flat list of token ids, got int"),
    (np.array([1.5, 2.0]), "text or a flat list of token ids, got an array of float64"),
    (np.array([[1, 2]]), "text or a flat list of token ids, got a 2-D array"),
]
BAD_SETTINGS = [
    (dict(seed="x"), "seed must be >= 0 (a whole number), got 'x'"),
    (dict(seed=1.5), "seed must be >= 0 (a whole number), got 1.5"),
    (dict(seed=True), "seed must be >= 0 (a whole number), got True"),
    (dict(seed=-1), "seed must be >= 0 (a whole number), got -1"),
    (dict(n_tokens=True), "n_tokens must be >= 1 (a whole number), got True"),
    (dict(n_tokens=2.0), "n_tokens must be >= 1 (a whole number), got 2.0"),
    (dict(rng=np.random.default_rng), "rng must be a numpy.random.Generator"),
]


@pytest.mark.parametrize(
    "entry,kwargs,message",
    [
        (entry, kwargs, message)
        for entry in ("autoregressive_sample", "speculative_sample", "race")
        for kwargs, message in [(dict(prompt=p), m) for p, m in BAD_PROMPTS] + BAD_SETTINGS
        if not (entry == "race" and "rng" in kwargs)
    ],  # race takes a seed only: test_race_takes_a_seed_not_an_rng
)
def test_every_entry_point_refuses_bad_requests_with_one_message(target, entry, kwargs, message):
    """What the API takes is checked in one place (autoregressive.py) for every entry point: no
    OverflowError, TypeError or silent truncation, flattening or True-as-1."""
    kwargs = dict(kwargs)  # (shared by the parametrized cases)
    prompt = kwargs.pop("prompt", [1, 2])
    args = {"n_tokens": 3, **kwargs}
    call = {
        "autoregressive_sample": lambda: autoregressive_sample(target, prompt, **args),
        "speculative_sample": lambda: speculative_sample(target, "ngram", prompt, **args),
        "race": lambda: race(target, "ngram", prompt, warmup=False, **args),
    }[entry]
    with pytest.raises(ValueError) as e:
        call()
    assert message in str(e.value) and "\n" not in str(e.value)


def test_race_takes_a_seed_not_an_rng(target):
    """race() times repeats of one request, so it takes a seed, not a Generator (whose state the first
    run would use up): every repeat of each decoder starts from that seed and makes the same tokens,
    the ones the sampler makes alone with it."""
    assert "rng" not in inspect.signature(race).parameters
    with pytest.raises(TypeError, match="rng"):
        race(target, "ngram", [1, 2], 3, rng=np.random.default_rng(0), warmup=False)
    report = race(target, "ngram", [1, 2], 8, temperature=1.0, seed=7, repeats=2, warmup=False)
    alone = autoregressive_sample(target, [1, 2], 8, temperature=1.0, seed=7).tokens
    assert [run.result.tokens for run in report.autoregressive] == [alone, alone]
    spec = speculative_sample(target, "ngram", [1, 2], 8, temperature=1.0, seed=7, K=4).tokens
    assert [run.result.tokens for run in report.speculative] == [spec, spec]
    other = race(target, "ngram", [1, 2], 8, temperature=1.0, seed=8, repeats=1, warmup=False)
    assert other.ar.result.tokens != alone  # the seed is what the tokens follow


@pytest.mark.parametrize("models_dir", [5, 2.5, b"models", ["models"]])
def test_models_dir_must_be_a_path(models_dir):
    with pytest.raises(ValueError, match="models_dir must be a folder path"):
        specdec.load_model("124M", models_dir=models_dir, progress=False)


def test_the_cli_and_the_api_refuse_a_seed_with_the_same_message(target, capsys):
    from specdec.cli.main import main

    with pytest.raises(ValueError) as api:
        autoregressive_sample(target, [1, 2], 3, seed=-1)
    with pytest.raises(SystemExit):
        main(["--seed", "-1", "--draft", "ngram", "--target_model_size", "stdlib-2L"])
    assert f"--{api.value}" in capsys.readouterr().err


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


def test_k_policies_from_specs(target):
    run = setup(target, target, [1, 2, 3], 8, Config(K=3))
    assert run.k_policy() is None and run.config.K == 3  # a fixed K: every round drafts 3, no policy object
    adaptive = setup(target, target, [1, 2, 3], 8, Config(K="adaptive", k_max=6)).k_policy()
    assert (adaptive.next_k(), adaptive.k_max) == (4, 6)
    auto = setup(target, target, [1, 2, 3], 8, Config(K="auto", k_max=5))  # timed once here
    assert auto.costs is not None and auto.k_policy().k_max == 5
    with pytest.raises(ValueError, match="k_max"):
        Config(K="adaptive", k_max=K_LIMIT + 1)
    policy = specdec.AdaptiveK(2, 1, 5)
    assert setup(target, target, [1, 2, 3], 8, Config(K=policy)).k_policy() is policy


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
    for name in (
        "measure_costs",
        "Costs",
        "best_k",
        "predicted_speedup",
        "expected_tokens_per_round",
        "CostModelK",
        "AdaptiveK",
        "FixedK",
        "ModelDrafter",
        "NgramDrafter",
        "EarlyExitDrafter",
        "Drafter",
        "KPolicy",
        "Proposal",
        "probabilities",
        "draw",
        "greedy",
        "random_model",
        "DecodeResult",
        "SamplingParams",
        "load_model",
        "speculative_sample_batch",
        "autoregressive_sample_batch",
    ):
        assert name in specdec.__all__ and getattr(specdec, name).__doc__, name
    assert {"GPT2", "Llama", "CausalLM"} <= set(specdec.__all__)  # both architectures, and the interface they share
    assert not {"race", "RaceReport"} & set(specdec.__all__)  # tooling: from specdec.race import race, RaceReport
    from specdec.model.llama import random_llama

    for model in (specdec.random_model(n_layer=1, n_embd=8, n_head=2, n_vocab=16, n_ctx=8), random_llama()):
        assert isinstance(model, specdec.CausalLM) and isinstance(model, (specdec.GPT2, specdec.Llama))
    assert specdec.__version__.count(".") == 2
    model = specdec.random_model(n_layer=2, n_embd=32, n_head=4, n_vocab=100, n_ctx=32, seed=0)
    assert model.n_layer == 2 and model.n_vocab == 100
    out = specdec.speculative_sample(model, "ngram", [1, 2, 1, 2], 6)
    assert out.tokens == specdec.autoregressive_sample(model, [1, 2, 1, 2], 6).tokens


def test_the_race_is_tooling_in_its_own_module_and_the_old_spelling_still_works():
    """`import specdec` does not load the race; `specdec.race(...)` and `specdec.RaceReport`, exported here
    before, still work (with a DeprecationWarning naming the module), on the first call and on later ones."""
    code = """
import sys, warnings
import specdec
assert "specdec.race" not in sys.modules, "import specdec loads the race"
from conftest import tiny_model
model = tiny_model(seed=1)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    report = specdec.race(model, "ngram", [1, 2], 4, repeats=1, warmup=False)
    again = specdec.race(model, "ngram", [1, 2], 4, repeats=1, warmup=False)
    old = specdec.RaceReport
assert "from specdec.race import race" in str(caught[0].message), caught
from specdec.race import RaceReport, race
assert old is RaceReport and isinstance(report, RaceReport) and race is specdec.race
assert report.ar.result.tokens == again.ar.result.tokens
print("ok")
"""
    import os
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).parent  # conftest's tiny_model; specdec from this checkout
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests)])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
