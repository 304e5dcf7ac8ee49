"""EAGLE's GPT-2 block for training: each piece's forward next to its backward, the draft's loss and gradients.

drafters/eagle.py drafts with a trained head through gpt2.transformer_block and
its own KV cache. Training it is teacher-forced on the target's true features
(Li et al., arXiv 2401.15077, section 4), with EAGLE's loss

    L = SmoothL1(y, f_next) + 0.1 * CE(y @ wte.T, target's token distribution),

and needs what gpt2.py does not have: every intermediate kept, and the backward
pass of each piece. They are written here, each next to its forward, so the
gradient checks read them side by side (tests/drafters/test_heads.py checks
every one by finite differences). A Llama-block head's backward is
train/llama_grad.py's.

Shape notation: B sequences of T positions, n_embd (e) the target's width,
n_head heads of d_head, n = B*T rows.
"""

from __future__ import annotations

import numpy as np

from ..model.attention import softmax
from ..model.gpt2 import _GELU_A, _GELU_C, gelu
from .eagle import param_shapes
from .heads import DraftVocab, head_cross_entropy, smooth_l1

F32 = np.float32
CE_WEIGHT = 0.1  # EAGLE's weight of the token loss next to the feature loss


def init_params(n_embd: int, rng: np.random.Generator, std: float = 0.02) -> dict[str, np.ndarray]:
    """GPT-2's initialisation: weights ~ N(0, 0.02^2), biases 0, LayerNorm gains 1."""
    p = {}
    for name, shape in param_shapes(1, n_embd).items():
        if name.endswith(".bias"):
            p[name] = np.zeros(shape, F32)
        elif name.startswith("ln_"):
            p[name] = np.ones(shape, F32)
        else:
            p[name] = (rng.standard_normal(shape) * std).astype(F32)
    return p


# ---------------------------------------------------------------------------
# The pieces, each forward next to its backward. x: [..., n_in]
# ---------------------------------------------------------------------------


def linear(x, params, name):
    """[..., n_in] -> [..., n_out].
    NOTE: one product over all rows ([B*T, n_in] @ [n_in, n_out]): a [B, T, n_in] operand would be
    multiplied batch by batch, 2.5x slower measured at [13, 295, 576] @ [576, 1728]."""
    w = params[name + ".weight"]
    return (x.reshape(-1, x.shape[-1]) @ w + params[name + ".bias"]).reshape(*x.shape[:-1], w.shape[1])


def linear_backward(dy, x, params, name, grads):
    """y = x W + b:  dW = x.T dy (over all rows), db = sum_rows dy, dx = dy W.T."""
    w = params[name + ".weight"]
    dy2 = dy.reshape(-1, dy.shape[-1])
    grads[name + ".weight"] += x.reshape(-1, x.shape[-1]).T @ dy2
    grads[name + ".bias"] += dy2.sum(axis=0)
    return (dy2 @ w.T).reshape(*dy.shape[:-1], w.shape[0])


def layer_norm(x, params, name, eps):
    """y = g * xhat + b, xhat = (x - mean) / sqrt(var + eps). Returns (y, (xhat, rstd))."""
    mu = x.mean(axis=-1, keepdims=True)
    rstd = F32(1) / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + F32(eps))  # [..., 1]
    xhat = (x - mu) * rstd
    return xhat * params[name + ".weight"] + params[name + ".bias"], (xhat, rstd)


def layer_norm_backward(dy, params, name, saved, grads):
    """dxhat = dy g;  dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat))  (means over the row)."""
    xhat, rstd = saved
    grads[name + ".weight"] += (dy * xhat).reshape(-1, xhat.shape[-1]).sum(axis=0)
    grads[name + ".bias"] += dy.reshape(-1, dy.shape[-1]).sum(axis=0)
    dxhat = dy * params[name + ".weight"]
    return rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True) - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))


def gelu_backward(dy, x):
    """d/dx of 0.5 x (1 + tanh(u)), u = c (x + a x^3):  0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2)."""
    t = np.tanh(_GELU_C * (x + _GELU_A * x * x * x))
    du_dx = _GELU_C * (F32(1) + F32(3) * _GELU_A * x * x)
    return dy * (F32(0.5) * (F32(1) + t) + F32(0.5) * x * (F32(1) - t * t) * du_dx)


def causal_attention(q, k, v):
    """q, k, v: [B, n_head, T, d_head] -> [B, n_head, T, d_head]; position i attends to 0..i.

    Returns (out, P) with P [B, n_head, T, T] the attention weights (for the backward).
    """
    T, d_head = q.shape[-2], q.shape[-1]
    s = (q @ k.swapaxes(-1, -2)) * F32(1 / np.sqrt(d_head))  # [B, n_head, T, T]
    future = np.triu(np.ones((T, T), bool), 1)
    P = softmax(np.where(future, F32(-np.inf), s))
    return P @ v, P


