"""Where the time goes: a benchmark of specdec on GPT-2-shaped random weights.

What it adds over the library: nothing the library needs. It times the forward
pass and the samplers, and turns the measured costs into the speedups the cost
model (costmodel.py, Leviathan et al., arXiv 2211.17192, section 3) predicts.
Weights are random, built in memory with `random_weights` (no download); every
timing here depends only on the shapes, except the n-gram section, whose
acceptance depends on the text the random model writes.

Commands:
    python -m specdec.bench                          # 124M and 355M, all sections but io (a few minutes)
    python -m specdec.bench --json /tmp/bench.json   # also write every measurement as one JSON object
    python -m specdec.bench --json -                 # JSON on stdout, the tables on stderr
    python -m specdec.bench --sizes 124M,355M,1558M  # 774M / 1558M on request (1558M: 6.2 GB of weights)
    python -m specdec.bench --only decode,verify,floor --repeats 50
    python -m specdec.bench --nocache-contexts 32,256  # skip the slow no-cache pass over 1000 tokens
    python -m specdec.bench --only io                # checkpoint I/O and peak memory (writes ~2 GB under /tmp)
    python -m specdec.bench --quick                  # a smoke run on tiny shapes (what tests/test_bench.py runs)

Sections (`--only`, comma-separated; default all but io):
    decode    ms per KV-cached 1-token step at context 32 / 256 / 1000
    verify    r(m) = time(m new tokens, all m logit rows) / time(1 token), m = 1..9, at context 256
    floor     the step's bare matrix products, and the memory-bandwidth bound
    nocache   recomputing the whole sequence every step (no KV cache), as simple NumPy GPT-2s do
    predict   the cost model's speedup for draft -> target pairs, from the measured c and r(m)
    ngram     greedy speculative decoding with the n-gram and early-exit drafters vs autoregressive
    overhead  the speculative sampler's own time (everything but forward passes) per round
    io        safetensors open, full load, and the peak RSS of a speculative run vs the files' sizes

How the KV cache is filled to a context position: random keys and values are
written into positions [0, n_past) and `cache.length` is set to n_past. The
cost of attention depends only on the length, not on the values, and this is
~1000x cheaper than a real forward over n_past tokens.

Timing: time.perf_counter around each call; the machine may be noisy (bursts
of 10x slowdowns), so the calls being compared are interleaved in a shuffled
order within every repeat, and medians are reported with the interquartile
range (q1..q3).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, TextIO

import numpy as np

from . import costmodel
from .autoregressive import autoregressive_sample
from .checkpoint import save_folder
from .harness import jsonable
from .gpt2 import GPT2, F32, HParams, KVCache, Linear, linear, random_weights
from .costmodel import AdaptiveK
from .speculative import speculative_sample

# GPT-2's released shapes (config.json of openai-community/gpt2, -medium, -large, -xl).
SIZES = {
    "124M": HParams(n_vocab=50257, n_ctx=1024, n_embd=768, n_head=12, n_layer=12),
    "355M": HParams(n_vocab=50257, n_ctx=1024, n_embd=1024, n_head=16, n_layer=24),
    "774M": HParams(n_vocab=50257, n_ctx=1024, n_embd=1280, n_head=20, n_layer=36),
    "1558M": HParams(n_vocab=50257, n_ctx=1024, n_embd=1600, n_head=25, n_layer=48),
}
# Tiny shapes for the smoke test (--quick): not offered in --help.
TEST_SIZES = {
    "tiny": HParams(n_vocab=512, n_ctx=1024, n_embd=64, n_head=4, n_layer=4),
    "tiny2": HParams(n_vocab=512, n_ctx=1024, n_embd=128, n_head=4, n_layer=8),
}
ALL_SIZES = {**SIZES, **TEST_SIZES}

SECTIONS = ("decode", "verify", "floor", "nocache", "predict", "ngram", "overhead", "io")
DEFAULT_SECTIONS = tuple(s for s in SECTIONS if s != "io")
VERIFY_CTX = 256  # context of the verification-cost curve, the step/floor ratio and predict's c
VERIFY_M = range(1, 10)  # m = K + 1 new tokens, for K = 0..8
ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
K_MAX = 8
TOKEN = 464  # the token fed at every timed step (any id works: cost does not depend on it)


# ---------------------------------------------------------------------------
# Small tools: statistics, tables, timers.
# ---------------------------------------------------------------------------


def stats_ms(seconds: Iterable[float]) -> dict:
    """Median, quartiles and range of a list of durations, in milliseconds."""
    a = np.asarray(list(seconds), dtype=np.float64) * 1e3
    q1, med, q3 = np.percentile(a, [25, 50, 75])
    return {"median_ms": float(med), "q1_ms": float(q1), "q3_ms": float(q3),
            "min_ms": float(a.min()), "max_ms": float(a.max()), "n": int(a.size)}  # fmt: skip


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def interleaved(calls: dict, repeats: int, rng: np.random.Generator, after: Callable | None = None) -> dict:
    """Time every call once per repeat, in a fresh shuffled order each repeat.

    Interleaving spreads a burst of machine noise over all the calls being
    compared instead of over one of them. One untimed warm-up call each first.
    `after(key)` runs untimed after each call (e.g. rolling a cache back).
    Returns {key: [seconds, one per repeat]}.
    """
    keys = list(calls)
    times = {key: [] for key in keys}
    for key in keys:
        calls[key]()
        if after:
            after(key)
    for _ in range(repeats):
        for i in rng.permutation(len(keys)):
            key = keys[i]
            times[key].append(timed(calls[key]))
            if after:
                after(key)
    return times


def table(out: TextIO, title: str, explanation: str, headers: list[str], rows: list[list]) -> None:
    """Print an aligned table: a title, a one-line explanation, a header row, the rows."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    print(f"\n== {title}", file=out)
    print(f"   {explanation}", file=out)
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths)), file=out)
    for row in cells:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)), file=out)
    out.flush()


