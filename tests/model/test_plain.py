"""Plain products (SPECDEC_KERNELS=plain, specdec.set_kernels("plain")): every `x @ lin` is NumPy's own x @ W + b,
nothing of model/fast/ runs, and the fast products agree with them: the same logits within float32 tolerance,
the same greedy and seeded tokens."""

from __future__ import annotations

import numpy as np
import pytest

import specdec
from specdec import autoregressive_sample, speculative_sample
from specdec.model import linear
from specdec.model.fast import kernels, tuning
from specdec.model.gpt2 import GPT2, HParams, random_weights
from specdec.model.llama import LlamaHParams, random_llama

# Wide enough that the fast products split every matrix over the workers and take their chunked paths.
GPT2_HP = HParams(n_vocab=300, n_ctx=96, n_embd=64, n_head=4, n_layer=2)
LLAMA_HP = LlamaHParams(n_vocab=300, n_ctx=96, n_embd=64, n_head=4, n_kv_head=2, n_layer=2, n_ff=96)


@pytest.fixture
def split_everything(monkeypatch):
    """Every matrix split (SMALL_BYTES 0) into small chunks, so the fast paths are the ones compared."""
    monkeypatch.setattr(kernels, "SMALL_BYTES", 0)
    monkeypatch.setattr(kernels, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(kernels, "SPLIT_PARTS", 2)
    yield
    specdec.set_kernels(None)


def models(seed: int = 0):
    gpt2 = GPT2(GPT2_HP, random_weights(GPT2_HP, seed=seed, scale=0.3), name="gpt2-test")
    return {"gpt2": gpt2, "llama": random_llama(LLAMA_HP, seed=seed, scale=0.3)}


def passes(model) -> list[np.ndarray]:
    """Logits of a prompt, a 5-token chain, a 1-token step and a tree, one after another on one cache."""
    rng = np.random.default_rng(1)
    cache, out = model.new_cache(), []
    for n in (20, 5, 1):
        out.append(model.forward(rng.integers(0, model.n_vocab, n), cache))
    out.append(model.forward(rng.integers(0, model.n_vocab, 4), cache, parents=[-1, 0, 0, 1]))
    return out


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_plain_and_fast_products_give_the_same_logits(split_everything, arch):
    model = models()[arch]
    specdec.set_kernels("rules")
    fast = passes(model)
    specdec.set_kernels("plain")
    plain = passes(model)
    for a, b in zip(fast, plain):
        assert a.dtype == b.dtype == np.float32
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5)


def test_plain_products_run_nothing_of_the_fast_package(split_everything, monkeypatch):
    """In plain mode a pass never reaches model/fast/: its product and its per-pass setting both refuse here."""

    def refuse(*args, **kwargs):
        raise AssertionError("model/fast/ ran in plain mode")

    monkeypatch.setattr(specdec.model.fast.FAST, "matmul", refuse)
    monkeypatch.setattr(specdec.model.fast.FAST, "pass_of", refuse)
    specdec.set_kernels("plain")
    assert linear.PRODUCTS is linear.PLAIN
    passes(models()["gpt2"])
    specdec.set_kernels("rules")  # the control: the same pass does reach the fast products
    with pytest.raises(AssertionError, match="model/fast/ ran"):
        passes(models()["gpt2"])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_plain_and_fast_products_decode_the_same_tokens(split_everything, temperature):
    """Greedy and seeded output, autoregressive and speculative, identical between the two kinds of product."""
    target, draft = models(0)["gpt2"], models(3)["gpt2"]
    runs = {}
    for mode in ("rules", "plain"):
        specdec.set_kernels(mode)
        runs[mode] = [
            autoregressive_sample(target, [1, 2, 3], 24, temperature=temperature, seed=5).tokens,
            speculative_sample(target, draft, [1, 2, 3], 24, K=4, temperature=temperature, seed=5).tokens,
        ]
    assert runs["rules"] == runs["plain"]


def test_the_mode_comes_from_the_variable_unless_python_set_one(monkeypatch):
    monkeypatch.setenv("SPECDEC_KERNELS", "plain")
    specdec.set_kernels(None)
    assert tuning.kernels_mode() == "plain" and linear.PRODUCTS is linear.PLAIN
    specdec.set_kernels("rules")  # Python outranks the variable
    assert tuning.kernels_mode() == "rules" and linear.PRODUCTS is specdec.model.fast.FAST
    monkeypatch.delenv("SPECDEC_KERNELS")
    specdec.set_kernels(None)
    assert tuning.kernels_mode() == "plan" and linear.PRODUCTS is specdec.model.fast.FAST
    with pytest.raises(ValueError, match="one of plan, measure, rules, plain"):
        specdec.set_kernels("fastest")


def test_loading_applies_the_variable(monkeypatch, tmp_path):
    """SPECDEC_KERNELS=plain set before a load: the loaded model runs plain products."""
    monkeypatch.setenv("SPECDEC_KERNELS", "plain")
    specdec.set_kernels(None)
    monkeypatch.setattr(linear, "PRODUCTS", specdec.model.fast.FAST)  # as if imported with another setting
    specdec.load_model("stdlib-2L", models_dir=tmp_path, progress=False)
    assert linear.PRODUCTS is linear.PLAIN
    monkeypatch.delenv("SPECDEC_KERNELS")
    specdec.set_kernels(None)
