"""How long OpenBLAS's idle threads spin after a threaded product: set before NumPy loads OpenBLAS, and
what OpenBLAS read. specdec/__init__.py imports this module before anything imports NumPy.

After a threaded product OpenBLAS's idle threads spin for 2^28 cycles (about 0.1 s) by default; on a
machine with few cores they hold the core that specdec's own workers (threads.py) need for the next
pass, which then takes 20-50% longer (a batch's rounds alternate the two kinds of product). 2^4
cycles: they sleep at once. OpenBLAS reads the setting once, when it loads: set it yourself, or import
NumPy first, and this changes nothing (docs/performance.md).
"""

import os
import sys

_NUMPY_FIRST = "numpy" in sys.modules  # then OpenBLAS has loaded already and read what was set then
_USER_SET = "OPENBLAS_THREAD_TIMEOUT" in os.environ
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

# What OpenBLAS read, as far as can be told: a kernel plan (tuning.py) is measured under one spin setting
# and kept for that setting only.
OPENBLAS_SPIN = os.environ["OPENBLAS_THREAD_TIMEOUT"] if _USER_SET or not _NUMPY_FIRST else "default"