def _cell(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def spread(s: dict) -> str:
    """'q1..q3' of a stats_ms dict."""
    return f"{_cell(s['q1_ms'])}..{_cell(s['q3_ms'])}"


# ---------------------------------------------------------------------------
# The environment.
# ---------------------------------------------------------------------------


def environment() -> dict:
    """NumPy, its BLAS, thread counts and the BLAS/OpenMP environment variables."""
    env = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "env_vars": {
            k: v for k, v in sorted(os.environ.items()) if k.startswith(("OPENBLAS_", "OMP_", "MKL_", "GOTO"))
        },
    }
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]  # NumPy >= 2.0
        env["blas"] = f"{blas.get('name')} {blas.get('version')}"
        env["blas_config"] = blas.get("openblas configuration", "")
    except Exception:  # older NumPy: show_config only prints
        env["blas"] = "unknown"
    env["blas_threads"], env["blas_threads_source"] = _blas_threads()
    return env


def _blas_threads() -> tuple[int | None, str]:
    try:
        import threadpoolctl  # optional

        info = [p for p in threadpoolctl.threadpool_info() if p.get("user_api") == "blas"]
        if info:
            return int(info[0]["num_threads"]), "threadpoolctl"
    except ImportError:
        pass
    # Without threadpoolctl: ask the OpenBLAS that NumPy wheels bundle, through ctypes.
    libs = Path(np.__file__).parent.parent / "numpy.libs"
    for lib in sorted(libs.glob("*openblas*")) if libs.is_dir() else []:
        for symbol in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads"):
            try:
                return int(getattr(ctypes.CDLL(str(lib)), symbol)()), f"{lib.name}:{symbol}"
            except (OSError, AttributeError):
                continue
    return None, "unknown (install threadpoolctl to see it)"


# ---------------------------------------------------------------------------
# Models, caches and byte counts.
# ---------------------------------------------------------------------------


def filled_cache(model: GPT2, n_past: int, rng: np.random.Generator) -> KVCache:
    """A KV cache holding n_past positions of random keys and values.

    NOTE: not a real forward over n_past tokens. Attention's cost depends only on
    cache.length, so random K/V plus `cache.length = n_past` times the same.
    """
    h = model.hparams
    cache = model.new_cache()
    cache.reserve(min(h.n_ctx, n_past + 16))  # room for the timed passes: no growth while timing
    shape = (h.n_layer, h.n_head, n_past, h.d_head)
    cache.k[:, :, :n_past] = rng.standard_normal(shape, dtype=F32)  # [n_layer, n_head, n_past, d_head]
    cache.v[:, :, :n_past] = rng.standard_normal(shape, dtype=F32)
    cache.length = n_past
    return cache


def step_bytes(h: HParams, n_past: int) -> dict:
    """Bytes one 1-token decode step reads from memory (float32).

    weights: the four linears of every block (12 n_embd^2 weights, 9 n_embd
    biases), the LayerNorms, and the LM head (wte, [n_vocab, n_embd]); the
    embedding lookup reads only one row of wte and wpe. kv: the cached keys and
    values, 2 * n_layer * n_past * n_embd.
    """
    e = h.n_embd
    per_block = 12 * e * e + 9 * e + 4 * e
    weights = 4 * (h.n_layer * per_block + h.n_vocab * e + 2 * e)
    kv = 4 * 2 * h.n_layer * n_past * e
    return {"weights": weights, "kv": kv, "total": weights + kv}


def all_linears(model: GPT2) -> list[Linear]:
    """Every weight matrix a step multiplies by: 4 per block, then the LM head."""
    out = []
    for b in model.weights.blocks:
        out += [b.attn_c_attn, b.attn_c_proj, b.mlp_c_fc, b.mlp_c_proj]
    return out + [model.weights.lm_head]


@dataclass
class Bench:
    """One benchmark run: its settings, the models built so far, and every result."""

    args: argparse.Namespace
    out: TextIO
    rng: np.random.Generator
    models: dict = field(default_factory=dict)  # size name -> GPT2
    results: dict = field(default_factory=dict)  # section -> measurements (the --json object)

    def model(self, size: str) -> GPT2:
        if size not in self.models:
            t = timed(
                lambda: self.models.__setitem__(size, GPT2(ALL_SIZES[size], random_weights(ALL_SIZES[size]), name=size))
            )
            print(f"(built {size}-shaped random weights in {t:.1f} s)", file=self.out)
        return self.models[size]

    def say(self, line: str) -> None:
        print(line, file=self.out)
        self.out.flush()


# ---------------------------------------------------------------------------
# 1. decode: one KV-cached step.
# ---------------------------------------------------------------------------


def measure_decode(bench: Bench, size: str, contexts: list[int]) -> dict:
    """{str(ctx): stats_ms} of model.forward([tok], cache, last_only=True) at each context."""
    model = bench.model(size)
    caches = {ctx: filled_cache(model, ctx, bench.rng) for ctx in contexts}
    calls = {ctx: (lambda c=caches[ctx]: model.forward([TOKEN], c, last_only=True)) for ctx in contexts}
    times = interleaved(calls, bench.args.repeats, bench.rng, after=lambda ctx: caches[ctx].rollback(ctx))
    return {str(ctx): stats_ms(times[ctx]) for ctx in contexts}


