"""One prompt pass over N tokens of SmolLM2 (last_only, as decoding does): seconds; peak RSS via /usr/bin/time -v."""

import sys, time, os
import numpy as np
from specdec.checkpoints.load import load_model

n = int(sys.argv[1])
model = load_model("smollm2-135m")
ids = np.random.default_rng(0).integers(100, 40000, size=n).tolist()
cache = model.new_cache(n)
s = time.perf_counter()
logits = model.forward(ids, cache, last_only=True)
print(f"{n} tokens: {time.perf_counter() - s:.1f} s, load {os.getloadavg()[0]:.1f}, logits {logits.shape}")
