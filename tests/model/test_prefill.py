"""A long prompt, or a batch of them, runs in passes of at most PREFILL_CHUNK new tokens in all (packing.in_chunks):
the same logits, hidden states and caches as one pass, attention never sees more than a chunk of queries at once,
and a failing pass leaves every cache where it was."""

from __future__ import annotations

import numpy as np
import pytest

from specdec.model import base, gpt2, llama
from specdec.model.llama import LlamaHParams, random_llama
from specdec.model.base import in_chunks
from specdec.model.shapes import random_model

TOKENS = [int(t) for t in np.random.default_rng(0).integers(0, 64, size=45)]


def models():
    h = LlamaHParams(n_vocab=64, n_ctx=128, n_embd=32, n_head=4, n_kv_head=2, n_layer=2, n_ff=48)
    return [
        random_llama(h, seed=1, scale=0.3),
        random_model(n_layer=2, n_embd=32, n_head=4, n_vocab=64, n_ctx=128, scale=0.3),
    ]


@pytest.mark.parametrize("model", models(), ids=["llama", "gpt2"])
@pytest.mark.parametrize("last_only", [False, True])
def test_chunked_prefill_equals_one_pass(model, last_only):
    one = model.new_cache()
    model.forward(TOKENS[:3], one)  # chunks after a cached start, too
    chunked = model.new_cache()
    model.forward(TOKENS[:3], chunked)
    logits, hidden = model.forward(TOKENS[3:], one, last_only=last_only, return_hidden=True)

    def run(parts, caches):
        return model.forward_batch(parts, caches, last_only=last_only, return_hidden=True)

    (c_logits,), (c_hidden,) = in_chunks(run, [TOKENS[3:]], [chunked], last_only, return_hidden=True, chunk=8)
    assert c_logits.shape == logits.shape and c_logits.dtype == np.float32
    np.testing.assert_allclose(c_logits, logits, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(c_hidden, hidden, atol=1e-5, rtol=1e-5)
    assert chunked.length == one.length == len(TOKENS)
    np.testing.assert_allclose(chunked.k[:, :, : one.length], one.k[:, :, : one.length], atol=1e-5)
    np.testing.assert_allclose(chunked.v[:, :, : one.length], one.v[:, :, : one.length], atol=1e-5)
    chunked.rollback(3)
    (plain,) = in_chunks(
        lambda parts, caches: model.forward_batch(parts, caches, last_only=last_only),
        [TOKENS[3:]],
        [chunked],
        last_only,
        return_hidden=False,
        chunk=8,
    )
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


# A ragged batch: rows over and under a chunk of 8 new tokens, after different cached lengths. Laid end to end and
# cut every 8 tokens: row 0 [0:8] | [8:16] | row 0 [16:20], row 1 [0:4] | row 2 [0:8] | row 2 [8:13]
# (row 0 ends in a pass that goes on with row 1; row 1 ends at a cut, two passes before row 2).
PASTS = [TOKENS[:3], [], TOKENS[30:37]]
NEWS = [TOKENS[3:23], TOKENS[23:27], TOKENS[10:23]]  # 20, 4 and 13 new tokens


def filled(model, past):
    """A cache holding `past` (fewer tokens than a chunk: one pass)."""
    cache = model.new_cache()
    if past:
        model.forward(past, cache)
    return cache


def per_row(out, return_hidden):
    """forward_batch's (logits list, hidden list), or its logits list, as one (logits, hidden or None) per row."""
    return list(zip(*out)) if return_hidden else [(logits, None) for logits in out]


@pytest.mark.parametrize("model", models(), ids=["llama", "gpt2"])
@pytest.mark.parametrize("last_only", [False, True])
def test_a_batch_of_long_prompts_equals_each_row_alone(model, last_only, monkeypatch):
    """Logits, hidden states (both forms), early exit and caches of the chunked batch against each row in one pass."""
    for kwargs in [{}, {"return_hidden": True}, {"return_hidden": [0, 1, 2]}, {"n_layer": 1, "return_hidden": True}]:
        return_hidden = bool(kwargs.get("return_hidden"))
        monkeypatch.setattr(base, "PREFILL_CHUNK", 10**9)  # the reference: each row alone, in one pass
        alone = [filled(model, past) for past in PASTS]
        wants = [model.forward(new, cache, last_only, **kwargs) for new, cache in zip(NEWS, alone)]
        wants = [want if return_hidden else (want, None) for want in wants]
        monkeypatch.setattr(base, "PREFILL_CHUNK", 8)
        caches = [filled(model, past) for past in PASTS]
        got = per_row(model.forward_batch(NEWS, caches, last_only, **kwargs), return_hidden)
        written = slice(kwargs.get("n_layer"))  # the layers a pass through n_layer blocks writes
        for b, ((logits, hidden), (want, want_hidden)) in enumerate(zip(got, wants)):
            assert logits.shape == want.shape == ((1,) if last_only else (len(NEWS[b]),)) + (64,), (b, kwargs)
            assert logits.dtype == np.float32
            np.testing.assert_allclose(logits, want, atol=1e-5, rtol=1e-5, err_msg=f"row {b}, {kwargs}")
            if return_hidden:
                assert hidden.shape == want_hidden.shape and hidden.dtype == np.float32
                np.testing.assert_allclose(hidden, want_hidden, atol=1e-5, rtol=1e-5, err_msg=f"row {b}, {kwargs}")
            n = alone[b].length
            assert caches[b].length == n == len(PASTS[b]) + len(NEWS[b])
            np.testing.assert_allclose(caches[b].k[written, :, :n], alone[b].k[written, :, :n], atol=1e-5)
            np.testing.assert_allclose(caches[b].v[written, :, :n], alone[b].v[written, :, :n], atol=1e-5)


@pytest.mark.parametrize("module", [llama, gpt2])
def test_a_batch_of_long_prompts_never_attends_or_packs_more_than_a_chunk(module, monkeypatch):
    """Scores are [n_head, n_seq_b, n_kv_b] per row and activations [n_tok, ...]: both stay within a chunk."""
    model = models()[0 if module is llama else 1]
    queries, packed = [], []
    attention, embed_and_run = gpt2.attention, model.embed_and_run

    def watched_attention(q, k, v, bias):
        queries.append(q.shape[1])  # query rows of one attention call (llama stacks a group's heads as rows)
        return attention(q, k, v, bias)

    def watched_pass(flat, *args):
        packed.append(len(flat))  # new tokens of one packed pass
        return embed_and_run(flat, *args)

    monkeypatch.setattr(module, "attention", watched_attention)
    monkeypatch.setattr(model, "embed_and_run", watched_pass)
    monkeypatch.setattr(base, "PREFILL_CHUNK", 8)
    caches = [filled(model, past) for past in PASTS]
    del queries[:], packed[:]
    model.forward_batch(NEWS, caches, last_only=True)
    group = model.hparams.n_head // model.hparams.n_kv_head
    assert max(queries) <= 8 * group, queries
    assert packed == [8, 8, 8, 8, 5], packed


def test_a_failing_pass_leaves_every_cache_where_it_was(monkeypatch):
    model = models()[0]
    news = [NEWS[1], NEWS[0], NEWS[2]]  # 4, 20, 13: pass 1 ends row 0 and starts row 1, pass 2 goes on with row 1
    pasts = [PASTS[1], PASTS[0], PASTS[2]]
    caches = [filled(model, past) for past in pasts]
    before = [(c.length, c.k[:, :, : c.length].copy(), c.v[:, :, : c.length].copy()) for c in caches]
    calls, lm_head_rows = [], base.lm_head_rows

    def fails_second(*args):  # the LM head of the second pass, after its keys, values and lengths are written
        calls.append(1)
        if len(calls) == 2:
            raise MemoryError("injected")
        return lm_head_rows(*args)

    monkeypatch.setattr(base, "lm_head_rows", fails_second)
    monkeypatch.setattr(base, "PREFILL_CHUNK", 8)
    with pytest.raises(MemoryError, match="injected"):
        model.forward_batch(news, caches, last_only=True)
    for cache, (length, k, v) in zip(caches, before):
        assert cache.length == length
        np.testing.assert_array_equal(cache.k[:, :, :length], k)
        np.testing.assert_array_equal(cache.v[:, :, :length], v)
    monkeypatch.setattr(base, "lm_head_rows", lm_head_rows)
    again = model.forward_batch(news, caches, last_only=True)  # the caches are as good as new
    for logits, past, new in zip(again, pasts, news):
        np.testing.assert_allclose(logits, model.forward(new, filled(model, past), last_only=True), atol=1e-5)


@pytest.mark.parametrize("model", models(), ids=["llama", "gpt2"])
def test_trees_in_a_batch_are_not_cut(model, monkeypatch):
    """A batch with a tree row runs in one pass however long, and each row still equals its own forward."""
    parents = [None, [-1, 0, 0, 1, 1, 2], None]  # row 1: a root, two children, three grandchildren
    news = [NEWS[0], TOKENS[38:44], NEWS[2]]
    packed, embed_and_run = [], model.embed_and_run

    def watched_pass(flat, *args):
        packed.append(len(flat))
        return embed_and_run(flat, *args)

    monkeypatch.setattr(base, "PREFILL_CHUNK", 8)
    caches = [filled(model, past) for past in PASTS]
    monkeypatch.setattr(model, "embed_and_run", watched_pass)
    logits = model.forward_batch(news, caches, parents=parents)
    assert packed == [sum(map(len, news))]
    monkeypatch.undo()
    for b, (past, new) in enumerate(zip(PASTS, news)):
        want = model.forward(new, filled(model, past), parents=parents[b])
        np.testing.assert_allclose(logits[b], want, atol=1e-5, rtol=1e-5, err_msg=f"row {b}")
