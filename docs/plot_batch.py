"""docs/batch-throughput.png from the batch benchmark's JSON files.

    python docs/plot_batch.py run-124M.json run-355M.json run-smollm2.json -o docs/batch-throughput.png

Each file is `python -m specdec.bench --only batch --json PATH` output; every model in
each goes on the plot (tokens/s over the batch against B, dashed autoregressive, solid
speculative). Needs the notebook extra (matplotlib).
"""

import argparse
import json
import os

from specdec.bench.plot import plot_batch_throughput


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("runs", nargs="+", help="JSON files written by the batch benchmark")
    p.add_argument("-o", "--out", required=True, help="the PNG to write")
    args = p.parse_args(argv)
    models = {}
    for path in args.runs:
        with open(path) as f:
            run = json.load(f)
        for name, measured in run["models"].items():
            models[name] = measured["batches"]
    fig = plot_batch_throughput(models)
    fig.axes[0].set_title("greedy, n-gram drafts, K = 4 (docs/batch.md)")
    partial = args.out + ".partial.png"  # whole or not at all
    fig.savefig(partial, dpi=110, bbox_inches="tight")
    os.replace(partial, args.out)


if __name__ == "__main__":
    main()