def decode_ms(bench: Bench, size: str, ctx: int = VERIFY_CTX) -> float:
    """Median decode step at `ctx`, from the decode section's results or measured now."""
    per_size = bench.results.setdefault("decode", {}).setdefault(size, {})
    if str(ctx) not in per_size:
        per_size.update(measure_decode(bench, size, [ctx]))
    return per_size[str(ctx)]["median_ms"]


def section_decode(bench: Bench) -> None:
    contexts = bench.args.contexts
    rows = []
    for size in bench.args.sizes:
        res = measure_decode(bench, size, contexts)
        bench.results.setdefault("decode", {}).setdefault(size, {}).update(res)
        for ctx in contexts:
            s = res[str(ctx)]
            rows.append([size, ctx, s["median_ms"], spread(s), f"{_cell(s['min_ms'])}..{_cell(s['max_ms'])}", s["n"]])
    table(bench.out, "decode: one KV-cached step",
          "ms per model.forward([tok], cache, last_only=True) with n_past tokens cached (median, IQR, range)",
          ["size", "n_past", "median ms", "IQR ms", "min..max ms", "n"], rows)  # fmt: skip


# ---------------------------------------------------------------------------
# 2. verify: the cost curve r(m) of a pass over m new tokens.
# ---------------------------------------------------------------------------


def measure_verify(bench: Bench, size: str) -> dict:
    """r(m) = t(m tokens, all m logit rows) / t(1 token) at context 256.

    Each repeat times every m once (shuffled), and r is the median over repeats
    of the within-repeat ratio t_m / t_1, so slow drifts of the machine cancel.
    """
    model = bench.model(size)
    cache = filled_cache(model, VERIFY_CTX, bench.rng)
    tokens = [int(t) for t in bench.rng.integers(0, model.n_vocab, max(VERIFY_M))]
    calls = {m: (lambda m=m: model.forward(tokens[:m], cache)) for m in VERIFY_M}  # [m, n_vocab] logits
    times = interleaved(calls, bench.args.repeats, bench.rng, after=lambda m: cache.rollback(VERIFY_CTX))
    t1 = np.asarray(times[1])
    ratios = {m: np.asarray(times[m]) / t1 for m in VERIFY_M}
    return {
        "context": VERIFY_CTX,
        "m": list(VERIFY_M),
        "r": [float(np.median(ratios[m])) for m in VERIFY_M],
        "r_q1": [float(np.percentile(ratios[m], 25)) for m in VERIFY_M],
        "r_q3": [float(np.percentile(ratios[m], 75)) for m in VERIFY_M],
        "ms": [stats_ms(times[m]) for m in VERIFY_M],
    }


def verify_curve(bench: Bench, size: str) -> list[float]:
    per_size = bench.results.setdefault("verify", {})
    if size not in per_size:
        per_size[size] = measure_verify(bench, size)
    return per_size[size]["r"]


def section_verify(bench: Bench) -> None:
    for size in bench.args.sizes:
        res = measure_verify(bench, size)
        bench.results.setdefault("verify", {})[size] = res
        rows = [[m, res["ms"][i]["median_ms"], spread(res["ms"][i]), res["r"][i],
                 f"{res['r_q1'][i]:.2f}..{res['r_q3'][i]:.2f}", res["r"][i] / m]
                for i, m in enumerate(res["m"])]  # fmt: skip
        table(bench.out, f"verify: cost curve r(m), {size}",
              f"time of one forward over m new tokens (all m logit rows) at n_past={VERIFY_CTX}, "
              f"relative to m=1 (the paper assumes r=1)",
              ["m", "median ms", "IQR ms", "r(m)", "r IQR", "r(m)/m"], rows)  # fmt: skip


# ---------------------------------------------------------------------------
# 3. floor: bare matrix products and the memory-bandwidth bound.
# ---------------------------------------------------------------------------


