"""The fast matrix kernel: y = x @ W + b for one token or a few, on every core.

gpt2.py and llama.py write `x @ lin` and read as math (model/linear.py); with the
fast products chosen, that product is `linear` here, and this file is why it is
fast. Decoding is memory-bound: for one token (and for the 2..16
tokens of a verification pass) the cost of a projection is reading W from RAM,
so the kernel keeps W transposed and contiguous, splits its rows over specdec's
worker threads (threads.py), and feeds np.matmul L2-sized chunks. The measured
reasons for every constant below are in docs/notes/performance.md and
docs/notes/smollm2-kernels.md.
"""

from __future__ import annotations

from bisect import bisect_right
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from . import threads
from ..linear import Linear

F32 = np.float32

# The kernel's constants, measured on GPT-2's and SmolLM2's shapes (docs/notes/, performance and smollm2-kernels):
# Rows of a transposed weight matrix handled per gemv in a multi-token linear():
# about 256 KB, so one chunk stays in its core's L2 cache (1 MB here) while every
# token uses it (measured best of 64 KB..1.5 MB on an idle machine).
CHUNK_BYTES = 1 << 18
# Below this a matrix is not split over the workers: handing its parts out costs more than the split
# saves. 1 MB: every matrix of GPT-2 and of SmolLM2 (whose smallest, 576 x 576, is 1.3 MB) is split, as
# a step streams each of them from RAM; the shipped stdlib family's block matrices (128 wide) are not.
SMALL_BYTES = 1 << 20
# 2..MAX_CHUNKED_ROWS tokens: each part as a stack of matrix-vector products over L2-sized chunks.
MAX_CHUNKED_ROWS = 16
# MAX_CHUNKED_ROWS + 1 .. MAX_SPLIT_ROWS tokens (a wide tree, a batch's verification pass): each part
# as one matrix-matrix product on its worker, OpenBLAS on one thread. Above it (a prompt's chunk),
# plain x @ W with OpenBLAS's own threads. NOTE: on a busy machine OpenBLAS's threaded product can
# wait a scheduler time slice for its other thread: a [17, 576] x [576, 3072] product measured
# 137 ms that way against 18 ms on specdec's workers (load 11, docs/notes/smollm2-kernels.md).
MAX_SPLIT_ROWS = 64
# Parts each weight matrix's rows are split into, one per core, multiplied on
# specdec's own threads (threads.py); 1 = no split, OpenBLAS threads every product.
SPLIT_PARTS = threads.default_workers()
SPLIT_ONE_TOKEN = True  # split 1-token products too (False: OpenBLAS's own threads for them)
# Where OpenBLAS has small-matrix GEMM kernels (threads.SMALL_GEMM_CORES), a few tokens go through
# a stack of [rows, n_in] x [n_in, n_seq] products small enough for them: rows * n_in * n_seq at
# most SMALL_GEMM_MNK, OpenBLAS's own limit for them. Each weight is then read once into registers
# and used for every token, instead of once per token from L2 cache.
SMALL_GEMM = threads.small_gemm_kernels()
SMALL_GEMM_MNK = 1_000_000
SMALL_GEMM_ROWS = 64  # rows per small product, at most (measured: 32..640)


TRANSPOSE_ROWS = 16  # input rows per step of transposed_copy (measured best of 4..64 and 2-D tiles)

# The ways `linear` can multiply, one of which each (matrix, number of tokens) takes:
#   "workers"  W's rows in one part per core, on specdec's threads (threads.py), each part on one
#              OpenBLAS thread: stacked matrix-vector chunks or small GEMMs for a few tokens (part_product).
#   "blas"     x @ W.T on OpenBLAS's own threads (as many as it has outside specdec's settings).
#   "gemvs"    one matrix-vector product W @ x[t] per token, on OpenBLAS's threads: W comes from RAM
#              for the first token and from cache for the rest, with no repacking (up to MAX_GEMVS tokens).
#   "one"      x @ W.T on one OpenBLAS thread.
# Which is fastest depends on the matrix, the number of tokens, the CPU and how busy the machine is
# (handing a part to a worker thread and back costs about 120 us on an idle 2-vCPU VM, as much as
# streaming a 576 x 576 matrix), so tuning.py times them on the model's own matrices when it loads
# and keeps the winner per shape for each of M_BUCKETS; an untuned matrix follows `default_path`.
PATHS = ("workers", "blas", "gemvs", "one")
# The measured plans, by shape_key: one of PATHS per M_BUCKETS entry. tuning.py fills it when a model loads,
# and every Linear of a planned shape follows it (a draft head's matrices of the target's shapes too).
PLANS: dict[str, tuple[str, ...]] = {}
MAX_GEMVS = 16  # tokens the "gemvs" path takes at most (it is timed only for buckets up to this)
M_BUCKETS = (1, 2, 3, 5, 9, 17, 33, 65)  # a pass over m tokens takes the plan of the largest bucket <= m


