"""Where the time goes: a benchmark of specdec on GPT-2-shaped random weights.

It times the forward pass and the samplers with the library's one stopwatch
(timing.py) and turns the measured costs into the speedups the cost model
(costmodel.py; Leviathan et al., arXiv 2211.17192, section 3) predicts. Weights
are random, built in memory (no download): every timing depends only on the
shapes, except the drafters section, whose acceptance depends on the text the
random model writes. A script that prints numbers, not a test.

Commands:
    python -m specdec.bench                          # 124M and 355M, all sections but io
    python -m specdec.bench --sizes 124M --repeats 5 # 17 min on 2 shared vCPUs at load average 10-15
                                                     # (drafters 6 min, costcheck 7 min, decode 2 min)
    python -m specdec.bench --json /tmp/bench.json   # also write every measurement as one JSON object
    python -m specdec.bench --json -                 # JSON on stdout, the tables on stderr
    python -m specdec.bench --sizes 124M,355M,1558M  # 774M / 1558M on request (1558M: 6.2 GB of weights)
    python -m specdec.bench --only decode,verify --repeats 50
    python -m specdec.bench --only io                # checkpoint I/O and peak memory (writes ~2 GB under /tmp)
    python -m specdec.bench --quick                  # a smoke run on tiny shapes (what tests/test_bench.py runs)
    python -m specdec.bench --write-checkpoints DIR  # random-weight checkpoints for an offline main.py run
    python -m specdec.bench --only alpha-table       # alpha of every GPT-2 pair on disk (real weights; suite.py)

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
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from .. import costmodel, flags
from ..autoregressive import autoregressive_sample
from ..checkpoints.load import load_folder, save_folder
from ..checkpoints.safetensors import read_safetensors
from ..costmodel import AdaptiveK
from ..model import kernels, threads
from ..model.base import CausalLM
from ..model.cache import KVCache
from ..model.gpt2 import F32, GPT2, HParams, random_weights
from ..model.gpt2 import step_weights as gpt2_step_weights
from ..model.kernels import linear
from ..model.shapes import GPT2_SHAPES
from ..race_render import jsonable
from ..speculative import speculative_sample
from ..timing import pass_calls, time_calls, verify_curve
from .progress import Progress, add_quiet

SIZES = GPT2_SHAPES  # 124M, 355M, 774M, 1558M
# Tiny shapes for the smoke test (--quick): not offered in --help.
TEST_SIZES = {
    "tiny": HParams(n_vocab=512, n_ctx=1024, n_embd=64, n_head=4, n_layer=4),
    "tiny2": HParams(n_vocab=512, n_ctx=1024, n_embd=128, n_head=4, n_layer=8),
}
ALL_SIZES = {**SIZES, **TEST_SIZES}

SECTIONS = ("decode", "verify", "kernel", "predict", "restricted", "exact", "drafters", "costcheck", "overhead", "io")
DEFAULT_SECTIONS = tuple(s for s in SECTIONS if s != "io")
VERIFY_CTX = 256  # context of the verification-cost curve and of predict's step times
VERIFY_M = range(1, 17)  # m = K + 1 new tokens, for K = 0..15 (trees want 4-16 nodes)
ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
K_MAX = 8
TOKEN = 464  # the token fed at every timed step (any id works: cost does not depend on it)


# ---------------------------------------------------------------------------
# Small tools: statistics, tables, models.
# ---------------------------------------------------------------------------


def stats_ms(seconds) -> dict:
    """Median, quartiles and range of a list of durations, in milliseconds."""
    a = np.asarray(list(seconds), dtype=np.float64) * 1e3
    q1, med, q3 = np.percentile(a, [25, 50, 75])
    return {"median_ms": float(med), "q1_ms": float(q1), "q3_ms": float(q3),
            "min_ms": float(a.min()), "max_ms": float(a.max()), "n": int(a.size)}  # fmt: skip


def table(out, title: str, explanation: str, headers: list[str], rows: list[list]) -> None:
    """Print an aligned table: a title, a one-line explanation, a header row, the rows."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    print(f"\n== {title}\n   {explanation}", file=out)
    for row in [headers, *cells]:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)), file=out)
    out.flush()


