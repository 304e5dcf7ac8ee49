"""Where the time goes: a benchmark of specdec on GPT-2-shaped random weights.

It times the forward pass and the samplers with the library's one stopwatch
(timing.py) and turns the measured costs into the speedups the cost model
(costmodel/; Leviathan et al., arXiv 2211.17192, section 3) predicts. Weights
are random, built in memory (no download): every timing depends only on the
shapes, except the drafters section, whose acceptance depends on the text the
random model writes. A script that prints numbers, not a test.

Commands:
    python -m specdec.bench                          # 124M and 355M, all sections but io
    python -m specdec.bench --sizes 124M --repeats 5 # 17 min on 2 shared vCPUs at load average 10-15
                                                     # (drafters 6 min, costcheck 7 min, decode 2 min)
    python -m specdec.bench --json bench.json   # also write every measurement as one JSON object
    python -m specdec.bench --json -                 # JSON on stdout, the tables on stderr
    python -m specdec.bench --sizes 124M,355M,1558M  # 774M / 1558M on request (1558M: 6.2 GB of weights)
    python -m specdec.bench --only decode,verify --repeats 50
    python -m specdec.bench --only io                # checkpoint I/O and peak memory (writes ~2 GB under /tmp)
    python -m specdec.bench --quick                  # a smoke run on tiny shapes (what tests/bench/test_bench.py runs)
    python -m specdec.bench --write-checkpoints DIR  # random-weight checkpoints for an offline main.py run
    python -m specdec.bench --only alpha-table       # alpha of every GPT-2 pair on disk (real weights; alpha.py)

Sections (`--only`, comma-separated; default all but io):
    decode    ms per KV-cached 1-token step at context 32 / 256 / 1000, and without a KV cache
    verify    r(m) = time(m new tokens, all m logit rows) / time(1 token), m = 1..16, at context 256
    kernel    r(m) of each kind of weight matrix alone (linear()), m = 1..16
    restricted  c = draft step / target step with an LM head over only the N most frequent tokens
    exact     the cost of the exact-greedy option: the target in float64
    predict   the cost model's speedup for draft -> target pairs, from the measured c and r(m)
    drafters  greedy speculative decoding with the n-gram and early-exit drafters vs autoregressive
    costcheck the cost model's predicted speedup next to the measured one, per drafter and target
    overhead  the speculative sampler's own time (everything but forward passes) per round
    io        safetensors open, full load, and the peak RSS of a speculative run vs the files' sizes

How the KV cache is filled to a context position: random keys and values are
written into positions [0, n_past) and `cache.length` is set to n_past. The
cost of attention depends only on the length, not on the values, and this is
~1000x cheaper than a real forward over n_past tokens.

Layer: part of bench/, the top. May import anything in specdec. The sections live by what they
time: common.py (shapes, statistics, tables, the run's state), passes.py (decode, verify, kernel,
restricted, exact), speedups.py (predict, drafters, costcheck, overhead), checkpoint_io.py (io).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from ...cli import flags
from ...race.render import jsonable
from ... import safe_io
from ..progress import add_quiet
from .checkpoint_io import rss_child, section_io, write_random_checkpoints
from .common import ALL_SIZES, SIZES, TEST_SIZES, VERIFY_CTX, VERIFY_M, Bench, filled_cache, stats_ms, step_bytes, table
from .passes import section_decode, section_exact, section_kernel, section_restricted, section_verify
from .speedups import (
    ALPHAS,
    COSTCHECK_TOLERANCE,
    K_MAX,
    costcheck_runs,
    section_costcheck,
    section_drafters,
    section_overhead,
    section_predict,
)

SECTIONS = ("decode", "verify", "kernel", "predict", "restricted", "exact", "drafters", "costcheck", "overhead", "io")
DEFAULT_SECTIONS = tuple(s for s in SECTIONS if s != "io")

__all__ = [
    "ALL_SIZES",
    "ALPHAS",
    "COSTCHECK_TOLERANCE",
    "DEFAULT_SECTIONS",
    "K_MAX",
    "SECTIONS",
    "SIZES",
    "TEST_SIZES",
    "VERIFY_CTX",
    "VERIFY_M",
    "Bench",
    "costcheck_runs",
    "filled_cache",
    "main",
    "parse_args",
    "stats_ms",
    "table",
]


# ---------------------------------------------------------------------------
# The command line.
# ---------------------------------------------------------------------------

SECTION_FUNCTIONS = {
    "decode": section_decode,
    "verify": section_verify,
    "kernel": section_kernel,
    "predict": section_predict,
    "restricted": section_restricted,
    "exact": section_exact,
    "drafters": section_drafters,
    "costcheck": section_costcheck,
    "overhead": section_overhead,
    "io": section_io,
}


def _csv(kind: Callable, allowed=None, shown=None):
    def parse(text: str) -> list:
        items = [kind(s.strip()) for s in text.split(",") if s.strip()]
        if not items or (allowed is not None and any(i not in allowed for i in items)):
            what = ", ".join(map(str, shown or allowed)) if allowed else f"{kind.__name__}s"
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}")
        return items

    return parse


def _pairs(text: str) -> list[tuple[str, str]]:
    pairs = [tuple(item.strip().partition(":")[::2]) for item in text.split(",")]
    if not all(d in ALL_SIZES and t in ALL_SIZES for d, t in pairs):
        raise argparse.ArgumentTypeError(f"pairs are draft:target with sizes {', '.join(SIZES)}, e.g. 124M:355M")
    return pairs


def parse_args(argv=None) -> argparse.Namespace:
    paragraphs = __doc__.split("\n\n")
    p = flags.Parser(
        prog="python -m specdec.bench --only <speed sections>",
        description=paragraphs[0],
        epilog="\n\n".join(x for x in paragraphs if x.startswith(("Commands", "Sections"))),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = p.add_argument
    add(
        "--sizes",
        type=_csv(str, ALL_SIZES, SIZES),
        help="model shapes to time, from 124M, 355M, 774M, 1558M (default 124M,355M)",
    )
    add("--only", type=_csv(str, SECTIONS), help=f"sections to run, from {','.join(SECTIONS)} (default all but io)")
    add("--repeats", type=int, help="timed repeats per measurement (default 30; 3 with --quick)")
    add("--json", metavar="PATH", help="write all measurements as one JSON object to PATH ('-' for stdout)")
    add("--quick", action="store_true", help="a fast smoke run: tiny shapes, few repeats")
    add("--contexts", type=_csv(int), default=[32, 256, 1000], help="decode contexts (default 32,256,1000)")
    add("--nocache-repeats", type=int, help="repeats of the slow no-cache passes (default 3; 1 with --quick)")
    add("--pairs", type=_pairs, help="draft:target pairs to predict (default 124M:355M,124M:1558M)")
    add("--drafter-tokens", type=int, help="tokens generated in the drafters section (default 100)")
    add("--seed", type=int, default=0, help="seed of the benchmark's random inputs (default 0)")
    add_quiet(p)
    add(
        "--write-checkpoints",
        metavar="DIR",
        help="instead of timing: write random-weight checkpoints of --sizes "
        "into DIR/<size>/ with the tokenizer files from --tokenizer, so main.py --models_dir DIR runs offline",
    )
    add(
        "--tokenizer",
        metavar="DIR",
        default="../shared/gpt2-tokenizer",
        help="folder with GPT-2's vocab.json and merges.txt, for --write-checkpoints (default: %(default)s)",
    )
    add("--rss-child", nargs=2, metavar=("DRAFT_DIR", "TARGET_DIR"), help=argparse.SUPPRESS)
    add("--rss-tokens", type=int, default=20, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    quick = args.quick
    args.sizes = sorted(
        dict.fromkeys(args.sizes or (["tiny", "tiny2"] if quick else ["124M", "355M"])),
        key=lambda s: step_bytes(ALL_SIZES[s]),
    )
    args.only = args.only or list(DEFAULT_SECTIONS)
    args.repeats = args.repeats or (3 if quick else 30)
    args.nocache_repeats = args.nocache_repeats or (1 if quick else 3)
    args.drafter_tokens = args.drafter_tokens or (30 if quick else 100)
    args.drafter_repeats = 1 if quick else 3
    args.overhead_tokens = 12 if quick else 40
    if args.pairs is None:
        small = args.sizes[0] if set(args.sizes) <= set(TEST_SIZES) else "124M"
        args.pairs = [(small, "tiny2" if small == "tiny" else "355M"), (small, "1558M")]
    for ctx in args.contexts:
        if not 1 <= ctx <= 1024 - max(VERIFY_M):
            p.error(f"context {ctx} must lie in 1..{1024 - max(VERIFY_M)}")
    if args.repeats < 1 or args.nocache_repeats < 1:
        p.error("repeats must be at least 1")
    return args


def environment() -> dict:
    """Python, NumPy, its BLAS (NumPy >= 2 reports it) and the BLAS/OpenMP environment variables."""
    env = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": platform.machine(),
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "env_vars": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("OPENBLAS_", "OMP_", "MKL_"))},
    }
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        env["blas"] = f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # older NumPy: show_config only prints
        env["blas"] = "unknown"
    return env


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.rss_child:
        rss_child(*args.rss_child, args.rss_tokens)
        return {}
    if args.write_checkpoints:
        write_random_checkpoints(Path(args.write_checkpoints), args.sizes, Path(args.tokenizer), args.seed)
        return {}
    bench = Bench(args, sys.stderr if args.json == "-" else sys.stdout)  # keep stdout clean for the JSON
    env = bench.results["environment"] = environment()
    bench.results["settings"] = {
        "sizes": args.sizes,
        "sections": args.only,
        "repeats": args.repeats,
        "contexts": args.contexts,
        "nocache_repeats": args.nocache_repeats,
        "quick": args.quick,
        "seed": args.seed,
        "pairs": [list(p) for p in args.pairs],
        "kv_cache_fill": "random K/V, cache.length set directly",
    }
    bench.say(
        f"specdec.bench: numpy {env['numpy']}, BLAS {env['blas']}, {env['cpus']} CPUs, Python {env['python']} "
        f"{env['machine']}; {env['env_vars'] or 'no OPENBLAS_* / OMP_* / MKL_* set'}"
    )
    bench.say(f"sizes {','.join(args.sizes)}; sections {','.join(args.only)}; repeats {args.repeats}")
    start = time.perf_counter()
    chosen = [name for name in SECTIONS if name in args.only]  # in this order, whatever order --only gave
    for i, name in enumerate(chosen, start=1):
        bench.progress(f"section {name} ({i} of {len(chosen)}), sizes {','.join(args.sizes)}")
        t0 = time.perf_counter()
        SECTION_FUNCTIONS[name](bench)
        bench.results.setdefault("section_seconds", {})[name] = time.perf_counter() - t0
    bench.results["total_seconds"] = time.perf_counter() - start
    bench.say(f"\ntotal {bench.results['total_seconds']:.0f} s")
    if args.json:
        text = json.dumps(jsonable(bench.results), indent=1, allow_nan=False)
        if args.json == "-":
            print(text)
        else:
            safe_io.write_file(args.json, (text + "\n").encode())
            bench.say(f"wrote {args.json}")
    return bench.results
