"""The Llama block's training math (train/llama_grad.py): every backward against finite differences
in float64, and the forward against model.llama's own inference block on the same weights."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_grads_match

from specdec.model.attention import KVCache
from specdec.model.llama import LlamaHParams, llama_block, rope_tables
from specdec.model.base import Row
from specdec.train import llama_grad as lg

# Grouped-query attention with 2 query heads per key/value head, as SmolLM2 has 3.
H = LlamaHParams(n_vocab=16, n_ctx=32, n_embd=8, n_head=4, n_kv_head=2, n_layer=1, n_ff=12, rms_eps=1e-5)


def float64_block(rng, h=H, prefix=""):
    """A block with gains away from 1 and matrices large enough that attention is far from uniform."""
    params = {k: v.astype(np.float64) for k, v in lg.init_block(h, rng, prefix, std=0.4).items()}
    for name, value in params.items():
        if value.ndim == 1:
            value += rng.standard_normal(value.shape) * 0.3
    return params


def test_rms_norm_rope_attention_and_swiglu_gradients():
    rng = np.random.default_rng(0)
    B, T, e, d = 2, 5, H.n_embd, H.d_head
    x, g, c = rng.standard_normal((B, T, e)), rng.standard_normal(e), rng.standard_normal((B, T, e))
    dx, dg = lg.rms_norm_backward(c, g, lg.rms_norm(x, g, 1e-5)[1])
    assert_grads_match(lambda: float((c * lg.rms_norm(x, g, 1e-5)[0]).sum()), {"x": x, "g": g}, {"x": dx, "g": dg})

    cos, sin = lg.rope(np.tile(np.arange(3, 3 + T), (B, 1)), H, np.float64)
    r, cr = rng.standard_normal((B, 3, T, d)), rng.standard_normal((B, 3, T, d))
    assert_grads_match(
        lambda: float((cr * lg.rotate(r, cos, sin)).sum()), {"r": r}, {"r": lg.rotate_backward(cr, cos, sin)}
    )

    q, co = rng.standard_normal((B, H.n_head, T, d)), rng.standard_normal((B, H.n_head, T, d))
    k, v = rng.standard_normal((B, H.n_kv_head, T, d)), rng.standard_normal((B, H.n_kv_head, T, d))
    mask = lg.causal_mask([T, 3], T)  # the second row padded after 3 tokens
    out, P = lg.gqa_attention(q, k, v, mask)
    dq, dk, dv = lg.gqa_attention_backward(co, q, k, v, P)
    assert_grads_match(
        lambda: float((co * lg.gqa_attention(q, k, v, mask)[0]).sum()),
        {"q": q, "k": k, "v": v},
        {"q": dq, "k": dk, "v": dv},
    )

    a, b, cm = (rng.standard_normal((B, T, H.n_ff)) * 3 for _ in range(3))
    da, db = lg.swiglu_backward(cm, a, b, lg.silu(a)[1])
    assert_grads_match(lambda: float((cm * lg.silu(a)[0] * b).sum()), {"a": a, "b": b}, {"a": da, "b": db})


def test_padded_keys_are_never_attended():
    rng = np.random.default_rng(1)
    B, T, d = 1, 4, H.d_head
    q = rng.standard_normal((B, H.n_head, T, d))
    k, v = rng.standard_normal((B, H.n_kv_head, T, d)), rng.standard_normal((B, H.n_kv_head, T, d))
    out, P = lg.gqa_attention(q, k, v, lg.causal_mask([2], T))
    assert (P[..., 2:] == 0).all()  # keys 2, 3 are padding
    k[..., 2:, :], v[..., 2:, :] = 100.0, -100.0  # whatever padding holds changes nothing
    np.testing.assert_array_equal(lg.gqa_attention(q, k, v, lg.causal_mask([2], T))[0], out)


@pytest.mark.parametrize("masked", [False, True])
def test_block_gradients_of_every_parameter_and_the_input(masked):
    rng = np.random.default_rng(2)
    B, T = 2, 4
    params = float64_block(rng, prefix="blk.1.")
    x, c = rng.standard_normal((B, T, H.n_embd)), rng.standard_normal((B, T, H.n_embd))
    positions = np.array([[0, 1, 2, 3], [5, 6, 7, 8]])
    mask = lg.causal_mask([4, 2], T) if masked else None
    if masked:
        c[1, 2:] = 0  # the loss reads no padded position

    def loss():
        return float((c * lg.block_forward(params, x, positions, H, mask, prefix="blk.1.")[0]).sum())

    y, saved = lg.block_forward(params, x, positions, H, mask, prefix="blk.1.")
    dx, grads = lg.block_backward(c, params, saved, H, prefix="blk.1.")
    assert sorted(grads) == sorted(params)
    assert_grads_match(loss, {**params, "x": x}, {**grads, "x": dx}, n=6)


def test_a_stack_of_blocks_shares_one_grads_dict():
    """Two blocks under two prefixes: the second's dx feeds the first's backward, grads land by prefix."""
    rng = np.random.default_rng(3)
    params = {**float64_block(rng, prefix="blk.0."), **float64_block(rng, prefix="blk.1.")}
    x, c = rng.standard_normal((1, 3, H.n_embd)), rng.standard_normal((1, 3, H.n_embd))
    pos = np.arange(3)[None]

    def forward():
        y0, s0 = lg.block_forward(params, x, pos, H, prefix="blk.0.")
        y1, s1 = lg.block_forward(params, y0, pos, H, prefix="blk.1.")
        return y1, (s0, s1)

    y, (s0, s1) = forward()
    d0, grads = lg.block_backward(c, params, s1, H, prefix="blk.1.")
    dx, grads = lg.block_backward(d0, params, s0, H, grads, prefix="blk.0.")
    assert len(grads) == 18
    assert_grads_match(lambda: float((c * forward()[0]).sum()), {**params, "x": x}, {**grads, "x": dx}, n=3)


def test_the_gradient_check_sees_a_wrong_block_backward(monkeypatch):
    """A sign slip in RoPE's backward (rotating forwards again) fails the block check above."""
    rng = np.random.default_rng(2)
    params = float64_block(rng)
    x, c = rng.standard_normal((1, 4, H.n_embd)), rng.standard_normal((1, 4, H.n_embd))
    pos = np.arange(4)[None] + 3
    monkeypatch.setattr(lg, "rotate_backward", lambda dy, cos, sin: lg.rotate(dy, cos, sin))
    dx, grads = lg.block_backward(c, params, lg.block_forward(params, x, pos, H)[1], H)
    with pytest.raises(AssertionError):
        assert_grads_match(
            lambda: float((c * lg.block_forward(params, x, pos, H)[0]).sum()),
            {"attn_q": params["attn_q"]},
            {"attn_q": grads["attn_q"]},
        )


