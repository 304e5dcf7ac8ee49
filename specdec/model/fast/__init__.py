"""How a model's products run fast on a CPU: the one piece beside the model that a reader of a pass can skip.

Every projection in gpt2.py and llama.py is `x @ lin` (model/linear.py): exactly
x @ W + b. This package makes those products fast without a line of the model
changing:

    kernels.py  `linear`: each matrix's rows split into one part per core, a few
                tokens as stacks of cache-sized products (a verification pass),
                OpenBLAS's threads for a long prompt; `pass_threads` around a pass
    threads.py  specdec's worker threads, and OpenBLAS's thread count set and put back
    tuning.py   which of those ways wins, per matrix shape and pass length, timed
                once per machine at load and kept in a checked plan file
    spin.py     how long OpenBLAS's idle threads spin (set before NumPy loads it)

`set_kernels(mode)` (or SPECDEC_KERNELS, read when a model loads) chooses:

    "plan"     the fast products with this machine's measured plan (the default)
    "measure"  the same, the plan timed again at the next load
    "rules"    the fast products by fixed rules, nothing timed
    "plain"    NumPy's own `x @ W + b`, nothing of this package running: for
               reading, and the reference the fast products are tested against

May import: NumPy, model/linear.py (what it runs faster) and the modules of model/fast/ itself; the model files
never import it (checkpoints/load.py applies the mode when a model loads).
"""

from .spin import OPENBLAS_SPIN  # isort: skip (first: it sets OpenBLAS's spin before NumPy loads OpenBLAS)

from .. import linear
from . import kernels, tuning


class Fast:
    """The fast products (kernels.linear), and OpenBLAS's threads set for each pass (kernels.pass_threads)."""

    name = "fast"
    matmul = staticmethod(kernels.linear)
    pass_of = staticmethod(kernels.pass_threads)


FAST = Fast()


def set_kernels(mode: str) -> None:
    """How every product runs from now on, in this process: "plan", "measure", "rules" or "plain" (above).
    A mode set here outranks SPECDEC_KERNELS; set_kernels(None) follows the variable again."""
    tuning.MODE = None if mode is None else tuning.check_mode(mode)
    use(tuning.kernels_mode())


def use(mode: str) -> None:
    """The products for a checked mode: PLAIN for "plain", FAST for the rest."""
    linear.set_products(linear.PLAIN if mode == "plain" else FAST)


def use_from_env() -> None:
    """At import: the products SPECDEC_KERNELS names (a value it cannot take is refused when a model loads)."""
    try:
        use(tuning.kernels_mode())
    except ValueError:
        use("plan")


use_from_env()

__all__ = ["FAST", "OPENBLAS_SPIN", "set_kernels", "use"]
