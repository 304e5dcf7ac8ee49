"""Both cores for one weight matrix: OpenBLAS on one thread, and specdec's own workers.

(The same workers also split the loader's transposed copies and NaN scan: gpt2.transposed_copy,
checkpoints/safetensors.check_finite.)

What it adds: `linear()` in gpt2.py splits the rows of each weight matrix into
one part per core and multiplies the parts at the same time, each on its own
thread with OpenBLAS told to use a single thread. NumPy releases the GIL
inside matmul, so the parts really run in parallel.

Why not leave the threading to OpenBLAS: for one token it splits a
matrix-vector product over both cores well, but a verification pass over a few
tokens is a stack of small products (see `linear`), and OpenBLAS then wakes and
synchronises its threads for every product of the stack. Splitting once per
matrix, above the stack, costs one hand-off per matrix instead, and each core
keeps its own rows of W in its own L2 cache while every token uses them.

OpenBLAS's thread count is changed only inside `blas_threads` blocks (1 for a
split product and for a whole pass of a few tokens, its own count for a product
a measured plan gives to OpenBLAS: kernels.py, tuning.py) and put back after
them, through the C API of the OpenBLAS that NumPy's wheels bundle (found with
ctypes as threadpoolctl finds it), so the rest of the process sees OpenBLAS as
it was. Where OpenBLAS cannot be found (NumPy built
against MKL or Accelerate, say), `default_workers()` is 1 and nothing here runs.
"""

from __future__ import annotations

import ctypes
import os
import queue
import threading
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Callable

import numpy as np

MAX_WORKERS = 8  # beyond this, splitting one matrix further gains nothing measurable


