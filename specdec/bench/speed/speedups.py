"""What speculation buys on the clock: predict, drafters, costcheck and overhead sections.

predict: the cost model fed with the measured costs; drafters: speculative decoding with
model-free drafters against autoregressive decoding, wall clock; costcheck: the cost model's
prediction against the wall clock; overhead: the speculative sampler's own time per round.
"""

from __future__ import annotations

import time

import numpy as np

from ... import costmodel
from ...autoregressive import autoregressive_sample
from ...costmodel import AdaptiveK
from ...speculative import speculative_sample
from .common import ALL_SIZES, Bench, stats_ms, step_bytes, table
from .passes import decode_ms, verify_r

ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)  # the acceptance rates predict tabulates
K_MAX = 8  # predict's best K is searched in 1..K_MAX


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
        res = {
            "draft": draft,
            "target": target,
            "draft_step_ms": t_draft,
            "target_step_ms": t_target,
            "c": c,
            "r": r,
            "draft_source": draft_how,
            "target_source": target_how,
            "rows": [],
        }
        rows = []
        for alpha in ALPHAS:
            k, s = costmodel.best_k(alpha, c, r, K_MAX)  # measured r(m)
            k1, s1 = costmodel.best_k(alpha, c, None, K_MAX)  # the paper's r = 1 (GPU-like)
            grid = {str(kk): costmodel.predicted_speedup(alpha, kk, c, r) for kk in range(1, K_MAX + 1)}
            res["rows"].append(
                {"alpha": alpha, "best_k": k, "speedup": s, "best_k_r1": k1, "speedup_r1": s1, "speedup_by_k": grid}
            )
            rows.append([alpha, k, s, k1, s1])
        bench.results.setdefault("predict", {})[f"{draft}->{target}"] = res
        if draft_how != "measured" or target_how != "measured":
            bench.say(f"\nNOTE {draft}->{target}: {draft} {draft_how}; {target} {target_how}")
        table(
            bench.out,
            f"predict: {draft} -> {target}, c = {t_draft:.3g} / {t_target:.3g} ms = {c:.3g}",
            "best K in 1..8 (0 = don't speculate) and its predicted speedup (Leviathan et al. eq. 1 over "
            "k c + r(k+1)), with measured r(m) and with r = 1",
            ["alpha", "best K", "speedup", "best K r=1", "speedup r=1"],
            rows,
        )


# ---------------------------------------------------------------------------
# drafters: speculative decoding with model-free drafters, wall clock.
# ---------------------------------------------------------------------------


def section_drafters(bench: Bench) -> None:
    size, model, prompt = bench.smallest_with_prompt()
    n = bench.args.drafter_tokens
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
        entry = {
            "seconds": stats_ms(times[name]),
            "speedup": float(base / wall),
            "tau": result.tau,
            "target_calls": result.target_calls,
            "draft_calls": result.draft_calls,
            "alpha": result.alpha,
            "identical_to_autoregressive": result.tokens == reference,
        }
        res["runs"][name] = entry
        rows.append(
            [
                name,
                wall,
                entry["speedup"],
                entry["tau"],
                entry["alpha"],
                result.draft_calls,
                entry["identical_to_autoregressive"],
            ]
        )
    res["distinct_tokens"] = len(set(reference))
    bench.results["drafters"] = res
    table(
        bench.out,
        f"drafters: greedy speculative decoding on {size}, {n} tokens after an 8-token random prompt",
        f"wall-clock (median of {bench.args.drafter_repeats}) vs autoregressive; tau = tokens per round "
        f"(= per target pass, the prompt's prefill apart), alpha = accepted / judged drafts; the text has {res['distinct_tokens']} distinct tokens",
        ["run", "seconds", "speedup", "tau", "alpha", "draft calls", "same tokens"],
        rows,
    )


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
    from ...race import race
    from ...timing import measure_costs

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
        entry = {
            "target": target_size,
            "draft": draft,
            "K": k,
            "alpha": out.alpha,
            "tau": out.tau,
            "c": c,
            "r": r,
            "target_step_ms": costs.target_step * 1e3,
            "measured_speedup": measured,
            "predicted_eq1": eq1,
            "predicted_from_rounds": from_rounds,
            "error_eq1": eq1 / measured - 1,
            "error_from_rounds": from_rounds / measured - 1,
            "identical_tokens": report.texts_identical,
            "outside_passes": spec.sampler_seconds / spec.seconds,
            "passes_vs_predicted": spec.verify_seconds / passes_predicted,
        }
        res["runs"].append(entry)
        rows.append(
            [
                target_size,
                draft,
                k,
                out.alpha,
                out.tau,
                c,
                r[k],
                measured,
                eq1,
                f"{entry['error_eq1']:+.0%}",
                from_rounds,
                f"{entry['error_from_rounds']:+.0%}",
                f"{entry['outside_passes']:.0%}",
                entry["passes_vs_predicted"],
            ]
        )
    errors = [abs(e["error_from_rounds"]) for e in res["runs"]]
    res["within_tolerance"] = sum(err <= COSTCHECK_TOLERANCE for err in errors)
    bench.results["costcheck"] = res
    table(
        bench.out,
        f"costcheck: predicted vs measured speedup, greedy, {n} tokens after an 8-token random prompt",
        f"measured = median of {bench.args.drafter_repeats} interleaved runs; c and r(K+1) timed at the run's mean "
        f"context; eq. 1 = Leviathan et al. from alpha; rounds = tokens / (draft steps x c + sum of r(k+1)) "
        f"over the run's rounds; {res['within_tolerance']} of {len(errors)} within "
        f"{COSTCHECK_TOLERANCE:.0%} (rounds); outside = the run's time outside forward passes and drafting; "
        f"passes = time in target passes / what r(m) predicts for them (prefill included)",
        [
            "target",
            "draft",
            "K",
            "alpha",
            "tau",
            "c",
            "r(K+1)",
            "measured",
            "eq. 1",
            "eq. 1 error",
            "rounds",
            "rounds error",
            "outside",
            "passes",
        ],
        rows,
    )


# ---------------------------------------------------------------------------
# overhead: the sampler's own time.
# ---------------------------------------------------------------------------


def section_overhead(bench: Bench) -> None:
    size, model, prompt = bench.smallest_with_prompt()
    n = bench.args.overhead_tokens
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
            runs.append(
                {
                    "wall_s": wall,
                    "forward_s": in_forward[0],
                    "rounds": result.rounds,
                    "overhead_fraction": (wall - in_forward[0]) / wall,
                }
            )
    finally:
        del model.forward
    median = sorted(runs, key=lambda r: r["overhead_fraction"])[len(runs) // 2]
    round_ms, forward_ms = (median[key] / median["rounds"] * 1e3 for key in ("wall_s", "forward_s"))
    res = {
        "size": size,
        "n_tokens": n,
        "K": 4,
        "temperature": 1.0,
        "runs": runs,
        "overhead_fraction": float(np.median([r["overhead_fraction"] for r in runs])),
        "round_ms": round_ms,
        "overhead_ms_per_round": round_ms - forward_ms,
    }
    bench.results["overhead"] = res
    table(
        bench.out,
        f"overhead: speculative_sample's own time, {size} drafting for itself, K=4, T=1.0, {n} tokens",
        "wall time minus time inside model.forward (timer wrapped on the instance), per round (median run)",
        ["rounds", "round ms", "forward ms/round", "overhead ms/round", "overhead %"],
        [[median["rounds"], round_ms, forward_ms, round_ms - forward_ms, 100 * res["overhead_fraction"]]],
    )
