"""A Llama block for training: the forward pass keeping what the backward needs, and the backward.

model/llama.py runs a Llama block for inference (a packed batch, a KV cache,
fused matrices); training a draft on a Llama (an EAGLE head's one block, a small
draft model's stack of them) needs the same math batched over whole sequences,
every intermediate kept, and the gradient of each piece. They are written here,
each backward next to its forward, smallest first (RMSNorm, RoPE, grouped-query
attention, SwiGLU), then the whole pre-norm block:

    x = x + W_o attn(rope(W_q a), rope(W_k a), W_v a),   a = rms_norm(x) * attn_norm
    y = x + W_down (silu(W_gate f) * (W_up f)),          f = rms_norm(x) * ffn_norm

API (what a caller needs; shapes in the notation below):

    params      {prefix + name: array}, one block's nine tensors under the GGUF names of
                model.llama.LlamaBlock.CHECKPOINT_NAMES, matrices stored as GGUF stores them,
                [n_out, n_in] (y = x @ W.T):
                    attn_norm [e]            attn_q [n_head*d, e]   attn_k, attn_v [n_kv_head*d, e]
                    attn_output [e, n_head*d]  ffn_norm [e]
                    ffn_gate, ffn_up [n_ff, e]   ffn_down [e, n_ff]
                A stack of blocks uses one prefix per block ("blk.0.", "blk.1.", ...) in one dict.
    block_shapes(h, prefix) / init_block(h, rng, prefix): the names, shapes and a fresh block
                (init_tensors(shapes, rng) for any such dict: a stack's, a head's).
    block_forward(params, x, positions, h, mask=None, prefix="") -> (y, saved)
                x [B, T, e]; positions [B, T] (RoPE); mask [B, T, T] bool, True where query i
                may attend to key j (None: causal; causal_mask(lengths, T) also hides padding).
    block_backward(dy, params, saved, h, grads=None, prefix="") -> (dx, grads)
                grads: {prefix + name: gradient}, added into `grads` when given (a stack shares one).
    inference_block(params, prefix="") -> model.llama.LlamaBlock: the same weights for
                model.llama.llama_block (drafting with a KV cache), float32; it is just
                LlamaBlock.fuse(**{name: params[prefix + name]}).
    h is a model.llama.LlamaHParams (reads n_head, n_kv_head, d_head, n_ff, rms_eps, rope_theta).

Every function keeps the dtype it is given (float32 for training, float64 for the
gradient checks in tests/train/test_llama_grad.py).

Shape notation: B sequences of T positions, e = n_embd, d = d_head, n_kv = n_kv_head,
group = n_head // n_kv_head (query head h reads key/value head h // group).
"""

from __future__ import annotations

import numpy as np

from ..model.llama import LlamaBlock, LlamaHParams, rope_tables, rotate

F32 = np.float32
NAMES = LlamaBlock.CHECKPOINT_NAMES


def block_shapes(h: LlamaHParams, prefix: str = "") -> dict[str, tuple[int, ...]]:
    """{prefix + name: shape} of one block's nine tensors (LlamaBlock.checkpoint_shapes)."""
    return {prefix + name: shape for name, shape in LlamaBlock.checkpoint_shapes(h).items()}


def init_block(h: LlamaHParams, rng: np.random.Generator, prefix: str = "", std: float = 0.02) -> dict[str, np.ndarray]:
    """A fresh block: the block starts near the identity (x + small), see init_tensors."""
    return init_tensors(block_shapes(h, prefix), rng, std)


def init_tensors(
    shapes: dict[str, tuple[int, ...]], rng: np.random.Generator, std: float = 0.02
) -> dict[str, np.ndarray]:
    """Matrices ~ N(0, std^2), vectors (RMSNorm gains) 1."""
    return {
        name: np.ones(shape, F32) if len(shape) == 1 else (rng.standard_normal(shape) * std).astype(F32)
        for name, shape in shapes.items()
    }


def inference_block(params: dict[str, np.ndarray], prefix: str = "") -> LlamaBlock:
    """The same weights as model.llama's LlamaBlock (q, k, v and gate, up fused), float32, for drafting."""
    return LlamaBlock.fuse(**{name: np.ascontiguousarray(params[prefix + name], dtype=F32) for name in NAMES})


# ---------------------------------------------------------------------------
# The pieces, each forward next to its backward.
# ---------------------------------------------------------------------------


def matmul_backward(dy, x, w):
    """y = x @ W.T (W [n_out, n_in]):  dW = dy.T x (over all rows),  dx = dy W."""
    dw = dy.reshape(-1, dy.shape[-1]).T @ x.reshape(-1, x.shape[-1])  # [n_out, n_in]
    return dy @ w, dw


def rms_norm(x, g, eps):
    """y = xhat g, xhat = x r, r = 1 / sqrt(mean(x^2) + eps) (Zhang & Sennrich, arXiv 1910.07467).  [..., e]

    Returns (y, (xhat, r)): the same arithmetic as model.llama.rms_norm, plus what the backward reads.
    """
    r = 1 / np.sqrt(np.square(x).sum(axis=-1, keepdims=True) / x.dtype.type(x.shape[-1]) + x.dtype.type(eps))
    xhat = x * r  # [..., e]
    return xhat * g, (xhat, r)


