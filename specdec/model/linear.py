"""A weight matrix and its bias, and what `x @ W` means in the model files.

gpt2.py and llama.py write every projection as `x @ lin`, a Linear holding a
checkpoint's W [n_in, n_out] and b [n_out]: it is exactly x @ W + b. W is kept
transposed, as w_t [n_out, n_in], contiguous: a checkpoint's GPT-2 Conv1D
stores W as [n_in, n_out] and a GGUF as [n_out, n_in], and one layout serves both.

How such a product is computed is chosen once for the process, when specdec is
imported (SPECDEC_KERNELS) or later from Python (`specdec.set_kernels`):

    "plain"    NumPy's own `x @ W + b`: nothing else runs. Read a pass this way,
               and test the fast products against it.
    otherwise  the fast products of model/fast/: each matrix's rows split over
               the cores, OpenBLAS's threads set per pass, a plan measured per
               machine. The same numbers up to float32 rounding (their sums are
               taken in another order), in less time: decoding is memory-bound,
               and those products read each weight from RAM once per pass.

Nothing in a model file depends on which is chosen.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np


class Linear:
    """y = x @ W + b for a checkpoint's W [n_in, n_out], kept as w_t = W.T [n_out, n_in]; b [n_out] or None.

    `weight` gives W back as the checkpoint has it (a view, no copy).
    """

    # NOTE: this tells NumPy that an array @ a Linear is the Linear's to compute (its __rmatmul__), rather than
    # NumPy's own @ over a Linear taken as a 0-d array of objects (an error).
    __array_ufunc__ = None

    def __init__(self, w_t: np.ndarray, b: np.ndarray | None):
        self.w_t = np.ascontiguousarray(w_t)  # [n_out, n_in], float32 (float64 for the exact-greedy option)
        assert self.w_t.dtype in (np.float32, np.float64), f"weights must be float32 or float64, not {w_t.dtype}"
        self.b = b  # [n_out], or None (Llama's matrices, every LM head)
        self.fast = None  # what model/fast/ keeps for this matrix (its parts, its shape's key), made there on first use

    def __rmatmul__(self, x: np.ndarray) -> np.ndarray:
        """x @ W + b: [n_seq, n_in] -> [n_seq, n_out], by the products chosen for this process."""
        return PRODUCTS.matmul(x, self)

    @property
    def weight(self) -> np.ndarray:
        return self.w_t.T  # [n_in, n_out], as in the checkpoint

    @classmethod
    def from_checkpoint(cls, w: np.ndarray, b: np.ndarray | None) -> Linear:
        """From W as a GPT-2 checkpoint stores it, [n_in, n_out] (one transposed copy, made once)."""
        return cls(np.ascontiguousarray(np.asarray(w).T), b)


class Plain:
    """Products as written: NumPy's own @. The reference every faster way is tested against."""

    name = "plain"

    @staticmethod
    def matmul(x: np.ndarray, lin: Linear) -> np.ndarray:
        y = x @ lin.w_t.T  # [n_seq, n_in] @ [n_in, n_out]
        return y if lin.b is None else y + lin.b

    @staticmethod
    def pass_of(n_tok: int):
        """Nothing to set around a forward pass."""
        return nullcontext()


PLAIN = Plain()
# The products this process runs: PLAIN, or model/fast/'s (chosen by set_products, never elsewhere).
PRODUCTS = PLAIN


def set_products(products) -> None:
    """Run every product from now on with `products` (PLAIN, or fast.FAST): specdec.set_kernels calls this."""
    global PRODUCTS
    PRODUCTS = products