def split_edges(n: int, n_parts: int, multiple: int = 16) -> list[int]:
    """Boundaries cutting range(n) into n_parts near-equal parts, the inner ones on multiples of `multiple`.

    split_edges(100, 2)   # [0, 48, 100]
    """
    return [0, *(round(n * i / n_parts / multiple) * multiple for i in range(1, n_parts)), n]


def transposed_copy(w: np.ndarray) -> np.ndarray:
    """W [n_in, n_out] -> a new C-contiguous float32 W.T [n_out, n_in], 16 rows of W at a time, on every core.

    np.ascontiguousarray(w.T) walks W with a stride of n_out floats and runs at
    about 0.5 GB/s. Copying a band of 16 whole rows of W at a time reads W
    sequentially and writes 64-byte runs of each output row, which keeps both
    sides in cache: 4-5 GB/s on one core, the bulk of `load_model`'s time
    otherwise. NumPy releases the GIL while it copies, so specdec's workers
    (threads.py) each take a share of the bands: 8-9 GB/s on two cores.
    """
    w = np.asarray(w)  # a plain view: slicing an np.memmap costs a Python object per slice
    n_in, n_out = w.shape
    w_t = np.empty((n_out, n_in), dtype=F32)

    def copy_bands(start: int, stop: int) -> None:
        for i in range(start, stop, TRANSPOSE_ROWS):
            w_t[:, i : i + TRANSPOSE_ROWS] = w[i : i + TRANSPOSE_ROWS].T  # [16, n_out] -> [n_out, 16]

    n_parts = max(1, min(SPLIT_PARTS, n_in // TRANSPOSE_ROWS))
    edges = split_edges(n_in, n_parts, TRANSPOSE_ROWS)
    threads.workers(n_parts).run([lambda a=a, b=b: copy_bands(a, b) for a, b in zip(edges, edges[1:])], blas=False)
    return w_t


@dataclass(frozen=True)
class RowPart:
    """Rows [start, stop) of a transposed weight, also viewed as a stack of L2-sized chunks."""

    start: int
    stop: int
    w_t: np.ndarray  # [stop - start, n_in], a view
    chunks: np.ndarray  # [n_chunks, 1, chunk, n_in]: a view of the first n_chunks * chunk rows

    @classmethod
    def of(cls, w_t: np.ndarray, start: int, stop: int) -> "RowPart":
        rows = w_t[start:stop]
        n_rows, n_in = rows.shape
        n_chunks = max(1, -(-rows.nbytes // CHUNK_BYTES))  # ceil
        chunk = max(1, n_rows // n_chunks)
        n_chunks = n_rows // chunk
        return cls(start, stop, rows, rows[: n_chunks * chunk].reshape(n_chunks, 1, chunk, n_in))


@dataclass(frozen=True)
class Split:
    """What the fast products keep for one Linear (in its `fast` slot): its rows in parts, one per core, and the
    key its shape's plan is filed under."""

    parts: list[RowPart]
    key: str  # '960x576/float32/2': rows x columns of W.T, dtype, parts; matrices with one key share a plan

    @classmethod
    def of(cls, lin: Linear) -> "Split":
        n_out, n_in = lin.w_t.shape
        n_parts = max(1, min(SPLIT_PARTS, n_out // 16)) if lin.w_t.nbytes >= SMALL_BYTES else 1
        # Part boundaries on multiples of 16 rows (whole cache lines of y), the last part takes the rest.
        edges = split_edges(n_out, n_parts)
        return cls(
            [RowPart.of(lin.w_t, a, b) for a, b in zip(edges, edges[1:])], f"{n_out}x{n_in}/{lin.w_t.dtype}/{n_parts}"
        )


def split(lin: Linear) -> Split:
    """The matrix's parts and shape key, made on its first fast product and kept in lin.fast."""
    if lin.fast is None:
        lin.fast = Split.of(lin)
    return lin.fast


def shape_key(lin: Linear) -> str:
    """'960x576/float32/2': rows x columns of W.T, dtype, parts. Matrices with one key share a plan."""
    return split(lin).key


def path_of(lin: Linear, n_seq: int) -> str:
    """How `linear` multiplies n_seq tokens by this matrix: its shape's measured plan (PLANS), else the rules."""
    s = split(lin)
    plan = PLANS.get(s.key)
    if plan is not None:
        return plan[bisect_right(M_BUCKETS, n_seq) - 1]
    return default_path(n_seq, len(s.parts))


def default_path(n_seq: int, n_parts: int) -> str:
    """The path of a matrix nobody measured (a head's, a toy's; tuning.py measures a loaded model's).

    A prompt's chunk (over MAX_SPLIT_ROWS tokens): OpenBLAS's threads, whose
    repacking GEMM pays off there. A matrix too small to split: one thread. Else
    the split over specdec's workers.
    """
    if n_seq > MAX_SPLIT_ROWS or n_seq == 1 and n_parts > 1 and not SPLIT_ONE_TOKEN:
        return "blas"
    return "one" if n_parts == 1 else "workers"


def linear(x: np.ndarray, lin: Linear, path: str | None = None) -> np.ndarray:
    """[n_seq, n_in] @ [n_in, n_out] + [n_out] -> [n_seq, n_out], by `path` (default: the matrix's own, path_of)

    Decoding is memory-bound: each weight matrix is read from RAM once per
    forward call, and for one token that read is the whole cost. For 2..16
    tokens, OpenBLAS's matrix-matrix kernel first repacks all of W, costing
    about 3.6x a 1-token call; instead each core takes its part of W's rows
    (`Split.parts`, on specdec's own threads, threads.py) and hands np.matmul
    a stack of matrix-vector products over L2-sized chunks of those rows
    (`part_product`). 17..MAX_SPLIT_ROWS tokens: each core one matrix-matrix
    product over its rows, so no product waits for OpenBLAS's threads. More (a
    prompt): OpenBLAS's own. Those are the default rules (`default_path`); a loaded
    model's shapes have a plan measured on this machine (tuning.py, PLANS), which
    may pick OpenBLAS's threads for some pass lengths where they are faster here.
    Measurements and the variants that did not help: docs/notes/performance.md.
    """
    parts = split(lin).parts
    path = path or path_of(lin, x.shape[0])
    if path == "workers" and len(parts) > 1:
        y = np.empty((x.shape[0], lin.w_t.shape[0]), dtype=np.result_type(x, lin.w_t))
        jobs = [lambda part=part: part_product(x, part, y[:, part.start : part.stop]) for part in parts]
        threads.workers(len(jobs)).run(jobs)
    elif path == "gemvs" and x.shape[0] <= MAX_GEMVS:
        y = np.empty((x.shape[0], lin.w_t.shape[0]), dtype=np.result_type(x, lin.w_t))
        with threads.blas_threads(threads.outside_count()):
            for t in range(x.shape[0]):  # [n_out, n_in] @ [n_in] -> [n_out], as a 1-token step does it
                np.matmul(lin.w_t, x[t], out=y[t])
    else:  # one product, on OpenBLAS's threads (as many as outside specdec's settings) or on one
        assert path in PATHS, f"unknown path {path!r}: one of {PATHS}"
        with threads.blas_threads(threads.outside_count() if path in ("blas", "gemvs") else 1):
            y = x @ lin.w_t.T
    if lin.b is not None:
        y += lin.b
    return y  # [n_seq, n_out]


def part_product(x: np.ndarray, part: RowPart, out: np.ndarray) -> None:
    """out = x @ part.w_t.T: [n_seq, n_in] -> [n_seq, stop - start], into the caller's columns of y.

    One token: one matrix-vector product. A few tokens: a stack of them, one per
    (chunk, token); np.matmul loops over the stack in C with the chunk
    outermost, so each chunk comes from RAM once and is re-read from L2 cache for
    the other tokens. Over MAX_CHUNKED_ROWS tokens: one matrix-matrix product.
    """
    n_seq, n_in = x.shape
    if n_seq == 1 or n_seq > MAX_CHUNKED_ROWS:  # one matrix-vector product, or one matrix-matrix product
        np.matmul(x, part.w_t.T, out=out)
        return
    rows = min(SMALL_GEMM_ROWS, SMALL_GEMM_MNK // (n_in * n_seq) // 8 * 8)  # a multiple of 8 (32-byte runs of y)
    if SMALL_GEMM and rows >= 8:
        n_blocks = out.shape[1] // rows
        n_main = n_blocks * rows
        blocks = part.w_t[:n_main].reshape(n_blocks, rows, n_in)  # a view
        # [n_blocks, rows, n_in] @ [n_in, n_seq] -> [n_blocks, rows, n_seq]
        out[:, :n_main] = np.matmul(blocks, x.T).reshape(n_main, n_seq).T
        if n_main < out.shape[1]:
            out[:, n_main:] = x @ part.w_t[n_main:].T
        return
    n_chunks, _, chunk, _ = part.chunks.shape
    n_main = n_chunks * chunk
    # [n_chunks, 1, chunk, n_in] @ [1, n_seq, n_in, 1] -> [n_chunks, n_seq, chunk, 1]
    # NOTE: let matmul allocate this chunk-major output; an out= view with
    # the token axis first makes NumPy reorder the loop and lose the cache reuse.
    stacked = np.matmul(part.chunks, x[None, :, :, None])
    out[:, :n_main] = stacked.reshape(n_chunks, n_seq, chunk).transpose(1, 0, 2).reshape(n_seq, n_main)
    if n_main < out.shape[1]:  # the few rows left over after even chunks
        out[:, n_main:] = x @ part.w_t[n_main:].T


def pass_threads(n_tok: int):
    """How a forward pass over n_tok new tokens lets OpenBLAS thread (a context manager around the pass).

    Up to MAX_SPLIT_ROWS tokens, OpenBLAS runs on one thread for the whole pass:
    every large product is split over specdec's workers (`linear`), and what is
    left (attention's products over a few queries, small matrices) is too small
    for OpenBLAS's threads to pay: with them, attention over 9 new tokens measured
    several times slower on a busy machine (threads.one_blas_thread says why). A
    longer pass (a prompt's chunk) keeps OpenBLAS's own threads.
    """
    return threads.one_blas_thread() if n_tok <= MAX_SPLIT_ROWS else nullcontext()