def test_the_forward_equals_model_llamas_inference_block():
    """Same weights through model.llama.llama_block (fused matrices, KV cache, packed rows): the same output."""
    h = LlamaHParams(n_vocab=16, n_ctx=64, n_embd=48, n_head=6, n_kv_head=2, n_layer=1, n_ff=64)
    rng = np.random.default_rng(4)
    params = lg.init_block(h, rng, std=0.2)
    params["attn_norm"] += rng.standard_normal(h.n_embd).astype(np.float32) * np.float32(0.2)
    T, n_past = 7, 0
    x = rng.standard_normal((1, T, h.n_embd)).astype(np.float32)
    positions = np.arange(T)[None] + 2  # the first token at position 2: RoPE reads positions, not indices
    y, _ = lg.block_forward(params, x, positions, h)
    assert y.dtype == np.float32

    cache = KVCache(h)
    cache.reserve(T)
    cache.k[:, :, :2] = cache.v[:, :, :2] = 0  # two cached positions no query may see: masked below
    seen = np.concatenate([np.zeros((T, 2), bool), np.tri(T, dtype=bool)], axis=1)
    cache.length = n_past = 2
    row = Row(0, T, cache, n_past, np.where(seen, np.float32(0), np.float32(-np.inf)))
    cos, sin = rope_tables(positions[0], h.d_head, h.rope_theta)
    y_inf = llama_block(x[0], lg.inference_block(params), h, [row], 0, cos, sin)
    assert y_inf.dtype == np.float32
    np.testing.assert_allclose(y_inf, y[0], rtol=1e-4, atol=1e-5)
