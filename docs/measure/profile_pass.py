"""Where a SmolLM2 pass's time goes: each named function's share, the rest is the glue between them."""

import collections, os, sys, time
import numpy as np
import specdec
from specdec.checkpoints.load import load_model
from specdec.model import base, linear, llama

repeats = int(sys.argv[1])
ms = [int(a) for a in sys.argv[2].split(",")]
model = load_model("smollm2-135m")
acc = collections.defaultdict(float)
names = {}


def wrap(mod, fname, label=None):
    f = getattr(mod, fname)

    def w(*a, **k):
        s = time.perf_counter()
        r = f(*a, **k)
        acc[label or fname] += time.perf_counter() - s
        return r

    setattr(mod, fname, w)


NAMES = {960: "qkv", 576: "output/down", 3072: "gate_up", model.hparams.n_vocab: "LM head"}  # by rows out
products = linear.PRODUCTS  # the products this process runs (SPECDEC_KERNELS): each call timed by its matrix


class Timed:
    name = products.name
    pass_of = staticmethod(products.pass_of)

    @staticmethod
    def matmul(x, lin):
        s = time.perf_counter()
        r = products.matmul(x, lin)
        acc["linear " + NAMES.get(lin.w_t.shape[0], str(lin.w_t.shape[0]))] += time.perf_counter() - s
        return r


linear.set_products(Timed)
for fn in ["grouped_attention", "rotate", "rms_norm", "silu", "rope_tables"]:
    wrap(llama, fn)
wrap(base, "pack")
cache = model.new_cache()
model.forward(list(range(1, 257)), cache)
out = {}
for m in ms:
    for _ in range(2):
        model.forward([5] * m, cache)
        cache.rollback(256)
    acc.clear()
    tot = 0.0
    for _ in range(repeats):
        s = time.perf_counter()
        model.forward([5] * m, cache)
        tot += time.perf_counter() - s
        cache.rollback(256)
    print(f"m={m}: pass {1e3 * tot / repeats:.1f} ms; load {os.getloadavg()[0]:.1f}")
    rest = tot - sum(acc.values())
    for k, v in sorted(acc.items(), key=lambda kv: -kv[1]) + [("glue (the rest)", rest)]:
        print(f"  {k:28s} {1e3 * v / repeats:7.2f} ms  {100 * v / tot:5.1f}%")
