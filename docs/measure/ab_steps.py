"""Passes over m = 1, 2, 3, 5, 9, 17 new tokens at context 256 for SmolLM2-135M and GPT-2 124M's shape, as JSON.

    PYTHONPATH=<a specdec checkout> python docs/measure/ab_steps.py REPEATS >> runs.txt   (prefix each line "old " or "new ")

Run it alternately from two checkouts (old, new), then docs/measure/ab_summary.py runs.txt.
"""

import json, os, sys, time
import numpy as np
import specdec
from specdec.checkpoints.load import load_model
from specdec.model.shapes import random_model
from specdec.timing import pass_calls, time_calls

repeats = int(sys.argv[1])
ms = [1, 2, 3, 5, 9, 17]
models = {"smollm2": load_model("smollm2-135m"), "gpt2-124M": random_model("124M")}
try:  # a checkout with measured product paths: the random shape gets them too, as load_model gives them
    from specdec.checkpoints.settings import default_models_dir
    from specdec.model.fast import tuning

    tuning.tune(models["gpt2-124M"], default_models_dir())
except ImportError:
    pass
calls, afters = {}, {}
for name, model in models.items():
    cache = model.new_cache()
    model.forward(list(range(1, 257)), cache)
    passes, rollback = pass_calls(model, cache, ms, token=5)
    for m, c in passes.items():
        calls[(name, m)] = c
        afters[(name, m)] = rollback
times = time_calls(calls, repeats, after=lambda k: afters[k](k))
print(
    json.dumps(
        {"src": specdec.__file__, "load": os.getloadavg()[0], "t": {f"{n}|{m}": v for (n, m), v in times.items()}}
    )
)
