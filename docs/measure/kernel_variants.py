"""Full-model passes under kernel variants toggled per call, interleaved in one process."""

import json, os, sys
import numpy as np
from specdec.checkpoints.load import load_model
from specdec.model.fast import kernels
from specdec.model.shapes import random_model
from specdec.timing import pass_calls, time_calls

repeats = int(sys.argv[1])
ms = [1, 2, 3, 5, 9, 17]
VARIANTS = {"chunk16": {"MAX_CHUNKED_ROWS": 16}, "gemm": {"MAX_CHUNKED_ROWS": 1}}
models = {"smollm2": load_model("smollm2-135m")}
if len(sys.argv) > 2:
    models["gpt2"] = random_model("124M")
calls, afters = {}, {}


def under(v, call):
    def run():
        old = {k: getattr(kernels, k) for k in VARIANTS[v]}
        for k, x in VARIANTS[v].items():
            setattr(kernels, k, x)
        try:
            call()
        finally:
            for k, x in old.items():
                setattr(kernels, k, x)

    return run


for name, model in models.items():
    cache = model.new_cache()
    model.forward(list(range(1, 257)), cache)
    passes, rollback = pass_calls(model, cache, ms, token=5)
    for m, c in passes.items():
        for v in VARIANTS:
            if m == 1 and v != "chunk16":
                continue
            calls[(name, v, m)] = under(v, c)
            afters[(name, v, m)] = rollback
times = time_calls(calls, repeats, after=lambda k: afters[k](k))
print("load", os.getloadavg())
for name in models:
    t1 = np.asarray(times[(name, "chunk16", 1)])
    print(
        name, f"step {1e3 * np.median(t1):.1f} ms [{1e3 * np.percentile(t1, 25):.1f}-{1e3 * np.percentile(t1, 75):.1f}]"
    )
    for v in VARIANTS:
        print("  ", v, " ".join(f"r({m})={np.median(np.asarray(times[(name, v, m)]) / t1):.2f}" for m in ms[1:]))