def causal_attention_backward(do, q, k, v, P):
    """Through out = P v, P = softmax(s), s = q k.T / sqrt(d):
    dP = do v.T;  dv = P.T do;  ds = P (dP - sum_j dP P);  dq = ds k / sqrt(d);  dk = ds.T q / sqrt(d).
    (Masked entries have P = 0, so ds = 0 there: the mask needs no gradient of its own.)
    """
    scale = F32(1 / np.sqrt(q.shape[-1]))
    dP = do @ v.swapaxes(-1, -2)  # [B, n_head, T, T]
    dv = P.swapaxes(-1, -2) @ do
    ds = P * (dP - (dP * P).sum(axis=-1, keepdims=True))
    return (ds @ k) * scale, (ds.swapaxes(-1, -2) @ q) * scale, dv


# ---------------------------------------------------------------------------
# The whole draft: forward (keeping what the backward needs) and backward.
# ---------------------------------------------------------------------------


def forward(params, f, emb, n_head: int, eps: float):
    """Teacher-forced draft over B sequences: f, emb [B, T, n_embd] -> y [B, T, n_embd].

    f[:, j] is the target's feature f_j; emb[:, j] the embedding of x_(j+1).
    Returns (y, saved) with saved holding every intermediate the backward reads.
    """
    B, T, e = f.shape
    d_head = e // n_head
    a = np.concatenate([f, emb], axis=-1)  # [B, T, 2e]
    u = linear(a, params, "fc")  # [B, T, e]
    h1, ln1 = layer_norm(u, params, "ln_1", eps)
    qkv = linear(h1, params, "attn.c_attn")  # [B, T, 3e]
    q, k, v = qkv.reshape(B, T, 3, n_head, d_head).transpose(2, 0, 3, 1, 4)  # each [B, n_head, T, d_head]
    o, P = causal_attention(q, k, v)
    o = o.transpose(0, 2, 1, 3).reshape(B, T, e)  # merge heads
    x = u + linear(o, params, "attn.c_proj")  # [B, T, e]
    h2, ln2 = layer_norm(x, params, "ln_2", eps)
    m = linear(h2, params, "mlp.c_fc")  # [B, T, 4e]
    g = gelu(m)
    y = x + linear(g, params, "mlp.c_proj")  # [B, T, e]
    return y, (a, h1, ln1, q, k, v, P, o, h2, ln2, m, g)


def backward(dy, params, saved, n_head: int):
    """Gradients of every parameter given dL/dy [B, T, n_embd]; the inputs are frozen data."""
    a, h1, ln1, q, k, v, P, o, h2, ln2, m, g = saved
    B, T, e = dy.shape
    grads = {name: np.zeros_like(w) for name, w in params.items()}
    # y = x + c_proj(gelu(c_fc(ln_2(x))))
    dg = linear_backward(dy, g, params, "mlp.c_proj", grads)
    dm = gelu_backward(dg, m)
    dh2 = linear_backward(dm, h2, params, "mlp.c_fc", grads)
    dx = dy + layer_norm_backward(dh2, params, "ln_2", ln2, grads)
    # x = u + c_proj(attention(split(c_attn(ln_1(u)))))
    do = linear_backward(dx, o, params, "attn.c_proj", grads)
    do = do.reshape(B, T, n_head, e // n_head).transpose(0, 2, 1, 3)  # split heads
    dq, dk, dv = causal_attention_backward(do, q, k, v, P)
    dqkv = np.stack([dq, dk, dv]).transpose(1, 3, 0, 2, 4).reshape(B, T, 3 * e)  # inverse of the split
    dh1 = linear_backward(dqkv, h1, params, "attn.c_attn", grads)
    du = dx + layer_norm_backward(dh1, params, "ln_1", ln1, grads)
    linear_backward(du, a, params, "fc", grads)
    return grads


def loss_and_grads(params, f, emb, f_next, p_next, vocab: DraftVocab, n_head: int, eps: float):
    """EAGLE's loss on one batch and its gradients.

    f, emb, f_next: [B, T, n_embd] (f_next[:, j] = f_(j+1), the feature to predict);
    p_next: [B*T, N] what the target puts on each token of the draft vocabulary
    after f_(j+1) (its distribution, or one-hot tokens). Returns
    (loss, (feature loss, token CE), grads, logits [B*T, N]).
    """
    B, T, e = f.shape
    y, saved = forward(params, f, emb, n_head, eps)
    l_feat, dy_feat = smooth_l1(y, f_next)
    ce, dy_ce, logits = head_cross_entropy(y.reshape(B * T, e), p_next, vocab)
    dy = dy_feat + F32(CE_WEIGHT) * dy_ce.reshape(B, T, e)
    return l_feat + CE_WEIGHT * ce, (l_feat, ce), backward(dy, params, saved, n_head), logits