def rms_norm_backward(dy, g, saved):
    """dg = sum_rows dy xhat;  dx = r (dxhat - xhat mean(dxhat xhat)),  dxhat = dy g (no mean term: no centring)."""
    xhat, r = saved
    dg = (dy * xhat).reshape(-1, xhat.shape[-1]).sum(axis=0)
    dxhat = dy * g
    return r * (dxhat - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)), dg


def rope(positions, h: LlamaHParams, dtype) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin of each position's angles, [B, T] -> two [B, 1, T, d] (broadcast over heads), as model.llama."""
    cos, sin = rope_tables(np.asarray(positions).reshape(-1), h.d_head, h.rope_theta, dtype)  # [B*T, d]
    B, T = np.shape(positions)
    return cos.reshape(B, 1, T, h.d_head), sin.reshape(B, 1, T, h.d_head)


def rotate_backward(dy, cos, sin):
    """RoPE turns each pair (x1, x2) by an angle; the transpose of a rotation turns back by the same angle.

    y = x cos + rot(x) sin with rot(x1, x2) = (-x2, x1), and rot.T = -rot, so
    dx = dy cos - rot(dy sin) = rotate(dy, cos, -sin).
    """
    return rotate(dy, cos, -sin)


def causal_mask(lengths, T: int) -> np.ndarray:
    """[B] true lengths -> [B, T, T] bool: query i sees key j when j <= i and j is not padding.

    NOTE: a padded query (i >= length) still sees the real keys, so its softmax is
    never over nothing; its output is garbage the loss must not read.
    """
    causal = np.tri(T, dtype=bool)  # [T, T]
    real = np.arange(T)[None, :] < np.asarray(lengths)[:, None]  # [B, T] which keys are real
    return causal[None] & real[:, None, :]


def gqa_attention(q, k, v, mask):
    """Grouped-query attention (Ainslie et al., arXiv 2305.13245) over whole sequences.

    q [B, n_head, T, d], k, v [B, n_kv, T, d], mask [B, T, T] bool -> (out [B, n_head, T, d], P).
    The group query heads that read one key/value head are stacked: q -> [B, n_kv, group, T, d],
    so P is [B, n_kv, group, T, T].
    """
    B, n_head, T, d = q.shape
    n_kv = k.shape[1]
    g = n_head // n_kv
    # NOTE: the group's queries are stacked as rows, [B, n_kv, g*T, d] @ [B, n_kv, d, T]: one product per key/value
    # head. Broadcasting k over a group axis instead ([B, n_kv, g, T, d] @ [B, n_kv, 1, d, T]) is the same
    # arithmetic, but NumPy multiplies the broadcast stack 1.4x more slowly (forward and backward, B=12, T=300).
    s = (q.reshape(B, n_kv, g * T, d) @ k.swapaxes(-1, -2)).reshape(B, n_kv, g, T, T)  # head h = (h // g, h % g)
    s *= q.dtype.type(1 / np.sqrt(d))
    s = np.where(mask[:, None, None], s, -np.inf)
    s = s - s.max(axis=-1, keepdims=True)
    P = np.exp(s)
    P /= P.sum(axis=-1, keepdims=True)  # [B, n_kv, g, T, T]
    return (P.reshape(B, n_kv, g * T, T) @ v).reshape(B, n_head, T, d), P


def gqa_attention_backward(do, q, k, v, P):
    """Through out = P v, P = softmax(s), s = q k.T / sqrt(d), each key/value head read by `group` queries:
    dv = sum_group P.T do;  dP = do v.T;  ds = P (dP - sum_j dP P);  dq = ds k / sqrt(d);  dk = sum_group ds.T q / sqrt(d).
    (Masked entries have P = 0, so ds = 0 there: the mask needs no gradient of its own.)
    """
    B, n_head, T, d = q.shape
    n_kv = k.shape[1]
    g = n_head // n_kv
    scale = q.dtype.type(1 / np.sqrt(d))
    do = do.reshape(B, n_kv, g * T, d)  # the group's rows stacked, as in the forward
    P2 = P.reshape(B, n_kv, g * T, T)
    dv = P2.swapaxes(-1, -2) @ do  # [B, n_kv, T, d]: the product sums over the group's rows
    dP = do @ v.swapaxes(-1, -2)  # [B, n_kv, g*T, T]
    ds = P2 * (dP - (dP * P2).sum(axis=-1, keepdims=True))
    dq = (ds @ k) * scale  # [B, n_kv, g*T, d]
    dk = (ds.swapaxes(-1, -2) @ q.reshape(B, n_kv, g * T, d)) * scale  # [B, n_kv, T, d], summed over the group
    return dq.reshape(B, n_head, T, d), dk, dv


