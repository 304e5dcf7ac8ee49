"""Per matrix and m, each way to multiply (specdec's workers, OpenBLAS one product, one per token, one thread) and a
split-free chunked variant, over enough copies of each shape that W streams from RAM; microseconds, medians of 5."""

from specdec.model.fast import threads, kernels
from specdec.model.fast.kernels import Linear, RowPart, part_product

rng = np.random.default_rng(0)
SH = {"out": (576, 576), "qkv": (960, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm": (49152, 576)}


def blas_gemv(x, l):
    y = np.empty((x.shape[0], l.w_t.shape[0]), np.float32)
    with threads.blas_threads(threads.BLAS_THREADS):
        for t in range(x.shape[0]):
            np.matmul(l.w_t, x[t], out=y[t])
    return y


def one_chunks(x, l):
    y = np.empty((x.shape[0], l.w_t.shape[0]), np.float32)
    whole = RowPart.of(l.w_t, 0, l.w_t.shape[0])
    with threads.one_blas_thread():
        part_product(x, whole, y)
    return y


M = {
    "workers": lambda x, l: kernels.linear(x, l, "workers"),
    "blas": lambda x, l: kernels.linear(x, l, "blas"),
    "one": lambda x, l: kernels.linear(x, l, "one"),
    "blas_gemv": blas_gemv,
    "one_chunks": one_chunks,
}
for name, (n_out, n_in) in SH.items():
    copies = max(2, int(80e6 // (n_out * n_in * 4)))
    lins = [Linear(rng.standard_normal((n_out, n_in), dtype=np.float32), None) for _ in range(copies)]
    for m in (1, 2, 3, 5, 9):
        x = rng.standard_normal((m, n_in), dtype=np.float32)
        ref = x @ lins[0].w_t.T
        for k, f in M.items():
            assert np.allclose(f(x, lins[0]), ref, atol=1e-3), k
        t = {k: [] for k in M}
        with kernels.pass_threads(m):
            for rep in range(5):
                for k in rng.permutation(list(M)):
                    s = time.perf_counter()
                    for l in lins:
                        M[k](x, l)
                    t[k].append((time.perf_counter() - s) / copies)
        print(name, m, " ".join(f"{k}={1e6 * np.median(v):.0f}" for k, v in t.items()), flush=True)
