"""The optimizer for the draft heads: AdamW written out, and its learning-rate schedule."""

from __future__ import annotations

import math

import numpy as np

F32 = np.float32


# AdamW (Loshchilov & Hutter, arXiv 1711.05101), written out.
# ---------------------------------------------------------------------------


class AdamW:
    """Adam with decoupled weight decay, over a dict of named float32 arrays (updated in place).

    For each parameter w with gradient g, at step t = 1, 2, ...:
        m = b1 m + (1 - b1) g                 first moment
        v = b2 v + (1 - b2) g^2               second moment
        w -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)  +  lr wd w   (matrices only)
    Weight decay skips vectors (biases, LayerNorm gains), as GPT-2 training does.
    """

    def __init__(self, params: dict[str, np.ndarray], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        self.params, self.lr, self.eps, self.weight_decay = params, lr, eps, weight_decay
        self.b1, self.b2 = betas
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.t = 0

    def step(self, grads: dict[str, np.ndarray], lr: float | None = None) -> None:
        lr = self.lr if lr is None else lr
        self.t += 1
        c1, c2 = 1 - self.b1**self.t, 1 - self.b2**self.t  # bias corrections
        for name, w in self.params.items():
            g = grads[name]
            m, v = self.m[name], self.v[name]
            m *= self.b1
            m += (1 - self.b1) * g
            v *= self.b2
            v += (1 - self.b2) * g * g
            if self.weight_decay and w.ndim > 1:
                w -= F32(lr * self.weight_decay) * w
            w -= F32(lr / c1) * m / (np.sqrt(v / F32(c2)) + F32(self.eps))

    def state(self) -> dict[str, np.ndarray]:
        """The optimizer's moments as flat named arrays (for a resumable checkpoint)."""
        return {**{f"adam.m.{k}": v for k, v in self.m.items()}, **{f"adam.v.{k}": v for k, v in self.v.items()}}

    def load_state(self, tensors: dict[str, np.ndarray], t: int) -> None:
        for k in self.params:
            self.m[k][...] = tensors[f"adam.m.{k}"]
            self.v[k][...] = tensors[f"adam.v.{k}"]
        self.t = t


def cosine_lr(step: int, total: int, lr: float, warmup: int) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to lr/10 at `total`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
