"""Medusa-1 heads: extra decoding heads on the target's last hidden state, forward and backward.

Cai et al., "Medusa: Simple LLM Inference Acceleration Framework with Multiple
Decoding Heads" (arXiv 2401.10774), section 2.1.1. The target's hidden state h_t
(after ln_f, at the position whose logits give token x_(t+1)) already carries a
lot about the tokens after x_(t+1). Head i (i = 0 .. n_heads-1) guesses token
x_(t+i+2) from h_t alone:

    r_i = h + SiLU(h @ W_i + b_i)        a ResBlock          [n, n_embd]
    logits_i = r_i @ wte.T               the target's own frozen, tied LM head

W_i starts at zero, so an untrained head is the plain LM head (it guesses that
x_(t+i+2) is whatever the target predicts for x_(t+1)), and training only has to
learn the correction. Medusa-1 trains the heads alone, the target frozen, with
the loss sum_i lambda_i CE_i, lambda_i = 0.8^(i+1) (the paper's lambda_k = 0.8^k
for head k = 1, 2, ...): later heads are less accurate and count less.

Drafting costs no extra target pass: the verification pass already computes the
hidden state at the last accepted position, and the heads read it.

This file holds the head's forward pass and, right beside it, its backward pass,
so one can be checked against the other (tests/test_heads.py does, by finite
differences).

Shape notation: n rows, n_embd the target's width, n_heads heads.
"""

from __future__ import annotations

import numpy as np

from .heads import DraftVocab, head_cross_entropy

F32 = np.float32
DECAY = 0.8  # lambda_i = DECAY^(i+1), Medusa-1's per-head loss weight


def init_params(n_heads: int, n_embd: int) -> dict[str, np.ndarray]:
    """Medusa's initialisation: W = 0 and b = 0, so every head starts as the LM head."""
    return {
        "w": np.zeros((n_heads, n_embd, n_embd), F32),  # [n_heads, n_embd, n_embd], y = h @ w[i]
        "b": np.zeros((n_heads, n_embd), F32),  # [n_heads, n_embd]
    }


def sigmoid(x: np.ndarray) -> np.ndarray:
    return F32(0.5) * (F32(1) + np.tanh(F32(0.5) * x))  # = 1 / (1 + e^-x), without overflow


def resblock(h: np.ndarray, w: np.ndarray, b: np.ndarray):
    """One head's ResBlock: r = h + SiLU(h @ w + b).  [n, n_embd] -> [n, n_embd]

    Returns (r, saved) where saved = (z, s) is what the backward pass needs.
    """
    z = h @ w + b  # [n, n_embd]
    s = sigmoid(z)
    return h + z * s, (z, s)  # SiLU(z) = z * sigmoid(z)


def resblock_backward(dr: np.ndarray, h: np.ndarray, w: np.ndarray, saved):
    """Gradients of the ResBlock given dL/dr: returns (dw, db, dh).

    SiLU'(z) = s + z s (1 - s), s = sigmoid(z)
    dz = dr * SiLU'(z);  dw = h.T @ dz;  db = sum_rows dz;  dh = dr + dz @ w.T
    """
    z, s = saved
    dz = dr * (s + z * s * (F32(1) - s))  # [n, n_embd]
    return h.T @ dz, dz.sum(axis=0), dr + dz @ w.T


def head_logits(params: dict[str, np.ndarray], h: np.ndarray, vocab: DraftVocab, heads=None) -> np.ndarray:
    """Every head's logits for hidden states h: [n, n_embd] -> [n_heads, n, N] (N: draft vocabulary)."""
    heads = range(params["w"].shape[0]) if heads is None else heads
    return np.stack([vocab.logits(resblock(h, params["w"][i], params["b"][i])[0]) for i in heads])


def loss_and_grads(params: dict[str, np.ndarray], h: np.ndarray, targets: list[np.ndarray], vocab: DraftVocab):
    """Medusa-1's loss, sum_i lambda_i CE_i, and its gradients.

    h: [n, n_embd] target hidden states; targets[i]: [n_i, N] what head i should
    put on each token (n_i <= n: head i reads rows 0..n_i-1, since near the end
    of a sequence there is no token i+2 places ahead). Returns
    (loss, per-head CE list, grads dict like params, per-head logits list).
    """
    n_heads = params["w"].shape[0]
    grads = {name: np.zeros_like(a) for name, a in params.items()}
    total, per_head, logits = 0.0, [], []
    for i in range(n_heads):
        n_i = targets[i].shape[0]
        if n_i == 0:
            per_head.append(float("nan"))
            logits.append(None)
            continue
        weight = DECAY ** (i + 1)
        hi = h[:n_i]
        r, saved = resblock(hi, params["w"][i], params["b"][i])
        ce, dr, z = head_cross_entropy(r, targets[i], vocab)  # dr: [n_i, n_embd]
        dw, db, _ = resblock_backward(dr * F32(weight), hi, params["w"][i], saved)
        grads["w"][i], grads["b"][i] = dw, db
        total += weight * ce
        per_head.append(ce)
        logits.append(z)
    return total, per_head, grads, logits