def _cell(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        if value != value:  # nan
            return "-"
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def filled_cache(model: CausalLM, n_past: int, rng: np.random.Generator) -> KVCache:
    """A KV cache holding n_past positions of random keys and values.

    NOTE: not a real forward over n_past tokens. Attention's cost depends only on
    cache.length, so random K/V plus `cache.length = n_past` times the same.
    """
    h = model.hparams
    cache = model.new_cache()
    cache.reserve(min(h.n_ctx, n_past + max(VERIFY_M)))  # room for the timed passes: no growth while timing
    shape = (h.n_layer, h.n_kv_head, n_past, h.d_head)
    cache.k[:, :, :n_past] = rng.standard_normal(shape, dtype=F32)  # [n_layer, n_kv_head, n_past, d_head]
    cache.v[:, :, :n_past] = rng.standard_normal(shape, dtype=F32)
    cache.length = n_past
    return cache


def step_bytes(h: HParams) -> int:
    """Bytes of float32 weights one 1-token step of a GPT-2 with these hyperparameters reads (GPT2.step_weights)."""
    return 4 * gpt2_step_weights(h)


class Bench:
    """One benchmark run: its settings, the models built so far, and every result."""

    def __init__(self, args: argparse.Namespace, out):
        self.args, self.out, self.rng = args, out, np.random.default_rng(args.seed)
        self.progress = Progress("speed", args.quiet)  # what it is doing, on stderr
        self.models: dict[str, GPT2] = {}
        self.results: dict = {}  # section -> measurements (the --json object)

    def model(self, size: str) -> GPT2:
        if size not in self.models:
            start = time.perf_counter()
            self.models[size] = GPT2(ALL_SIZES[size], random_weights(ALL_SIZES[size]), name=size)
            self.say(f"(built {size}-shaped random weights in {time.perf_counter() - start:.1f} s)")
        return self.models[size]

    def say(self, line: str) -> None:
        print(line, file=self.out)
        self.out.flush()

    def time(self, calls: dict, repeats: int | None = None, after: Callable | None = None) -> dict:
        return time_calls(calls, repeats or self.args.repeats, self.rng, after)


# ---------------------------------------------------------------------------
# decode: one KV-cached step, and the same token without a cache.
# ---------------------------------------------------------------------------


def measure_decode(bench: Bench, size: str, contexts: list[int]) -> dict:
    """{str(ctx): stats_ms} of model.forward([tok], cache, last_only=True) at each context."""
    model = bench.model(size)
    caches = {ctx: filled_cache(model, ctx, bench.rng) for ctx in contexts}
    calls = {ctx: (lambda c=caches[ctx]: model.forward([TOKEN], c, last_only=True)) for ctx in contexts}
    times = bench.time(calls, after=lambda ctx: caches[ctx].rollback(ctx))
    return {str(ctx): stats_ms(times[ctx]) for ctx in contexts}


def decode_ms(bench: Bench, size: str, ctx: int = VERIFY_CTX) -> float:
    """Median decode step at `ctx`, from the decode section's results or measured now."""
    per_size = bench.results.setdefault("decode", {}).setdefault(size, {})
    if str(ctx) not in per_size:
        per_size.update(measure_decode(bench, size, [ctx]))
    return per_size[str(ctx)]["median_ms"]


def section_decode(bench: Bench) -> None:
    rows = []
    for size in bench.args.sizes:
        model = bench.model(size)
        res = measure_decode(bench, size, bench.args.contexts)
        # What a cache-free implementation does for every new token: run the whole
        # sequence from scratch; only the last row's logits are needed.
        seqs = {ctx: bench.rng.integers(0, model.n_vocab, ctx) for ctx in bench.args.contexts}
        calls = {ctx: (lambda s=s: model.forward(s, model.new_cache(len(s)), last_only=True))
                 for ctx, s in seqs.items()}  # fmt: skip
        nocache = bench.time(calls, bench.args.nocache_repeats)
        for ctx in bench.args.contexts:
            s, n = res[str(ctx)], stats_ms(nocache[ctx])
            s["nocache"] = n
            rows.append([size, ctx, s["median_ms"], f"{_cell(s['q1_ms'])}..{_cell(s['q3_ms'])}", n["median_ms"],
                         n["median_ms"] / s["median_ms"]])  # fmt: skip
        bench.results.setdefault("decode", {}).setdefault(size, {}).update(res)
    table(bench.out, "decode: one KV-cached step, and the same token without a KV cache",
          "ms per model.forward([tok], cache, last_only=True) with n_past tokens cached (median, IQR); "
          "no cache = a forward over all n_past tokens, as simple NumPy GPT-2s do",
          ["size", "n_past", "median ms", "IQR ms", "no cache ms", "x"], rows)  # fmt: skip


# ---------------------------------------------------------------------------
# verify: the cost curve r(m) of a pass over m new tokens.
# ---------------------------------------------------------------------------


def measure_verify(bench: Bench, size: str) -> dict:
    """r(m) = t(m tokens, all m logit rows) / t(1 token) at context 256 (timing.verify_curve)."""
    calls, rollback = pass_calls(bench.model(size), filled_cache(bench.model(size), VERIFY_CTX, bench.rng), VERIFY_M,
                                 token=TOKEN)  # fmt: skip
    times = bench.time(calls, after=rollback)
    return {"context": VERIFY_CTX, "m": list(VERIFY_M), "r": verify_curve(times),
            "ms": [stats_ms(times[m]) for m in VERIFY_M]}  # fmt: skip


def verify_r(bench: Bench, size: str) -> list[float]:
    per_size = bench.results.setdefault("verify", {})
    if size not in per_size:
        per_size[size] = measure_verify(bench, size)
    return per_size[size]["r"]


def section_verify(bench: Bench) -> None:
    for size in bench.args.sizes:
        res = bench.results.setdefault("verify", {})[size] = measure_verify(bench, size)
        rows = [[m, res["ms"][i]["median_ms"], res["r"][i], res["r"][i] / m] for i, m in enumerate(res["m"])]
        table(bench.out, f"verify: cost curve r(m), {size}",
              f"one forward over m new tokens (all m logit rows) at n_past={VERIFY_CTX}, relative to m=1 "
              f"(median of within-repeat ratios; the paper assumes r=1)",
              ["m", "median ms", "r(m)", "r(m)/m"], rows)  # fmt: skip


# ---------------------------------------------------------------------------
# predict: the cost model fed with the measured costs.
# ---------------------------------------------------------------------------


def target_costs(bench: Bench, size: str) -> tuple[float, list[float], str]:
    """(step ms at n_past=256, r(m) curve, where they came from) for a size.

    Measured when the size is in --sizes. Otherwise extrapolated: the step time
    from the bytes of weights a step reads (a least-squares line through the
    measured sizes; through the origin with only one), r(m) from the largest
    measured size.
    """
    if size in bench.args.sizes:
        return decode_ms(bench, size), verify_r(bench, size), "measured"
    measured = bench.args.sizes  # sorted by size
    x = np.array([step_bytes(ALL_SIZES[s]) for s in measured], dtype=np.float64)
    y = np.array([decode_ms(bench, s) for s in measured], dtype=np.float64)
    slope, intercept = np.polyfit(x, y, 1) if len(x) >= 2 else (y[0] / x[0], 0.0)
    ms = slope * step_bytes(ALL_SIZES[size]) + intercept
    how = f"extrapolated: line through {', '.join(measured)} by bytes/step"
    if not (slope > 0 and ms > 0):  # a nonsensical fit: scale the largest measured size instead
        ms, how = y[-1] * step_bytes(ALL_SIZES[size]) / x[-1], f"extrapolated: {measured[-1]} scaled by bytes/step"
    return float(ms), verify_r(bench, measured[-1]), f"{how}; r(m) of {measured[-1]}"


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
# drafters: speculative decoding with model-free drafters, wall clock.
# ---------------------------------------------------------------------------


def section_drafters(bench: Bench) -> None:
    size = bench.args.sizes[0]
    model = bench.model(size)
    n = bench.args.drafter_tokens
    prompt = [int(t) for t in bench.rng.integers(0, model.n_vocab, 8)]
    early = max(1, model.n_layer // 4)  # 3 of 12 layers for 124M
    runs = {
        "autoregressive": lambda: autoregressive_sample(model, prompt, n),
        **{f"ngram K={k}": (lambda k=k: speculative_sample(model, "ngram", prompt, n, K=k)) for k in (2, 4, 8)},
        "ngram adaptive K": lambda: speculative_sample(model, "ngram", prompt, n, K=AdaptiveK(k_start=4, k_max=8)),
        f"early_exit:{early} K=4": lambda: speculative_sample(model, f"early_exit:{early}", prompt, n, K=4),
    }
    last = {}

    def run(name):
        bench.progress(f"drafters: {name}, {n} tokens")
        last[name] = runs[name]()

    times = bench.time({name: (lambda name=name: run(name)) for name in runs}, bench.args.drafter_repeats)
    reference = last["autoregressive"].tokens
    base = np.median(times["autoregressive"])
    res, rows = {"size": size, "n_tokens": n, "prompt": prompt, "runs": {}}, []
    for name, result in last.items():
        wall = float(np.median(times[name]))
        entry = {"seconds": stats_ms(times[name]), "speedup": float(base / wall),
                 "tau": result.tau, "target_calls": result.target_calls,
                 "draft_calls": result.draft_calls, "alpha": result.alpha,
                 "identical_to_autoregressive": result.tokens == reference}  # fmt: skip
        res["runs"][name] = entry
        rows.append([name, wall, entry["speedup"], entry["tau"], entry["alpha"],
                     result.draft_calls, entry["identical_to_autoregressive"]])  # fmt: skip
    res["distinct_tokens"] = len(set(reference))
    bench.results["drafters"] = res
    table(bench.out, f"drafters: greedy speculative decoding on {size}, {n} tokens after an 8-token random prompt",
          f"wall-clock (median of {bench.args.drafter_repeats}) vs autoregressive; tau = tokens per round "
          f"(= per target pass, the prompt's prefill apart), alpha = accepted / judged drafts; the text has {res['distinct_tokens']} distinct tokens",
          ["run", "seconds", "speedup", "tau", "alpha", "draft calls", "same tokens"], rows)  # fmt: skip


# ---------------------------------------------------------------------------
# costcheck: the cost model's prediction against the wall clock.
# ---------------------------------------------------------------------------

COSTCHECK_TOLERANCE = 0.10  # how close the prediction should come to the measured speedup


def costcheck_runs(sizes: list[str]) -> list[tuple[str, str, int]]:
    """(target size, drafter, K) for the costcheck section: n-gram at K = 2, 4, 8, early exit
    after a quarter of the layers, and the smallest other size as a draft model."""
    runs = []
    for target in sizes:
        runs += [(target, "ngram", k) for k in (2, 4, 8)]
        runs.append((target, f"early_exit:{max(1, ALL_SIZES[target].n_layer // 4)}", 4))
        runs += [(target, draft, 4) for draft in sizes[:1] if draft != target]
    return runs


def section_costcheck(bench: Bench) -> None:
    """For each drafter: race() times greedy speculative against autoregressive decoding;
    measure_costs() times c and r(m) at the run's mean context; the cost model predicts the
    speedup from them two ways: eq. 1 from the measured alpha, and from the run's own rounds."""
    from ..race import race
    from ..timing import measure_costs

    n = bench.args.drafter_tokens
    res, rows = {"n_tokens": n, "runs": []}, []
    for target_size, draft, k in costcheck_runs(bench.args.sizes):
        bench.progress(f"costcheck: target {target_size}, draft {draft}, K={k}: a race, then the costs")
        target = bench.model(target_size)
        drafter = bench.model(draft) if draft in ALL_SIZES else draft
        prompt = [int(t) for t in bench.rng.integers(0, target.n_vocab, 8)]
        report = race(target, drafter, prompt, n, K=k, repeats=bench.args.drafter_repeats)
        out = report.spec.result
        context = prompt + out.tokens[: n // 2]  # the mean context over the run
        costs = measure_costs(target, drafter, context, m_max=max(k + 1, len(prompt) - 1), repeats=bench.args.repeats)
        c, r = costs.c, costs.r
        eq1 = costmodel.predicted_speedup(out.alpha, k, c, r)
        # The run's own rounds: each round's k drafts (0 when the n-gram drafter found no match)
        # and one pass over k + 1 tokens; draft steps as counted (model-free drafters: a lookup per round).
        from_rounds = costmodel.speedup_from_rounds(len(out.tokens), out.k_per_round, out.draft_steps, c, r)
        measured = report.speedup
        # Where a miss comes from: the share of the run spent outside forward passes and draft
        # proposals (sampling, bookkeeping: not in the cost model), and the target passes' own time
        # against what r(m) says they should take.
        spec = report.spec
        passes = [len(prompt) - 1] + [kr + 1 for kr in out.k_per_round]  # the prefill, then one pass per round
        passes_predicted = sum(costmodel.verify_cost(m, r) for m in passes) * costs.target_step
        entry = {"target": target_size, "draft": draft, "K": k, "alpha": out.alpha, "tau": out.tau, "c": c,
                 "r": r, "target_step_ms": costs.target_step * 1e3, "measured_speedup": measured,
                 "predicted_eq1": eq1, "predicted_from_rounds": from_rounds,
                 "error_eq1": eq1 / measured - 1, "error_from_rounds": from_rounds / measured - 1,
                 "identical_tokens": report.texts_identical, "outside_passes": spec.sampler_seconds / spec.seconds,
                 "passes_vs_predicted": spec.verify_seconds / passes_predicted}  # fmt: skip
        res["runs"].append(entry)
        rows.append([target_size, draft, k, out.alpha, out.tau, c, r[k], measured, eq1,
                     f"{entry['error_eq1']:+.0%}", from_rounds, f"{entry['error_from_rounds']:+.0%}",
                     f"{entry['outside_passes']:.0%}", entry["passes_vs_predicted"]])  # fmt: skip
    errors = [abs(e["error_from_rounds"]) for e in res["runs"]]
    res["within_tolerance"] = sum(err <= COSTCHECK_TOLERANCE for err in errors)
    bench.results["costcheck"] = res
    table(bench.out, f"costcheck: predicted vs measured speedup, greedy, {n} tokens after an 8-token random prompt",
          f"measured = median of {bench.args.drafter_repeats} interleaved runs; c and r(K+1) timed at the run's mean "
          f"context; eq. 1 = Leviathan et al. from alpha; rounds = tokens / (draft steps x c + sum of r(k+1)) "
          f"over the run's rounds; {res['within_tolerance']} of {len(errors)} within "
          f"{COSTCHECK_TOLERANCE:.0%} (rounds); outside = the run's time outside forward passes and drafting; "
          f"passes = time in target passes / what r(m) predicts for them (prefill included)",
          ["target", "draft", "K", "alpha", "tau", "c", "r(K+1)", "measured", "eq. 1", "eq. 1 error", "rounds",
           "rounds error",
           "outside", "passes"],
          rows)  # fmt: skip


# ---------------------------------------------------------------------------
# overhead: the sampler's own time.
# ---------------------------------------------------------------------------


def section_overhead(bench: Bench) -> None:
    size = bench.args.sizes[0]
    model = bench.model(size)
    n = bench.args.overhead_tokens
    prompt = [int(t) for t in bench.rng.integers(0, model.n_vocab, 8)]
    in_forward = [0.0]
    forward = model.forward  # the bound method

    def forward_timed(*a, **kw):
        start = time.perf_counter()
        try:
            return forward(*a, **kw)
        finally:
            in_forward[0] += time.perf_counter() - start

    runs = []
    model.forward = forward_timed  # an instance attribute shadows the method, for draft and target alike
    try:
        for i in range(bench.args.drafter_repeats):
            bench.progress(f"overhead: run {i + 1} of {bench.args.drafter_repeats}")
            in_forward[0] = 0.0
            start = time.perf_counter()
            # The model drafts for itself at T=1: every round computes the real
            # probabilities of K draft rows and K+1 target rows, and draws.
            result = speculative_sample(model, model, prompt, n, K=4, temperature=1.0, seed=i)
            wall = time.perf_counter() - start
            runs.append({"wall_s": wall, "forward_s": in_forward[0], "rounds": result.rounds,
                         "overhead_fraction": (wall - in_forward[0]) / wall})  # fmt: skip
    finally:
        del model.forward
    median = sorted(runs, key=lambda r: r["overhead_fraction"])[len(runs) // 2]
    round_ms, forward_ms = (median[key] / median["rounds"] * 1e3 for key in ("wall_s", "forward_s"))
    res = {"size": size, "n_tokens": n, "K": 4, "temperature": 1.0, "runs": runs,
           "overhead_fraction": float(np.median([r["overhead_fraction"] for r in runs])),
           "round_ms": round_ms, "overhead_ms_per_round": round_ms - forward_ms}  # fmt: skip
    bench.results["overhead"] = res
    table(bench.out, f"overhead: speculative_sample's own time, {size} drafting for itself, K=4, T=1.0, {n} tokens",
          "wall time minus time inside model.forward (timer wrapped on the instance), per round (median run)",
          ["rounds", "round ms", "forward ms/round", "overhead ms/round", "overhead %"],
          [[median["rounds"], round_ms, forward_ms, round_ms - forward_ms,
            100 * res["overhead_fraction"]]])  # fmt: skip


# ---------------------------------------------------------------------------
# io: checkpoint files, load time, peak memory.
# ---------------------------------------------------------------------------


def write_random_checkpoints(root: Path, sizes: list[str], tokenizer_dir: Path, seed: int) -> None:
    """GPT-2-shaped checkpoints with random weights and the real tokenizer, for an
    offline end-to-end run of main.py (its text is noise; its timings are real)."""
    for name in ("vocab.json", "merges.txt"):
        if not (tokenizer_dir / name).is_file():
            raise SystemExit(f"{tokenizer_dir / name} not found: pass --tokenizer DIR holding GPT-2's vocab.json "
                             f"and merges.txt")  # fmt: skip
    for i, size in enumerate(sizes):
        folder = root / size
        n_bytes = save_folder(GPT2(ALL_SIZES[size], random_weights(ALL_SIZES[size], seed=seed + i), name=size), folder)
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
    baseline = proc_status_kb("VmRSS")  # the interpreter and NumPy
    draft = load_folder(draft_dir, with_tokenizer=False)
    target = load_folder(target_dir, with_tokenizer=False)
    after_load = proc_status_kb("VmRSS")
    out = speculative_sample(target, draft, [TOKEN, 11, 290], n_tokens, K=4, temperature=1.0, seed=0)
    print(json.dumps({"baseline_kb": baseline, "after_load_kb": after_load, "peak_kb": proc_status_kb("VmHWM"),
                      "tokens": len(out.tokens)}))  # fmt: skip


def section_io(bench: Bench) -> None:
    draft_size, target_size = bench.args.sizes[0], bench.args.sizes[-1]
    tmp = Path(tempfile.mkdtemp(prefix="specdec-bench-"))
    try:
        files = {size: save_folder(bench.model(size), tmp / size) for size in dict.fromkeys([draft_size, target_size])}
        path = tmp / target_size / "model.safetensors"

        start = time.perf_counter()
        load_folder(tmp / target_size, with_tokenizer=False)  # copies, and keeps the layout (layoutcache.py)
        first_load = time.perf_counter() - start
        load_copying = lambda: load_folder(tmp / target_size, with_tokenizer=False, keep_layout=False)  # noqa: E731
        times = bench.time({"open": lambda: read_safetensors(path), "load": load_copying,
                            "load_kept": lambda: load_folder(tmp / target_size, with_tokenizer=False)},
                           max(3, bench.args.nocache_repeats))  # fmt: skip
        load_folder(tmp / draft_size, with_tokenizer=False)  # so the child loads both through their kept layouts
        cmd = [sys.executable, "-m", "specdec.bench", "--rss-child", str(tmp / draft_size), str(tmp / target_size),
               "--rss-tokens", str(bench.args.rss_tokens)]  # fmt: skip
        child = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if child.returncode:
            raise RuntimeError(f"the peak-RSS child process failed:\n{child.stderr}")
        mem = json.loads(child.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    file_sum = sum(files.values())
    peak = mem["peak_kb"] * 1024
    res = {"draft": draft_size, "target": target_size, "file_bytes": files, "file_bytes_sum": file_sum,
           "open_ms": stats_ms(times["open"]), "load_folder_ms": stats_ms(times["load"]),
           "load_folder_kept_ms": stats_ms(times["load_kept"]), "first_load_ms": first_load * 1e3, "memory": mem,
           "peak_over_files": peak / file_sum}  # fmt: skip
    bench.results["io"] = res
    table(bench.out, f"io: {target_size}-shaped safetensors (F32, warm page cache), and the peak RSS of a process "
          f"loading {draft_size} + {target_size} and generating {bench.args.rss_tokens} tokens speculatively",
          "open = header + np.memmap; copying = that + checks + transposed copies; first = copying + writing the "
          "kept layout; kept = loading with it; peak = VmHWM of a child process loading both through their "
          "kept layouts",
          ["file MB", "open ms", "copying ms", "first ms", "kept ms", "files MB", "baseline MB", "after load MB",
           "peak MB", "peak/files"],
          [[files[target_size] / 1e6, res["open_ms"]["median_ms"], res["load_folder_ms"]["median_ms"], first_load * 1e3,
            res["load_folder_kept_ms"]["median_ms"], file_sum / 1e6,
            mem["baseline_kb"] / 1e3, mem["after_load_kb"] / 1e3, peak / 1e6, res["peak_over_files"]]])  # fmt: skip


# ---------------------------------------------------------------------------
# kernel, restricted, exact: the few-token kernel per matrix, cheaper drafts, float64's cost.
# ---------------------------------------------------------------------------

DISTILGPT2 = HParams(n_vocab=50257, n_ctx=1024, n_embd=768, n_head=12, n_layer=6)  # distilbert/distilgpt2
RESTRICTED_N = (4096, 8192, 16384)  # draft vocabularies of the restricted section


def kernel_name() -> str:
    """How linear() multiplies a few rows on this machine (gpt2.py's constants, threads.py)."""
    core = threads.BLAS.core if threads.BLAS else "not found"
    how = "stacks of small GEMMs" if kernels.SMALL_GEMM else "stacked matrix-vector chunks"
    return f"OpenBLAS kernels {core}; {kernels.SPLIT_PARTS} part(s) per matrix; {how}"


def section_kernel(bench: Bench) -> None:
    """r(m) of each kind of weight matrix alone. A timed call runs linear() over that matrix
    of every block, in order, as a forward pass meets them: none is still in cache."""
    for size in bench.args.sizes:
        w = bench.model(size).weights
        groups = {name: [getattr(b, name) for b in w.blocks] for name in ("attn_c_attn", "attn_c_proj", "mlp_c_fc", "mlp_c_proj")}
        groups["lm_head"] = [w.lm_head]
        res, rows = {}, []
        for name, lins in groups.items():
            xs = {m: bench.rng.standard_normal((m, lins[0].w_t.shape[1]), dtype=F32) for m in VERIFY_M}
            times = bench.time({m: (lambda m=m: [linear(xs[m], lin) for lin in lins]) for m in VERIFY_M})
            res[name] = {"weight_shape": list(lins[0].weight.shape), "matrices": len(lins),
                         "m1": stats_ms(times[1]), "m": list(VERIFY_M), "r": verify_curve(times)}  # fmt: skip
            rows.append([name, "x".join(map(str, lins[0].weight.shape)), res[name]["m1"]["median_ms"], *res[name]["r"][1:]])
        bench.results.setdefault("kernel", {})[size] = res
        table(bench.out, f"kernel: r(m) per weight matrix, {size} ({kernel_name()})",
              "linear() over m rows, over that matrix in every block; median of within-repeat ratios to m = 1",
              ["matrix", "W", "m=1 ms", *(f"r({m})" for m in VERIFY_M[1:])], rows)  # fmt: skip


def section_restricted(bench: Bench) -> None:
    """c = draft step / target step for drafts whose LM head scores only N tokens (restricted.py)."""
    from ..drafters.restricted import restrict

    if bench.args.quick:  # tiny shapes: the smallest drafts for the largest, with a quarter and half the vocabulary
        shapes, targets = {bench.args.sizes[0]: ALL_SIZES[bench.args.sizes[0]]}, bench.args.sizes[-1:]
        n_list = (ALL_SIZES[bench.args.sizes[0]].n_vocab // 4, ALL_SIZES[bench.args.sizes[0]].n_vocab // 2)
    else:
        shapes, targets, n_list = {"124M": SIZES["124M"], "distilgpt2": DISTILGPT2}, bench.args.sizes, RESTRICTED_N
        targets = [t for t in targets if t != "124M"] or targets
    drafts = {}
    for name, hparams in shapes.items():
        full = bench.model(name) if name in ALL_SIZES else GPT2(hparams, random_weights(hparams), name=name)
        drafts[name] = full
        drafts.update({f"{name}, N={n}": restrict(full, n) for n in n_list})
    models = {**drafts, **{t: bench.model(t) for t in targets}}
    caches = {k: filled_cache(m, VERIFY_CTX, bench.rng) for k, m in models.items()}
    calls = {k: (lambda k=k: models[k].forward([TOKEN], caches[k], last_only=True)) for k in models}
    times = bench.time(calls, after=lambda k: caches[k].rollback(VERIFY_CTX))
    ms = {k: stats_ms(v)["median_ms"] for k, v in times.items()}
    res = {"step_ms": ms, "c": {t: {d: ms[d] / ms[t] for d in drafts} for t in targets}}
    bench.results["restricted"] = res
    table(bench.out, "restricted: draft steps with an LM head over only the N most frequent tokens",
          f"ms per 1-token step at n_past={VERIFY_CTX}; c = draft step / target step (interleaved, medians)",
          ["draft", "step ms", *(f"c for {t}" for t in targets)],
          [[d, ms[d], *(res["c"][t][d] for t in targets)] for d in drafts])  # fmt: skip


def section_exact(bench: Bench) -> None:
    """What the exact-greedy option costs: the target in float64 (GPT2.astype), step and r(5)."""
    rows = []
    for size in bench.args.sizes:
        models = {"float32": bench.model(size), "float64": bench.model(size).astype(np.float64)}
        caches = {k: filled_cache(m, VERIFY_CTX, bench.rng) for k, m in models.items()}
        calls = {(k, m): (lambda k=k, m=m: models[k].forward([TOKEN] * m, caches[k])) for k in models for m in (1, 5)}
        times = bench.time(calls, after=lambda key: caches[key[0]].rollback(VERIFY_CTX))
        t = {key: stats_ms(v)["median_ms"] for key, v in times.items()}
        res = {k: {"step_ms": t[k, 1], "pass5_ms": t[k, 5], "r5": t[k, 5] / t[k, 1]} for k in models}
        bench.results.setdefault("exact", {})[size] = res
        rows += [[size, k, res[k]["step_ms"], res[k]["r5"], res[k]["step_ms"] / res["float32"]["step_ms"]] for k in models]
    table(bench.out, "exact: the target in float64 (GPT2.astype(np.float64)), without float32's near-tie caveat",
          f"1-token step and r(5) at n_past={VERIFY_CTX}, medians", ["size", "dtype", "step ms", "r(5)", "step / float32"],
          rows)  # fmt: skip


# ---------------------------------------------------------------------------
# The command line.
# ---------------------------------------------------------------------------

SECTION_FUNCTIONS = {"decode": section_decode, "verify": section_verify, "kernel": section_kernel,
                     "predict": section_predict, "restricted": section_restricted, "exact": section_exact,
                     "drafters": section_drafters, "costcheck": section_costcheck, "overhead": section_overhead, "io": section_io}  # fmt: skip


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
    p = flags.Parser(prog="python -m specdec.bench --only <speed sections>", description=paragraphs[0],
                                epilog="\n\n".join(x for x in paragraphs if x.startswith(("Commands", "Sections"))),
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add = p.add_argument
    add("--sizes", type=_csv(str, ALL_SIZES, SIZES), help="model shapes to time, from 124M, 355M, 774M, 1558M "
        "(default 124M,355M)")  # fmt: skip
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
    add("--write-checkpoints", metavar="DIR", help="instead of timing: write random-weight checkpoints of --sizes "
        "into DIR/<size>/ with the tokenizer files from --tokenizer, so main.py --models_dir DIR runs offline")
    add("--tokenizer", metavar="DIR", default="../shared/gpt2-tokenizer",
        help="folder with GPT-2's vocab.json and merges.txt, for --write-checkpoints (default: %(default)s)")
    add("--rss-child", nargs=2, metavar=("DRAFT_DIR", "TARGET_DIR"), help=argparse.SUPPRESS)
    add("--rss-tokens", type=int, default=20, help=argparse.SUPPRESS)  # fmt: skip
    args = p.parse_args(argv)

    quick = args.quick
    args.sizes = sorted(dict.fromkeys(args.sizes or (["tiny", "tiny2"] if quick else ["124M", "355M"])),
                        key=lambda s: step_bytes(ALL_SIZES[s]))  # fmt: skip
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
    env = {"python": platform.python_version(), "numpy": np.__version__, "machine": platform.machine(),
           "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
           "env_vars": {k: v for k, v in sorted(os.environ.items())
                        if k.startswith(("OPENBLAS_", "OMP_", "MKL_"))}}  # fmt: skip
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
    bench.results["settings"] = {"sizes": args.sizes, "sections": args.only, "repeats": args.repeats,
                                 "contexts": args.contexts, "nocache_repeats": args.nocache_repeats,
                                 "quick": args.quick, "seed": args.seed, "pairs": [list(p) for p in args.pairs],
                                 "kv_cache_fill": "random K/V, cache.length set directly"}  # fmt: skip
    bench.say(f"specdec.bench: numpy {env['numpy']}, BLAS {env['blas']}, {env['cpus']} CPUs, Python {env['python']} "
              f"{env['machine']}; {env['env_vars'] or 'no OPENBLAS_* / OMP_* / MKL_* set'}")  # fmt: skip
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
            Path(args.json).write_text(text + "\n")
            bench.say(f"wrote {args.json}")
    return bench.results
