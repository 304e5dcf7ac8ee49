"""Llama's fused products (q, k, v as attn_qkv; gate, up as ffn_gate_up) and the kernel's thread settings
for a pass of a few tokens."""

from __future__ import annotations

import numpy as np
import pytest

from specdec.model import llama
from specdec.model.fast import kernels, threads
from specdec.model.linear import Linear
from specdec.model.llama import LlamaBlock, LlamaHParams, random_llama


def test_a_fused_block_keeps_the_checkpoints_matrices_by_name_and_writes_through():
    h = LlamaHParams(n_vocab=64, n_ctx=32, n_embd=32, n_head=4, n_kv_head=2, n_layer=1, n_ff=48)
    rng = np.random.default_rng(0)
    shapes = {
        "attn_q": (32, 32),
        "attn_k": (16, 32),
        "attn_v": (16, 32),
        "attn_output": (32, 32),
        "ffn_gate": (48, 32),
        "ffn_up": (48, 32),
        "ffn_down": (32, 48),
    }
    w = {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in shapes.items()}
    norms = {"attn_norm": np.ones(32, np.float32), "ffn_norm": np.ones(32, np.float32)}
    block = LlamaBlock.fuse(**norms, **w)
    assert block.attn_qkv.w_t.shape == (64, 32) and block.ffn_gate_up.w_t.shape == (96, 32)  # GQA: k, v narrower
    for name, array in w.items():
        assert np.array_equal(getattr(block, name).w_t, array), name
    assert list(block.checkpoint_tensors()) == list(LlamaBlock.CHECKPOINT_NAMES)
    model = random_llama(h, seed=2, scale=0.3)
    before = model([1, 2, 3])
    b = model.weights.blocks[0]
    b.attn_k = Linear(b.attn_k.w_t * 2, None)  # written into attn_qkv's k rows: the forward pass sees it
    assert np.array_equal(b.attn_qkv.w_t[32:48], b.attn_k.w_t) and np.abs(model([1, 2, 3]) - before).max() > 1e-3
    with pytest.raises(ValueError, match="attn_v is 16 x 32"):
        b.attn_v = Linear(np.ones((32, 32), np.float32), None)


@pytest.mark.skipif(threads.BLAS is None, reason="NumPy's OpenBLAS was not found: nothing to switch")
def test_a_pass_of_a_few_tokens_runs_attention_with_openblas_on_one_thread(monkeypatch):
    """Attention's small products must not wait for OpenBLAS's threads; a long pass keeps them."""
    model = random_llama(LlamaHParams(n_vocab=64, n_ctx=256, n_embd=32, n_head=4, n_kv_head=2, n_layer=2, n_ff=48))
    seen = []
    grouped = llama.grouped_attention

    def spy(*args):
        seen.append(threads.BLAS.get())
        return grouped(*args)

    monkeypatch.setattr(llama, "grouped_attention", spy)
    before = threads.BLAS.get()
    threads.BLAS.set(2)
    try:
        model([1, 2, 3, 4, 5])
        assert set(seen) == {1} and threads.BLAS.get() == 2, "one thread inside the pass, put back after it"
        seen.clear()
        model([i % 64 for i in range(kernels.MAX_SPLIT_ROWS + 1)])
        assert set(seen) == {2}
    finally:
        threads.BLAS.set(before)