class OpenBLAS:
    """The thread count of the OpenBLAS library NumPy uses, read and set through its C API."""

    # (get, set) symbol pairs: NumPy >= 2 wheels (scipy-openblas, 64-bit ints), older wheels, system builds.
    _SYMBOLS = (
        ("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
        ("scipy_openblas_get_num_threads", "scipy_openblas_set_num_threads"),
        ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
        ("openblas_get_num_threads", "openblas_set_num_threads"),
    )

    def __init__(self, get: Callable[[], int], set_: Callable[[int], None], name: str, core: str = "unknown"):
        self.get, self.set, self.name = get, set_, name
        self.core = core  # the kernel family OpenBLAS picked for this CPU at load time, e.g. "Haswell"

    @classmethod
    def find(cls) -> "OpenBLAS | None":
        """NumPy's bundled OpenBLAS (numpy.libs/ or numpy/.dylibs/), or None."""
        root = Path(np.__file__).parent
        candidates = [
            *sorted((root.parent / "numpy.libs").glob("*openblas*")),
            *sorted((root / ".dylibs").glob("*openblas*")),
        ]
        for path in candidates:
            try:
                lib = ctypes.CDLL(str(path))
            except OSError:
                continue
            for get_name, set_name in cls._SYMBOLS:
                get, set_ = getattr(lib, get_name, None), getattr(lib, set_name, None)
                if get is not None and set_ is not None:
                    get.restype, set_.argtypes, set_.restype = ctypes.c_int, [ctypes.c_int], None
                    corename = getattr(lib, get_name.replace("num_threads", "corename"), None)
                    core = "unknown"
                    if corename is not None:
                        corename.restype = ctypes.c_char_p
                        core = corename().decode(errors="replace")
                    return cls(get, set_, f"{path.name}:{set_name}", core)
        return None


class Workers:
    """n - 1 helper threads; `run(jobs)` runs jobs[0] on the calling thread and the rest on the helpers.

    Jobs are functions of no arguments that write their results somewhere (each
    into its own columns of one output array). A call from a second thread while
    the helpers are busy runs its jobs one after another on that thread: correct,
    just not parallel.
    """

    def __init__(self, n: int, blas: OpenBLAS | None):
        self.n, self.blas = n, blas
        self._lock = threading.Lock()
        self._pid = None  # the process the helper threads belong to (they do not survive a fork)
        self._inboxes: list[queue.SimpleQueue] = []
        self._done: queue.SimpleQueue = queue.SimpleQueue()

    def _start(self) -> None:
        self._inboxes = [queue.SimpleQueue() for _ in range(self.n - 1)]
        self._done = queue.SimpleQueue()
        for inbox in self._inboxes:
            threading.Thread(target=self._serve, args=(inbox, self._done), daemon=True, name="specdec-worker").start()
        self._pid = os.getpid()

    @staticmethod
    def _serve(inbox: queue.SimpleQueue, done: queue.SimpleQueue) -> None:
        while True:
            job = inbox.get()
            try:
                job()
                done.put(None)
            except BaseException as e:  # handed to the caller, which re-raises it
                done.put(e)

    def run(self, jobs: list[Callable[[], None]], blas: bool = True) -> None:
        """Run the jobs at once and wait for all. blas=False: jobs that call no BLAS (copies, scans),
        so OpenBLAS's thread count is left alone."""
        assert len(jobs) <= self.n, f"{len(jobs)} jobs for {self.n} workers"
        if len(jobs) == 1 or not self._lock.acquire(blocking=False):
            for job in jobs:
                job()
            return
        try:
            if self._pid != os.getpid():
                self._start()
            with blas_threads(1) if self.blas and blas else nullcontext():  # our threads are the parallelism
                for inbox, job in zip(self._inboxes, jobs[1:]):
                    inbox.put(job)
                error = None
                try:
                    jobs[0]()
                except BaseException as e:
                    error = e
                for _ in jobs[1:]:  # always collect every helper, even after an error
                    error = self._done.get() or error
            if error is not None:
                raise error
        finally:
            self._lock.release()


# OpenBLAS kernel families that have small-matrix GEMM kernels (no packing of W) in NumPy's
# wheels: SkylakeX's AVX-512 ones, which Cooperlake and SapphireRapids use too. The Haswell
# family's "permit" function refuses every call, so there a few-token product always packs W.
SMALL_GEMM_CORES = ("SkylakeX", "Cooperlake", "SapphireRapids")


def small_gemm_kernels() -> bool:
    """Whether OpenBLAS multiplies a small [rows, n_in] x [n_in, n_seq] product without packing."""
    return BLAS is not None and BLAS.core in SMALL_GEMM_CORES


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


BLAS = OpenBLAS.find()


def default_workers() -> int:
    """One part per usable core, when specdec can put OpenBLAS on one thread; else 1 (no split)."""
    return min(usable_cpus(), MAX_WORKERS) if BLAS is not None else 1


# OpenBLAS's thread count as this process found it (OPENBLAS_NUM_THREADS, or one per core).
BLAS_THREADS = BLAS.get() if BLAS is not None else 1

_lock = threading.Lock()  # guards the three below and every change of OpenBLAS's count
_inside = 0  # blas_threads with-blocks open, in all threads
_outside = BLAS_THREADS  # OpenBLAS's count before the first of them opened
_local = threading.local()  # .stack: this thread's open blocks' counts, innermost last


def outside_count() -> int:
    """OpenBLAS's count outside specdec's with-blocks (a user's own limit, threadpoolctl's say, included):
    what kernels.linear's OpenBLAS paths multiply on."""
    with _lock:
        return _outside if _inside else (BLAS.get() if BLAS is not None else 1)


@contextmanager
def blas_threads(n: int):
    """OpenBLAS on n threads for the with-block (nothing to do where specdec cannot set it).

    OpenBLAS has one count for the whole process, and several threads may be
    inside such blocks at once (linear() called from two threads). Leaving a
    block puts back its own thread's enclosing count, and the last block to leave
    puts back the count found before the first opened: whatever the interleaving,
    the process never keeps one of specdec's settings.
    """
    global _inside, _outside
    if BLAS is None:
        yield
        return
    stack = _local.__dict__.setdefault("stack", [])
    with _lock:
        if _inside == 0:
            _outside = BLAS.get()
        _inside += 1
        stack.append(n)
        if BLAS.get() != n:
            BLAS.set(n)
    try:
        yield
    finally:
        with _lock:
            stack.pop()
            _inside -= 1
            back = stack[-1] if stack else _outside if _inside == 0 else None  # None: another thread's block rules
            if back is not None and BLAS.get() != back:
                BLAS.set(back)


def one_blas_thread():
    """OpenBLAS on one thread for the with-block.

    NOTE: for a product of a few rows with a small matrix, OpenBLAS's threaded GEMM spends
    most of its time waking and waiting for its other thread: 16 ms instead of 0.3 ms for
    [5, 576] @ [576, 576] measured on a busy 2-core machine (load 4), about 50x.
    """
    return blas_threads(1)


_workers: dict[int, Workers] = {}


def workers(n: int) -> Workers:
    """The shared pool of n workers (one per n; made on first use)."""
    if n not in _workers:
        _workers[n] = Workers(n, BLAS)
    return _workers[n]
