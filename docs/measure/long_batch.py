"""One batched prompt pass over B rows of N tokens of SmolLM2 (forward_batch, last_only): seconds; peak RSS via
/usr/bin/time -v.  python docs/measure/long_batch.py B N"""

import os
import sys
import time

import numpy as np

import specdec
from specdec.checkpoints.load import load_model

b, n = int(sys.argv[1]), int(sys.argv[2])
model = load_model("smollm2-135m")
rng = np.random.default_rng(0)
rows = [rng.integers(100, 40000, size=n).tolist() for _ in range(b)]
caches = [model.new_cache(n) for _ in range(b)]
s = time.perf_counter()
logits = model.forward_batch(rows, caches, last_only=True)
print(
    f"{b} x {n} tokens: {time.perf_counter() - s:.1f} s, load {os.getloadavg()[0]:.1f}, "
    f"logits {[x.shape for x in logits]}, {specdec.__file__}"
)
