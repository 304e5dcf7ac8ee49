"""Summary of ab_steps.py runs: per side, the step median (IQR) and r(m) as medians of per-repeat ratios."""

import collections, json, sys
import numpy as np

runs = collections.defaultdict(list)
loads = collections.defaultdict(list)
for line in open(sys.argv[1]):
    side, js = line.split(" ", 1)
    d = json.loads(js)
    runs[side].append(d["t"])
    loads[side].append(d["load"])
for side, rs in runs.items():
    print(f"== {side}: {len(rs)} processes, load {min(loads[side]):.1f}-{max(loads[side]):.1f}")
    for model in ["smollm2", "gpt2-124M"]:
        t1 = np.concatenate([r[f"{model}|1"] for r in rs])
        row = [
            f"step {1e3 * np.median(t1):.1f} ms (IQR {1e3 * np.percentile(t1, 25):.1f}-{1e3 * np.percentile(t1, 75):.1f})"
        ]
        for m in [2, 3, 5, 9, 17]:
            # ratios within each repeat (each process's repeat i: m pass / 1 pass)
            ratios = np.concatenate([np.asarray(r[f"{model}|{m}"]) / np.asarray(r[f"{model}|1"]) for r in rs])
            row.append(
                f"r({m}) {np.median(ratios):.2f} [{np.percentile(ratios, 25):.2f}-{np.percentile(ratios, 75):.2f}]"
            )
        print(f"  {model}: " + "; ".join(row))
