"""What one hand-off to specdec's worker threads costs: Workers.run of two empty jobs, N times (microseconds each)."""

import sys, time
from specdec.model.fast import threads

n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
pool = threads.workers(2)
for _ in range(100):
    pool.run([lambda: None, lambda: None])
start = time.perf_counter()
for _ in range(n):
    pool.run([lambda: None, lambda: None])
print(f"{1e6 * (time.perf_counter() - start) / n:.1f} us per hand-off and back")
