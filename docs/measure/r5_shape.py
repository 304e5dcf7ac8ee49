"""Step and r(m) of a GPT-2-shaped random model with its measured plan and with the fixed rules, interleaved.

SPECDEC_HOME=... python docs/measure/r5_shape.py 355M 7
"""

import sys, time
import numpy as np
from specdec.checkpoints.settings import default_models_dir
from specdec.model.fast import kernels, tuning
from specdec.model.shapes import random_model

shape, repeats = sys.argv[1], int(sys.argv[2])
model = random_model(shape)
planned = dict(kernels.PLANS)
tuning.tune(model, default_models_dir())
measured = dict(kernels.PLANS)
cache = model.new_cache()
model.forward(np.arange(1, 257), cache)
t = {}
for rep in range(repeats):
    for side in ("plan", "rules") if rep % 2 == 0 else ("rules", "plan"):
        kernels.PLANS.clear()
        kernels.PLANS.update(measured if side == "plan" else planned)
        for m in (1, 3, 5):
            model.forward(np.full(m, 5), cache)
            cache.rollback(256)
            s = time.perf_counter()
            model.forward(np.full(m, 5), cache)
            t.setdefault((side, m), []).append(time.perf_counter() - s)
            cache.rollback(256)
for side in ("rules", "plan"):
    one = np.array(t[(side, 1)])
    print(
        f"{shape} {side}: step {1e3 * np.median(one):.1f} ms [{1e3 * one.min():.1f}-{1e3 * one.max():.1f}]; "
        + "; ".join(f"r({m}) {np.median(np.array(t[(side, m)]) / one):.2f}" for m in (3, 5))
    )
