"""Token trees on this machine: what a tree pass costs, and what trees buy.

What it adds over specdec.bench: the tree-specific numbers. Like specdec.bench,
a script that prints tables (never a test); weights are GPT-2-shaped random
arrays built in memory unless --models_dir gives trained checkpoints.

Commands:
    python -m specdec.treebench --only r                 # r(N): a pass over 1 + N tree nodes, N = 0..16
    python -m specdec.treebench --only r --sizes 124M --repeats 20

Sections (`--only`, comma-separated):
    r      time of one target pass over the root and N tree nodes (a width-2 tree,
           with its mask) and over a chain of the same length, relative to a
           1-token step: r(N + 1) in the cost model's notation, at context 256
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from .bench import SIZES, VERIFY_CTX, filled_cache, stats_ms, table
from .gpt2 import GPT2, random_weights
from .timing import time_calls

N_MAX = 16  # tree nodes per pass: up to 17 new tokens


def width_two_tree(n: int) -> list[int]:
    """Parents of a breadth-first binary tree of n nodes below the root (node i's parent: (i - 1) // 2)."""
    return [-1] + [(i - 1) // 2 for i in range(1, n)]


def measure_r(model: GPT2, repeats: int, rng: np.random.Generator) -> dict:
    """Times of a pass over m = 1 .. N_MAX + 1 new tokens, as a chain and as root + binary tree."""
    cache = filled_cache(model, VERIFY_CTX, rng)
    tokens = [int(t) for t in rng.integers(0, model.n_vocab, N_MAX + 1)]
    calls = {}
    for m in range(1, N_MAX + 2):
        tree = [-1, *(p + 1 for p in width_two_tree(m - 1))] if m > 1 else None  # the root, then the nodes
        calls[("chain", m)] = lambda m=m: model.forward(tokens[:m], cache)
        calls[("tree", m)] = lambda m=m, tree=tree: model.forward(tokens[:m], cache, parents=tree)
    times = time_calls(calls, repeats, rng, after=lambda key: cache.rollback(VERIFY_CTX))
    one = np.asarray(times[("chain", 1)])
    return {
        kind: {m: (float(np.median(np.asarray(times[(kind, m)]) / one)), stats_ms(times[(kind, m)]))
               for m in range(1, N_MAX + 2)}
        for kind in ("chain", "tree")
    }  # fmt: skip


def section_r(args, out) -> dict:
    results = {}
    rng = np.random.default_rng(args.seed)
    for size in args.sizes:
        model = GPT2(SIZES[size], random_weights(SIZES[size]), name=size)
        res = measure_r(model, args.repeats, rng)
        results[size] = {kind: [r for r, _ in res[kind].values()] for kind in res}
        rows = [
            [m - 1, res["tree"][m][1]["median_ms"], res["tree"][m][0], res["chain"][m][0]]
            for m in range(1, N_MAX + 2)
        ]
        table(out, f"r: a verification pass over the root and N tree nodes, {size}",
              f"median over {args.repeats} interleaved repeats at n_past={VERIFY_CTX}; r = time / time of a "
              f"1-token step; the chain of the same length for comparison",
              ["N nodes", "tree ms", "r(N+1) tree", "r(N+1) chain"], rows)  # fmt: skip
    return results


SECTIONS = {"r": section_r}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m specdec.treebench", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="r", help=f"sections, from {','.join(SECTIONS)} (default r)")
    p.add_argument("--sizes", default="124M,355M", help="GPT-2 shapes for r (default 124M,355M)")
    p.add_argument("--repeats", type=int, default=15, help="timed repeats per measurement (default 15)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.sizes = [s.strip() for s in args.sizes.split(",")]
    bad = [s for s in args.sizes if s not in SIZES] + [s for s in args.only.split(",") if s not in SECTIONS]
    if bad:
        p.error(f"unknown size or section: {', '.join(bad)} (sizes: {', '.join(SIZES)}; sections: {', '.join(SECTIONS)})")
    return {name: SECTIONS[name](args, sys.stdout) for name in args.only.split(",")}


if __name__ == "__main__":
    main()
