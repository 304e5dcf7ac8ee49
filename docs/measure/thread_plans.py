"""Whole SmolLM2 passes over m = 1, 3, 5 new tokens (after 32 cached) with one plan for every matrix: the workers (the
rules), OpenBLAS one product, OpenBLAS one product per token (LM head one product, or on the workers); runs of 4 passes,
interleaved, 5 repeats.   SPECDEC_HOME=... python docs/measure/thread_plans.py"""

import time, numpy as np, os

os.environ["SPECDEC_KERNELS"] = "rules"
from specdec.checkpoints.load import load_model
from specdec.model.fast import tuning, kernels

m = load_model("smollm2-135m")
lins = [l for l in tuning.linears_of(m.weights) if len(l.parts) > 1]
lm = m.weights.lm_head
B = kernels.M_BUCKETS


def setplan(name):
    for l in lins:
        if name == "rules":
            kernels.PLANS.pop(l.key, None)
        elif name == "blas":
            kernels.PLANS[l.key] = tuple("blas" for b in B)
        elif name == "gemvs":
            kernels.PLANS[l.key] = tuple("blas" if (b == 1 or b > 16) else ("blas" if l is lm else "gemvs") for b in B)
        elif name == "gemvs-lmw":
            kernels.PLANS[l.key] = tuple(
                "blas" if (b == 1 or b > 16) else ("workers" if l is lm else "gemvs") for b in B
            )


cache = m.new_cache()
m.forward(np.arange(1, 33), cache)
res = {}
plans = ["rules", "blas", "gemvs", "gemvs-lmw"]
rng = np.random.default_rng(0)
for rep in range(5):
    for name in rng.permutation(plans):
        setplan(name)
        for mm in (1, 3, 5):
            m.forward(np.full(mm, 5), cache)
            cache.rollback(32)  # warm
            s = time.perf_counter()
            for _ in range(4):
                m.forward(np.full(mm, 5), cache)
                cache.rollback(32)
            res.setdefault((name, mm), []).append((time.perf_counter() - s) / 4)
for name in plans:
    print(
        name.ljust(10),
        "  ".join(
            f"m={mm}: {1e3 * np.median(res[(name, mm)]):.1f} [{1e3 * min(res[(name, mm)]):.1f}-{1e3 * max(res[(name, mm)]):.1f}]"
            for mm in (1, 3, 5)
        ),
    )