def measure_bandwidth(n_bytes: int, repeats: int) -> dict:
    """GB/s of two large streaming reads of a float32 array of n_bytes (> the caches).

    sum:  np.sum over it (NumPy's reduction: one thread).
    gemv: A @ x, OpenBLAS's matrix-vector product on all its threads: the same
          kernel and access pattern as a decode step's linears.
    """
    n_cols = 4096
    a = np.ones((n_bytes // 4 // n_cols, n_cols), dtype=F32)  # [n_rows, 4096], pages touched
    x = np.ones(n_cols, dtype=F32)  # [4096]
    out = {"array_bytes": int(a.nbytes)}
    for name, fn in (("sum", lambda: a.sum()), ("gemv", lambda: a @ x)):
        fn()
        t = np.median([timed(fn) for _ in range(repeats)])
        out[f"{name}_GBps"] = float(a.nbytes / t / 1e9)
    out["GBps"] = max(out["sum_GBps"], out["gemv_GBps"])
    out["used"] = "sum" if out["sum_GBps"] >= out["gemv_GBps"] else "gemv"
    return out


def section_floor(bench: Bench) -> None:
    bw = measure_bandwidth(bench.args.bandwidth_mb << 20, max(5, bench.args.repeats // 3))
    bench.results.setdefault("floor", {})["bandwidth"] = bw
    bench.say(f"\nbandwidth: np.sum {bw['sum_GBps']:.1f} GB/s (1 thread), gemv {bw['gemv_GBps']:.1f} GB/s "
              f"(OpenBLAS threads) over a {bw['array_bytes'] / 1e6:.0f} MB array; the bound uses the higher, "
              f"{bw['used']}")  # fmt: skip
    rows = []
    for size in bench.args.sizes:
        model = bench.model(size)
        lins = all_linears(model)
        rows_in = {n: bench.rng.standard_normal((1, n), dtype=F32) for n in {lin.w_t.shape[1] for lin in lins}}

        def bare_matmuls():  # every weight matrix once, one row each: [1, n_in] @ [n_in, n_out]
            for lin in lins:
                linear(rows_in[lin.w_t.shape[1]], lin)

        cache = filled_cache(model, VERIFY_CTX, bench.rng)
        calls = {"step": lambda: model.forward([TOKEN], cache, last_only=True), "floor": bare_matmuls}
        # The step and its floor are timed in the same repeats, so their ratio is a same-moment ratio.
        times = interleaved(calls, bench.args.repeats, bench.rng, after=lambda key: cache.rollback(VERIFY_CTX))
        floor, step_stats = stats_ms(times["floor"]), stats_ms(times["step"])
        step = step_stats["median_ms"]
        nb = step_bytes(model.hparams, VERIFY_CTX)
        bound_ms = nb["total"] / (bw["GBps"] * 1e9) * 1e3
        res = {"context": VERIFY_CTX, "matmul_floor": floor, "step": step_stats, "step_ms": step, "bytes": nb,
               "bandwidth_bound_ms": bound_ms, "step_over_floor": step / floor["median_ms"],
               "step_over_bound": step / bound_ms, "floor_over_bound": floor["median_ms"] / bound_ms}  # fmt: skip
        bench.results["floor"][size] = res
        rows.append([size, step, spread(step_stats), floor["median_ms"], spread(floor), nb["total"] / 1e6, bound_ms,
                     res["step_over_floor"], res["step_over_bound"]])  # fmt: skip
    table(bench.out, f"floor: a step vs its bare matrix products, n_past={VERIFY_CTX}, timed interleaved",
          "floor = linear() on one row for the 4 matrices of every block + the LM head; "
          "bound = bytes read per step (weights + KV) / bandwidth",
          ["size", "step ms", "step IQR", "floor ms", "floor IQR", "MB/step", "bound ms", "step/floor", "step/bound"],
          rows)  # fmt: skip


# ---------------------------------------------------------------------------
# 4. nocache: recompute the whole sequence every step.
# ---------------------------------------------------------------------------


def section_nocache(bench: Bench) -> None:
    contexts = bench.args.nocache_contexts
    rows = []
    for size in bench.args.sizes:
        model = bench.model(size)
        seqs = {ctx: bench.rng.integers(0, model.n_vocab, ctx) for ctx in contexts}
        # What a cache-free implementation does for every new token: run all ctx
        # tokens from scratch; only the last row's logits are needed.
        calls = {
            ctx: (lambda s=seqs[ctx]: model.forward(s, model.new_cache(len(s)), last_only=True)) for ctx in contexts
        }
        times = interleaved(calls, bench.args.nocache_repeats, bench.rng)
        res = {}
        for ctx in contexts:
            s = stats_ms(times[ctx])
            cached = bench.results.get("decode", {}).get(size, {}).get(str(ctx))
            s["over_cached_step"] = s["median_ms"] / cached["median_ms"] if cached else math.nan
            res[str(ctx)] = s
            rows.append([size, ctx, s["median_ms"], spread(s), s["over_cached_step"], s["n"]])
        bench.results.setdefault("nocache", {})[size] = res
    table(bench.out, "nocache: no KV cache, the whole sequence every step",
          "ms per new token when forward() reruns all n_seq tokens (fresh cache, last row's logits only)",
          ["size", "n_seq", "median ms", "IQR ms", "x cached step", "n"], rows)  # fmt: skip
    section_prefill_matmul(bench, contexts)


def section_prefill_matmul(bench: Bench, contexts: list[int]) -> None:
    """Where a long pass goes: gpt2.linear()'s chunked matrix-vector path vs one GEMM."""
    rows = []
    for size in bench.args.sizes:
        lins = all_linears(bench.model(size))[:4]  # the first block's four matrices
        res = {}
        for n_seq in sorted({4, 9, 32, *contexts}):
            xs = {n: bench.rng.standard_normal((n_seq, n), dtype=F32) for n in {lin.w_t.shape[1] for lin in lins}}

            def chunked():  # what forward() runs
                for lin in lins:
                    linear(xs[lin.w_t.shape[1]], lin)

            def gemm():  # one matrix-matrix product per matrix: [n_seq, n_in] @ [n_in, n_out]
                for lin in lins:
                    xs[lin.w_t.shape[1]] @ lin.w_t.T

            t = interleaved({"linear": chunked, "gemm": gemm}, bench.args.nocache_repeats + 2, bench.rng)
            res[str(n_seq)] = {k: stats_ms(v) for k, v in t.items()}
            a, b = res[str(n_seq)]["linear"]["median_ms"], res[str(n_seq)]["gemm"]["median_ms"]
            rows.append([size, n_seq, a, b, a / b])
        bench.results.setdefault("nocache", {}).setdefault("block_matmuls", {})[size] = res
    table(bench.out, "nocache: one block's four matrix products over n_seq rows",
          "gpt2.linear() (chunked stack of matrix-vector products) vs a plain x @ W (one OpenBLAS GEMM)",
          ["size", "n_seq", "linear() ms", "x @ W ms", "linear/gemm"], rows)  # fmt: skip


# ---------------------------------------------------------------------------
# 5. predict: the cost model fed with the measured costs.
# ---------------------------------------------------------------------------


def target_costs(bench: Bench, size: str) -> tuple[float, list[float], str]:
    """(step ms at n_past=256, r(m) curve, where they came from) for a size.

    Measured when the size is in --sizes. Otherwise extrapolated: the step
    time from the bytes a step reads (a least-squares line ms = a + b * bytes
    through the measured sizes; through the origin with only one), and r(m)
    from the largest measured size.
    """
    if size in bench.args.sizes:
        return decode_ms(bench, size), verify_curve(bench, size), "measured"
    measured = sorted(bench.args.sizes, key=lambda s: step_bytes(ALL_SIZES[s], VERIFY_CTX)["total"])
    x = np.array([step_bytes(ALL_SIZES[s], VERIFY_CTX)["total"] for s in measured], dtype=np.float64)
    y = np.array([decode_ms(bench, s) for s in measured], dtype=np.float64)
    x_new = step_bytes(ALL_SIZES[size], VERIFY_CTX)["total"]
    slope, intercept = np.polyfit(x, y, 1) if len(x) >= 2 else (y[0] / x[0], 0.0)
    ms = slope * x_new + intercept
    how = f"extrapolated: line through {', '.join(measured)} by bytes/step"
    if not (slope > 0 and ms > 0):  # a nonsensical fit: scale the largest measured size instead
        ms, how = y[-1] * x_new / x[-1], f"extrapolated: {measured[-1]} scaled by bytes/step"
    return float(ms), verify_curve(bench, measured[-1]), f"{how}; r(m) of {measured[-1]}"


def section_predict(bench: Bench) -> None:
    for draft, target in bench.args.pairs:
        t_draft, _, draft_how = target_costs(bench, draft)
        t_target, r, target_how = target_costs(bench, target)
        c = t_draft / t_target  # the paper's c: one draft step in target steps
        res = {"draft": draft, "target": target, "draft_step_ms": t_draft, "target_step_ms": t_target,
               "c": c, "r": r, "draft_source": draft_how, "target_source": target_how, "rows": []}  # fmt: skip
        rows = []
        for alpha in ALPHAS:
            k, s = costmodel.best_k(alpha, c, r, K_MAX)  # measured r(m)
            k1, s1 = costmodel.best_k(alpha, c, None, K_MAX)  # the paper's r = 1 (GPU-like)
            grid = {str(kk): costmodel.predicted_speedup(alpha, kk, c, r) for kk in range(1, K_MAX + 1)}
            res["rows"].append({"alpha": alpha, "best_k": k, "speedup": s, "best_k_r1": k1, "speedup_r1": s1,
                                "speedup_by_k": grid})  # fmt: skip
            rows.append([alpha, k, s, k1, s1])
        bench.results.setdefault("predict", {})[f"{draft}->{target}"] = res
        if draft_how != "measured" or target_how != "measured":
            bench.say(f"\nNOTE {draft}->{target}: {draft} {draft_how}; {target} {target_how}")
        table(bench.out, f"predict: {draft} -> {target}, c = {t_draft:.3g} / {t_target:.3g} ms = {c:.3g}",
              "best K in 1..8 (0 = don't speculate) and its predicted speedup (Leviathan et al. eq. 1 over "
              "k c + r(k+1)), with measured r(m) and with r = 1",
              ["alpha", "best K", "speedup", "best K r=1", "speedup r=1"], rows)  # fmt: skip


# ---------------------------------------------------------------------------
# 6. ngram: speculative decoding with a model-free drafter, wall clock.
# ---------------------------------------------------------------------------


def section_ngram(bench: Bench) -> None:
    size = bench.args.sizes[0]
    model = bench.model(size)
    n = bench.args.ngram_tokens
    prompt = [int(t) for t in bench.rng.integers(0, model.n_vocab, 8)]
    early = max(1, model.n_layer // 4)  # 3 of 12 layers for 124M
    runs = {
        "autoregressive": lambda: autoregressive_sample(model, prompt, n),
        **{f"ngram K={k}": (lambda k=k: speculative_sample(model, "ngram", prompt, n, K=k)) for k in (2, 4, 8)},
        "ngram adaptive K": lambda: speculative_sample(model, "ngram", prompt, n, K=AdaptiveK(k_start=4, k_max=8)),
        f"early_exit:{early} K=4": lambda: speculative_sample(model, f"early_exit:{early}", prompt, n, K=4),
    }
    last = {}

    def keep(name):
        return lambda: last.__setitem__(name, runs[name]())

    times = interleaved({name: keep(name) for name in runs}, bench.args.ngram_repeats, bench.rng)
    reference = last["autoregressive"].tokens
    base = np.median(times["autoregressive"])
    res, rows = {"size": size, "n_tokens": n, "prompt": prompt, "runs": {}}, []
    for name, result in last.items():
        wall = float(np.median(times[name]))
        entry = {"seconds": stats_ms(times[name]), "speedup": float(base / wall),
                 "tokens_per_target_call": result.tokens_per_target_call, "target_calls": result.target_calls,
                 "draft_calls": result.draft_calls, "acceptance_rate": result.acceptance_rate,
                 "identical_to_autoregressive": result.tokens == reference}  # fmt: skip
        res["runs"][name] = entry
        rows.append([name, wall, entry["speedup"], entry["tokens_per_target_call"], entry["acceptance_rate"],
                     result.draft_calls, entry["identical_to_autoregressive"]])  # fmt: skip
    res["distinct_tokens"] = len(set(reference))
    bench.results["ngram"] = res
    table(bench.out, f"ngram: greedy speculative decoding on {size}, {n} tokens after an 8-token random prompt",
          f"wall-clock (median of {bench.args.ngram_repeats}) vs autoregressive; tokens per target call "
          f"includes the prompt's prefill; the text has {res['distinct_tokens']} distinct tokens",
          ["run", "seconds", "speedup", "tokens/call", "acceptance", "draft calls", "same tokens"], rows)  # fmt: skip


# ---------------------------------------------------------------------------
# 7. overhead: the sampler's own time.
# ---------------------------------------------------------------------------


def section_overhead(bench: Bench) -> None:
    size = bench.args.sizes[0]
    model = bench.model(size)
    n = bench.args.overhead_tokens
    prompt = [int(t) for t in bench.rng.integers(0, model.n_vocab, 8)]
    in_forward = [0.0]
    forward = model.forward  # the bound method

    def forward_timed(*a, **kw):
        t0 = time.perf_counter()
        try:
            return forward(*a, **kw)
        finally:
            in_forward[0] += time.perf_counter() - t0

    runs = []
    model.forward = forward_timed  # an instance attribute shadows the method, for draft and target alike
    try:
        for i in range(bench.args.ngram_repeats):
            in_forward[0] = 0.0
            t0 = time.perf_counter()
            # The model drafts for itself at T=1: every round computes the real
            # probabilities of K draft rows and K+1 target rows, and draws.
            result = speculative_sample(model, model, prompt, n, K=4, temperature=1.0, seed=i)
            wall = time.perf_counter() - t0
            runs.append({"wall_s": wall, "forward_s": in_forward[0], "rounds": result.rounds,
                         "overhead_fraction": (wall - in_forward[0]) / wall})  # fmt: skip
    finally:
        del model.forward
    best = sorted(runs, key=lambda r: r["overhead_fraction"])[len(runs) // 2]  # the median run
    per_round = lambda key: best[key] / best["rounds"] * 1e3  # noqa: E731
    res = {"size": size, "n_tokens": n, "K": 4, "temperature": 1.0, "runs": runs,
           "overhead_fraction": float(np.median([r["overhead_fraction"] for r in runs])),
           "round_ms": per_round("wall_s"), "overhead_ms_per_round": per_round("wall_s") - per_round("forward_s")}  # fmt: skip
    bench.results["overhead"] = res
    table(bench.out, f"overhead: speculative_sample's own time, {size} drafting for itself, K=4, T=1.0, {n} tokens",
          "wall time minus time inside model.forward (timer wrapped on the instance), per round (median run)",
          ["rounds", "round ms", "forward ms/round", "overhead ms/round", "overhead %"],
          [[best["rounds"], per_round("wall_s"), per_round("forward_s"), res["overhead_ms_per_round"],
            100 * res["overhead_fraction"]]])  # fmt: skip


# ---------------------------------------------------------------------------
# 8. io: checkpoint files, load time, peak memory.
# ---------------------------------------------------------------------------


def write_random_checkpoints(root: Path, sizes: list[str], tokenizer_dir: Path, seed: int) -> None:
    """GPT-2-shaped checkpoints with random weights and the real tokenizer, for an
    offline end-to-end run of main.py (its text is noise; its timings are real)."""
    for name in ("vocab.json", "merges.txt"):
        if not (tokenizer_dir / name).is_file():
            raise SystemExit(
                f"{tokenizer_dir / name} not found: pass --tokenizer DIR holding GPT-2's vocab.json and merges.txt"
            )
    for i, size in enumerate(sizes):
        folder = root / size
        model = GPT2(ALL_SIZES[size], random_weights(ALL_SIZES[size], seed=seed + i), name=size)
        n_bytes = save_folder(model, folder)
        for name in ("vocab.json", "merges.txt"):
            shutil.copyfile(tokenizer_dir / name, folder / name)
        print(f"wrote {folder}: {n_bytes / 1e6:.0f} MB of random {size}-shaped weights + the GPT-2 tokenizer")


def proc_status_kb(field_name: str) -> int | None:
    """A memory field of /proc/self/status (VmRSS, VmHWM), in kB; None off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_child(draft_dir: str, target_dir: str, n_tokens: int) -> None:
    """In a fresh process: load two checkpoints, generate speculatively, print memory as JSON."""
    from .checkpoint import load_folder

    baseline = proc_status_kb("VmRSS")  # the interpreter and NumPy
    draft = load_folder(draft_dir, with_tokenizer=False)
    target = load_folder(target_dir, with_tokenizer=False)
    # RssFile: pages of the memory-mapped files; RssAnon: arrays NumPy allocated (the transposed copies).
    loaded = {key: proc_status_kb(key) for key in ("VmRSS", "RssAnon", "RssFile", "VmHWM")}
    out = speculative_sample(target, draft, [TOKEN, 11, 290], n_tokens, K=4, temperature=1.0, seed=0)
    end = {key: proc_status_kb(key) for key in ("VmRSS", "RssAnon", "RssFile")}
    print(json.dumps({"baseline_kb": baseline, "after_load_kb": loaded["VmRSS"], "peak_kb": proc_status_kb("VmHWM"),
                      "after_load": loaded, "end": end, "tokens": len(out.tokens)}))  # fmt: skip


def section_io(bench: Bench) -> None:
    from .checkpoint import load_folder, read_safetensors

    draft_size, target_size = bench.args.sizes[0], bench.args.sizes[-1]
    tmp = Path(tempfile.mkdtemp(prefix="specdec-bench-", dir="/tmp"))
    try:
        files = {}
        for size in dict.fromkeys([draft_size, target_size]):
            t = timed(lambda: files.__setitem__(size, save_folder(bench.model(size), tmp / size)))
            bench.say(f"(wrote {size}: {files[size] / 1e6:.0f} MB in {t:.1f} s to {tmp / size})")
        path = tmp / target_size / "model.safetensors"
        n_repeats = max(3, bench.args.nocache_repeats)
        open_s = [timed(lambda: read_safetensors(path)) for _ in range(n_repeats)]
        load_s = [timed(lambda: load_folder(tmp / target_size, with_tokenizer=False)) for _ in range(n_repeats)]

        cmd = [sys.executable, "-m", "specdec.bench", "--rss-child", str(tmp / draft_size), str(tmp / target_size),
               "--rss-tokens", str(bench.args.rss_tokens)]  # fmt: skip
        child = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if child.returncode:
            raise RuntimeError(f"the peak-RSS child process failed:\n{child.stderr}")
        mem = json.loads(child.stdout.strip().splitlines()[-1])
        mem["ru_maxrss_children_kb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # kB on Linux
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    file_sum = sum(files.values())
    peak = mem["peak_kb"] * 1024
    res = {"draft": draft_size, "target": target_size, "file_bytes": files, "file_bytes_sum": file_sum,
           "open_ms": stats_ms(open_s), "load_folder_ms": stats_ms(load_s), "memory": mem,
           "peak_rss_bytes": peak, "peak_over_files": peak / file_sum,
           "peak_minus_baseline_over_files": (peak - mem["baseline_kb"] * 1024) / file_sum}  # fmt: skip
    bench.results["io"] = res
    table(bench.out, f"io: {target_size}-shaped safetensors (F32), warm page cache",
          "read_safetensors = header parse + np.memmap; load_folder = that + shape checks + transposed copies of the linears",
          ["file MB", "open ms", "open IQR", "load_folder ms", "load IQR"],
          [[files[target_size] / 1e6, res["open_ms"]["median_ms"], spread(res["open_ms"]),
            res["load_folder_ms"]["median_ms"], spread(res["load_folder_ms"])]])  # fmt: skip
    table(bench.out, f"io: peak RSS of a process loading {draft_size} + {target_size} and generating "
          f"{bench.args.rss_tokens} tokens speculatively",
          "VmHWM of the child vs the sum of the two safetensors files (baseline = interpreter + NumPy)",
          ["files MB", "baseline MB", "after load MB", "(anon + file)", "peak MB", "end (anon + file)",
           "peak/files", "(peak-baseline)/files"],
          [[file_sum / 1e6, mem["baseline_kb"] / 1e3, mem["after_load_kb"] / 1e3, _anon_file(mem["after_load"]),
            peak / 1e6, _anon_file(mem["end"]), res["peak_over_files"], res["peak_minus_baseline_over_files"]]])  # fmt: skip


def _anon_file(kb: dict) -> str:
    """'anon + file' MB of a RssAnon/RssFile dict ('-' off Linux)."""
    if kb.get("RssAnon") is None or kb.get("RssFile") is None:
        return "-"
    return f"{kb['RssAnon'] / 1e3:.0f} + {kb['RssFile'] / 1e3:.0f}"


# ---------------------------------------------------------------------------
# The command line.
# ---------------------------------------------------------------------------

SECTION_FUNCTIONS = {
    "decode": section_decode,
    "verify": section_verify,
    "floor": section_floor,
    "nocache": section_nocache,
    "predict": section_predict,
    "ngram": section_ngram,
    "overhead": section_overhead,
    "io": section_io,
}


def _csv(kind: Callable, allowed=None, shown=None):
    def parse(text: str) -> list:
        items = [kind(s.strip()) for s in text.split(",") if s.strip()]
        bad = [i for i in items if allowed is not None and i not in allowed]
        if not items or bad:
            what = ", ".join(map(str, shown or allowed)) if allowed else f"{kind.__name__}s"
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}")
        return items

    return parse


def _pairs(text: str) -> list[tuple[str, str]]:
    pairs = []
    for item in text.split(","):
        draft, sep, target = item.strip().partition(":")
        if not sep or draft not in ALL_SIZES or target not in ALL_SIZES:
            raise argparse.ArgumentTypeError(f"pairs are draft:target with sizes {', '.join(SIZES)}, e.g. 124M:355M")
        pairs.append((draft, target))
    return pairs


def parse_args(argv=None) -> argparse.Namespace:
    paragraphs = __doc__.split("\n\n")
    p = argparse.ArgumentParser(prog="python -m specdec.bench", description=paragraphs[0],
                                epilog="\n\n".join(x for x in paragraphs if x.startswith(("Commands", "Sections"))),
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument(
        "--sizes",
        type=_csv(str, ALL_SIZES, SIZES),
        help="model shapes to time, from 124M, 355M, 774M, 1558M (default 124M,355M)",
    )
    p.add_argument(
        "--only", type=_csv(str, SECTIONS), help=f"sections to run, from {','.join(SECTIONS)} (default all but io)"
    )
    p.add_argument("--repeats", type=int, help="timed repeats per measurement (default 30; 3 with --quick)")
    p.add_argument("--json", metavar="PATH", help="write all measurements as one JSON object to PATH ('-' for stdout)")
    p.add_argument("--quick", action="store_true", help="a fast smoke run: tiny shapes, few repeats")
    p.add_argument("--contexts", type=_csv(int), default=[32, 256, 1000], help="decode contexts (default 32,256,1000)")
    p.add_argument("--nocache-contexts", type=_csv(int), help="no-cache sequence lengths (default: --contexts)")
    p.add_argument(
        "--nocache-repeats", type=int, help="repeats of the slow no-cache passes (default 3; 1 with --quick)"
    )
    p.add_argument("--pairs", type=_pairs, help="draft:target pairs to predict (default 124M:355M,124M:1558M)")
    p.add_argument("--ngram-tokens", type=int, help="tokens generated in the ngram section (default 100)")
    p.add_argument("--seed", type=int, default=0, help="seed of the benchmark's random inputs (default 0)")
    p.add_argument("--write-checkpoints", metavar="DIR",
                   help="instead of timing: write random-weight checkpoints of --sizes into DIR/<size>/ in the Hub's "
                        "layout, with the tokenizer files from --tokenizer, so main.py --models_dir DIR runs offline")  # fmt: skip
    p.add_argument(
        "--tokenizer",
        metavar="DIR",
        default="../shared/gpt2-tokenizer",
        help="folder with GPT-2's vocab.json and merges.txt, for --write-checkpoints (default: %(default)s)",
    )
    p.add_argument("--bandwidth-mb", type=int, help=argparse.SUPPRESS)
    p.add_argument("--rss-child", nargs=2, metavar=("DRAFT_DIR", "TARGET_DIR"), help=argparse.SUPPRESS)
    p.add_argument("--rss-tokens", type=int, default=20, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    quick = args.quick
    args.sizes = args.sizes or (["tiny", "tiny2"] if quick else ["124M", "355M"])
    args.sizes = sorted(dict.fromkeys(args.sizes), key=lambda s: step_bytes(ALL_SIZES[s], 0)["weights"])
    args.only = args.only or list(DEFAULT_SECTIONS)
    args.repeats = args.repeats or (3 if quick else 30)
    args.nocache_repeats = args.nocache_repeats or (1 if quick else 3)
    args.nocache_contexts = args.nocache_contexts or args.contexts
    args.ngram_tokens = args.ngram_tokens or (30 if quick else 100)
    args.ngram_repeats = 1 if quick else 3
    args.overhead_tokens = 12 if quick else 40
    args.bandwidth_mb = args.bandwidth_mb or (64 if quick else 512)
    if args.pairs is None:
        small = args.sizes[0] if set(args.sizes) <= set(TEST_SIZES) else "124M"
        args.pairs = [(small, "tiny2" if small == "tiny" else "355M"), (small, "1558M")]
    for ctx in {*args.contexts, *args.nocache_contexts}:
        for size in args.sizes:
            if not 1 <= ctx <= ALL_SIZES[size].n_ctx - max(VERIFY_M):
                p.error(f"context {ctx} must lie in 1..{ALL_SIZES[size].n_ctx - max(VERIFY_M)} for {size}")
    if args.repeats < 1 or args.nocache_repeats < 1:
        p.error("repeats must be at least 1")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.rss_child:
        rss_child(*args.rss_child, args.rss_tokens)
        return {}
    if args.write_checkpoints:
        write_random_checkpoints(Path(args.write_checkpoints), args.sizes, Path(args.tokenizer), args.seed)
        return {}
    out = sys.stderr if args.json == "-" else sys.stdout  # keep stdout clean for the JSON
    bench = Bench(args, out, np.random.default_rng(args.seed))
    env = environment()
    bench.results["environment"] = env
    bench.results["settings"] = {"sizes": args.sizes, "sections": args.only, "repeats": args.repeats,
                                 "contexts": args.contexts, "nocache_contexts": args.nocache_contexts,
                                 "nocache_repeats": args.nocache_repeats, "quick": args.quick, "seed": args.seed,
                                 "pairs": [list(p) for p in args.pairs],
                                 "kv_cache_fill": "random K/V, cache.length set directly"}  # fmt: skip
    bench.say(f"specdec.bench: numpy {env['numpy']}, BLAS {env['blas']} ({env.get('blas_config', '')}), "
              f"BLAS threads {env['blas_threads']} [{env['blas_threads_source']}], "
              f"CPUs {env['cpu_count']} ({env['cpus_usable']} usable), Python {env['python']} {env['machine']}")  # fmt: skip
    bench.say(f"environment variables: {env['env_vars'] or 'no OPENBLAS_* / OMP_* / MKL_* set'}")
    bench.say(f"sizes {','.join(args.sizes)}; sections {','.join(args.only)}; repeats {args.repeats}; "
              f"KV cache filled with random K/V up to n_past (attention's cost depends only on the length)")  # fmt: skip
    t_start = time.perf_counter()
    for name in SECTIONS:  # in this order, whatever order --only gave
        if name in args.only:
            t = timed(lambda: SECTION_FUNCTIONS[name](bench))
            bench.results.setdefault("section_seconds", {})[name] = t
    bench.results["total_seconds"] = time.perf_counter() - t_start
    bench.say(f"\ntotal {bench.results['total_seconds']:.0f} s")
    if args.json:
        text = json.dumps(jsonable(bench.results), indent=1, allow_nan=False)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")
            bench.say(f"wrote {args.json}")
    return bench.results


if __name__ == "__main__":
    main()
