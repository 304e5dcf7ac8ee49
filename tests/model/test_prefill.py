"""A long prompt runs in passes of PREFILL_CHUNK tokens (packing.in_chunks): the same logits, hidden states and
cache as one pass, and attention never sees more than a chunk of queries at once."""

from __future__ import annotations

import numpy as np
import pytest

from specdec.model import base, gpt2, llama
from specdec.model.llama import LlamaHParams, random_llama
from specdec.model.packing import in_chunks
from specdec.model.shapes import random_model

TOKENS = [int(t) for t in np.random.default_rng(0).integers(0, 64, size=45)]


def models():
    h = LlamaHParams(n_vocab=64, n_ctx=128, n_embd=32, n_head=4, n_kv_head=2, n_layer=2, n_ff=48)
    return [random_llama(h, seed=1, scale=0.3),
            random_model(n_layer=2, n_embd=32, n_head=4, n_vocab=64, n_ctx=128, scale=0.3)]  # fmt: skip


@pytest.mark.parametrize("model", models(), ids=["llama", "gpt2"])
@pytest.mark.parametrize("last_only", [False, True])
def test_chunked_prefill_equals_one_pass(model, last_only):
    one = model.new_cache()
    model.forward(TOKENS[:3], one)  # chunks after a cached start, too
    chunked = model.new_cache()
    model.forward(TOKENS[:3], chunked)
    logits, hidden = model.forward(TOKENS[3:], one, last_only=last_only, return_hidden=True)

    def run(part):
        return model.forward(part, chunked, last_only=last_only, return_hidden=True)

    c_logits, c_hidden = in_chunks(run, TOKENS[3:], chunked, last_only, return_hidden=True, chunk=8)
    assert c_logits.shape == logits.shape and c_logits.dtype == np.float32
    np.testing.assert_allclose(c_logits, logits, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(c_hidden, hidden, atol=1e-5, rtol=1e-5)
    assert chunked.length == one.length == len(TOKENS)
    np.testing.assert_allclose(chunked.k[:, :, : one.length], one.k[:, :, : one.length], atol=1e-5)
    np.testing.assert_allclose(chunked.v[:, :, : one.length], one.v[:, :, : one.length], atol=1e-5)
    chunked.rollback(3)
    plain = in_chunks(lambda part: model.forward(part, chunked, last_only=last_only), TOKENS[3:], chunked,
                      last_only, return_hidden=False, chunk=8)  # fmt: skip
    np.testing.assert_allclose(plain, logits, atol=1e-4)


@pytest.mark.parametrize("module", [llama, gpt2])
def test_a_long_prompt_never_attends_with_more_than_a_chunk_of_queries(module, monkeypatch):
    model = models()[0 if module is llama else 1]
    seen = []
    attention = gpt2.attention

    def watched(q, k, v, bias):
        seen.append(q.shape[1])  # query rows of one attention call (llama stacks a group's heads as rows)
        return attention(q, k, v, bias)

    monkeypatch.setattr(module, "attention", watched)
    monkeypatch.setattr(base, "PREFILL_CHUNK", 8)
    whole = model(TOKENS)  # [45, n_vocab] from passes of 8 tokens
    group = model.hparams.n_head // model.hparams.n_kv_head
    assert max(seen) <= 8 * group, seen
    monkeypatch.undo()
    np.testing.assert_allclose(whole, model(TOKENS), atol=1e-4)


def test_a_failing_chunk_leaves_the_cache_where_it_was(monkeypatch):
    model = models()[0]
    monkeypatch.setattr(base, "PREFILL_CHUNK", 8)
    cache = model.new_cache()
    model.forward(TOKENS[:5], cache)
    with pytest.raises(ValueError, match="token ids"):
        model.forward(TOKENS[:20] + [64] + TOKENS[:5], cache)  # id 64 is out of range, in the third chunk
    assert cache.length == 5
