"""Qwen2 (specdec/model/qwen2.py) from a GGUF file, against transformers' Qwen2 on the same file.

tests/fixtures/make_qwen2_reference.py made both fixtures: a tiny Qwen2 with random weights (biases on q, k
and v, grouped-query attention, a tied head, rope theta 1e6) written as llama.cpp writes a Qwen2 GGUF, and
what transformers computes with it. Here the file goes through specdec's ordinary `load_model`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from specdec import autoregressive_sample, load_model, speculative_sample
from specdec.model.qwen2 import Qwen2

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
QWEN2_GGUF = FIXTURES / "tiny-qwen2.gguf"
ATOL = 1e-4  # float32 on both sides, summed in different orders: about 1e-6 apart in practice


@pytest.fixture(scope="module")
def qwen2():
    return load_model(str(QWEN2_GGUF))


@pytest.fixture(scope="module")
def ref():
    with np.load(FIXTURES / "tiny_qwen2_reference.npz", allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def test_the_file_loads_as_a_qwen2_with_its_own_constants_and_biases(qwen2, ref):
    config = json.loads(str(ref["config"]))
    h = qwen2.hparams
    assert isinstance(qwen2, Qwen2) and repr(qwen2).startswith("Qwen2(")
    assert (h.n_layer, h.n_embd, h.n_head, h.n_kv_head, h.n_ff, h.n_vocab) == (
        config["num_hidden_layers"],
        config["hidden_size"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
        config["intermediate_size"],
        config["vocab_size"],
    )
    assert h.rope_theta == config["rope_parameters"]["rope_theta"] and np.isclose(h.rms_eps, config["rms_norm_eps"])
    assert qwen2.weights.lm_head.w_t is qwen2.weights.wte  # tied: the file has no output.weight
    for block in qwen2.weights.blocks:  # q, k and v keep their biases, views of the fused one
        assert block.attn_qkv.b.shape == ((h.n_head + 2 * h.n_kv_head) * h.d_head,)
        assert block.attn_k.b.shape == (h.n_kv_head * h.d_head,) and block.attn_output.b is None


def test_logits_equal_transformers_for_whole_sequences(qwen2, ref):
    for k in range(3):
        logits = qwen2(ref[f"tokens_{k}"])
        assert logits.dtype == np.float32
        np.testing.assert_allclose(logits, ref[f"logits_{k}"], atol=ATOL, rtol=0, err_msg=f"sequence {k}")


def test_cached_decoding_equals_transformers_cache_and_a_whole_pass(qwen2, ref):
    ids = ref["tokens_2"].tolist()
    n, cache = len(ids), qwen2.new_cache()
    rows = np.concatenate(
        [
            qwen2.forward(ids[: n - 4], cache)[-1:],
            qwen2.forward(ids[n - 4 : n - 3], cache),
            qwen2.forward(ids[n - 3 :], cache),
        ]
    )
    np.testing.assert_allclose(rows, ref["cached"], atol=ATOL, rtol=0)
    np.testing.assert_allclose(rows, qwen2(ids)[n - 5 :], atol=1e-5, rtol=0)
    wide = qwen2.astype(np.float64)  # the exact-greedy option keeps the class and the biases
    assert isinstance(wide, Qwen2) and wide.weights.blocks[0].attn_qkv.b.dtype == np.float64
    np.testing.assert_allclose(wide(ids), ref["logits_2"], atol=ATOL, rtol=0)


def test_greedy_decoding_equals_transformers(qwen2, ref):
    out = autoregressive_sample(qwen2, ref["greedy_prompt"].tolist(), len(ref["greedy"]))
    assert out.tokens == ref["greedy"].tolist()


def test_greedy_speculative_equals_greedy_autoregressive_on_qwen2(qwen2, ref):
    prompt = ref["greedy_prompt"].tolist()
    plain = autoregressive_sample(qwen2, prompt, 20).tokens
    for draft, tree in [(qwen2, None), ("early_exit:1", None), ("ngram", None), ("early_exit:1", 6)]:
        assert speculative_sample(qwen2, draft, prompt, 20, K=3, tree=tree).tokens == plain, (draft, tree)


def test_the_tokenizer_equals_transformers_qwen2_pre_tokenizer(qwen2, ref):
    tok = qwen2.tokenizer
    for j, text in enumerate(json.loads(str(ref["tokenizer_texts"]))):
        assert tok.encode(text, allowed_special="all") == ref[f"tokenizer_ids_{j}"].tolist(), text
    # Qwen2's own splits, where GPT-2's pattern would split otherwise: digits alone, "'T" as a contraction.
    pieces = [tok.decode([t]) for t in tok.encode("x 12 DON'T.\n")]
    assert pieces == ["x", " ", "1", "2", " ", "D", "O", "N", "'T", ".\n"]
