"""Per-matrix cost of each few-token path, over enough copies of each shape that W streams from RAM."""

import sys, time, json
import numpy as np
from specdec.model.fast import kernels, threads
from specdec.model.fast.kernels import Linear, RowPart, linear, part_product, split_edges

SHAPES = {
    "q/out 576x576": (576, 576),
    "qkv 960x576": (960, 576),
    "gate_up 3072x576": (3072, 576),
    "down 576x1536": (576, 1536),
    "lm_head 49152x576": (49152, 576),
    "gpt2 c_attn 2304x768": (2304, 768),
    "gpt2 c_proj 768x768": (768, 768),
    "gpt2 fc 3072x768": (3072, 768),
}
MS = [int(a) for a in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1, 2, 3, 5, 9, 17]
rng = np.random.default_rng(0)


def parts_of(w_t, n):
    e = split_edges(w_t.shape[0], n)
    return [RowPart.of(w_t, a, b) for a, b in zip(e, e[1:])]


def m_cur(x, lin, parts):
    return linear(x, lin)


def m_gemm1(x, lin, parts):
    with threads.one_blas_thread():
        return x @ lin.w_t.T


def m_gemm2(x, lin, parts):
    return x @ lin.w_t.T


def m_split_gemm(x, lin, parts):
    y = np.empty((x.shape[0], lin.w_t.shape[0]), np.float32)

    def job(p):
        np.matmul(x, p.w_t.T, out=y[:, p.start : p.stop])

    threads.workers(len(parts)).run([lambda p=p: job(p) for p in parts])
    return y


def m_split_chunk(x, lin, parts):
    y = np.empty((x.shape[0], lin.w_t.shape[0]), np.float32)
    threads.workers(len(parts)).run([lambda p=p: part_product(x, p, y[:, p.start : p.stop]) for p in parts])
    return y


def m_split_wx(x, lin, parts):  # W_part @ x.T: [rows, n_in] @ [n_in, m]
    y = np.empty((lin.w_t.shape[0], x.shape[0]), np.float32)

    def job(p):
        np.matmul(p.w_t, x.T, out=y[p.start : p.stop])

    threads.workers(len(parts)).run([lambda p=p: job(p) for p in parts])
    return y.T


METHODS = {
    "cur": m_cur,
    "gemm1": m_gemm1,
    "split_gemm": m_split_gemm,
    "split_chunk": m_split_chunk,
    "split_wx": m_split_wx,
}
only = sys.argv[2].split(",") if len(sys.argv) > 2 else list(SHAPES)
res = {}
for sname in only:
    n_out, n_in = SHAPES[sname]
    copies = max(2, int(80e6 // (n_out * n_in * 4)))
    lins = [Linear(rng.standard_normal((n_out, n_in), dtype=np.float32), None) for _ in range(copies)]
    parts = [parts_of(l.w_t, 2) for l in lins]
    for m in MS:
        x = rng.standard_normal((m, n_in), dtype=np.float32)
        ref = x @ lins[0].w_t.T
        t = {k: [] for k in METHODS}
        for rep in range(5):
            for k in rng.permutation(list(METHODS)):
                f = METHODS[k]
                if rep == 0:
                    assert np.allclose(f(x, lins[0], parts[0]), ref, atol=1e-3), k
                s = time.perf_counter()
                for l, p in zip(lins, parts):
                    f(x, l, p)
                t[k].append((time.perf_counter() - s) / copies)
        res[f"{sname}|{m}"] = {k: float(np.median(v)) for k, v in t.items()}
        print(sname, m, " ".join(f"{k}={1e6 * np.median(v):.0f}" for k, v in t.items()), flush=True)