def silu(x):
    """x sigmoid(x), and sigmoid(x) (the backward reads it).  NOTE: exp overflows harmlessly to inf below -88."""
    with np.errstate(over="ignore"):
        s = 1 / (1 + np.exp(-x))
    return x * s, s


def swiglu_backward(dm, gate, up, s):
    """m = silu(gate) up (Shazeer, arXiv 2002.05202): d silu(a)/da = s (1 + a (1 - s)), s = sigmoid(a)."""
    return dm * up * s * (1 + gate * (1 - s)), dm * gate * s  # dgate, dup


# ---------------------------------------------------------------------------
# The whole block.
# ---------------------------------------------------------------------------


def block_forward(params, x, positions, h: LlamaHParams, mask=None, prefix: str = ""):
    """One pre-norm Llama block over B sequences: x [B, T, e] -> (y [B, T, e], saved for block_backward).

    positions [B, T]: each token's rotary position; mask [B, T, T] bool (None: causal).
    """
    B, T, e = x.shape
    n_head, n_kv, d = h.n_head, h.n_kv_head, h.d_head
    w = {name: params[prefix + name] for name in NAMES}
    mask = np.broadcast_to(np.tri(T, dtype=bool), (B, T, T)) if mask is None else mask
    cos, sin = rope(positions, h, x.dtype)  # [B, 1, T, d]

    a, norm1 = rms_norm(x, w["attn_norm"], h.rms_eps)  # [B, T, e]
    q = rotate((a @ w["attn_q"].T).reshape(B, T, n_head, d).transpose(0, 2, 1, 3), cos, sin)  # [B, n_head, T, d]
    k = rotate((a @ w["attn_k"].T).reshape(B, T, n_kv, d).transpose(0, 2, 1, 3), cos, sin)  # [B, n_kv, T, d]
    v = (a @ w["attn_v"].T).reshape(B, T, n_kv, d).transpose(0, 2, 1, 3)  # [B, n_kv, T, d]
    o, P = gqa_attention(q, k, v, mask)
    o = o.transpose(0, 2, 1, 3).reshape(B, T, n_head * d)  # merge heads
    x1 = x + o @ w["attn_output"].T  # [B, T, e]

    f, norm2 = rms_norm(x1, w["ffn_norm"], h.rms_eps)  # [B, T, e]
    gate, up = f @ w["ffn_gate"].T, f @ w["ffn_up"].T  # [B, T, n_ff] each
    sg, s = silu(gate)
    m = sg * up  # [B, T, n_ff]
    y = x1 + m @ w["ffn_down"].T  # [B, T, e]
    return y, (x, a, norm1, q, k, v, P, cos, sin, o, x1, f, norm2, gate, up, s, m)


def block_backward(dy, params, saved, h: LlamaHParams, grads: dict | None = None, prefix: str = ""):
    """dL/dy [B, T, e] -> (dL/dx [B, T, e], grads), every parameter's gradient added into grads[prefix + name]."""
    x, a, norm1, q, k, v, P, cos, sin, o, x1, f, norm2, gate, up, s, m = saved
    B, T, e = dy.shape
    n_head, n_kv, d = h.n_head, h.n_kv_head, h.d_head
    w = {name: params[prefix + name] for name in NAMES}
    g = {}
    # y = x1 + W_down (silu(W_gate f) * W_up f)
    dm, g["ffn_down"] = matmul_backward(dy, m, w["ffn_down"])
    dgate, dup = swiglu_backward(dm, gate, up, s)
    df_gate, g["ffn_gate"] = matmul_backward(dgate, f, w["ffn_gate"])
    df_up, g["ffn_up"] = matmul_backward(dup, f, w["ffn_up"])
    dx1_norm, g["ffn_norm"] = rms_norm_backward(df_gate + df_up, w["ffn_norm"], norm2)
    dx1 = dy + dx1_norm
    # x1 = x + W_o attn(rope(W_q a), rope(W_k a), W_v a)
    do, g["attn_output"] = matmul_backward(dx1, o, w["attn_output"])
    do = do.reshape(B, T, n_head, d).transpose(0, 2, 1, 3)  # split heads
    dq, dk, dv = gqa_attention_backward(do, q, k, v, P)
    dq = rotate_backward(dq, cos, sin).transpose(0, 2, 1, 3).reshape(B, T, n_head * d)
    dk = rotate_backward(dk, cos, sin).transpose(0, 2, 1, 3).reshape(B, T, n_kv * d)
    dv = dv.transpose(0, 2, 1, 3).reshape(B, T, n_kv * d)
    da_q, g["attn_q"] = matmul_backward(dq, a, w["attn_q"])
    da_k, g["attn_k"] = matmul_backward(dk, a, w["attn_k"])
    da_v, g["attn_v"] = matmul_backward(dv, a, w["attn_v"])
    dx_norm, g["attn_norm"] = rms_norm_backward(da_q + da_k + da_v, w["attn_norm"], norm1)
    grads = {} if grads is None else grads
    for name, value in g.items():
        key = prefix + name
        grads[key] = grads[key] + value if key in grads else value
    return dx1 + dx_norm, grads
