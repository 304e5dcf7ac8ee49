"""The forward pass on the clock: decode, verify, kernel, restricted and exact sections.

decode: one KV-cached step and the same token without a cache; verify: the cost curve r(m) of a
pass over m new tokens; kernel: r(m) of each kind of weight matrix alone; restricted: c for drafts
whose LM head scores only the N most frequent tokens; exact: the target in float64.
"""

from __future__ import annotations

import numpy as np

from ...model.fast import kernels, threads
from ...model.gpt2 import F32, GPT2, HParams, random_weights
from ...model.fast.kernels import linear
from ...timing import pass_calls, verify_curve
from .common import ALL_SIZES, SIZES, TOKEN, VERIFY_CTX, VERIFY_M, Bench, cell, filled_cache, stats_ms, table

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
        calls = {
            ctx: (lambda s=s: model.forward(s, model.new_cache(len(s)), last_only=True)) for ctx, s in seqs.items()
        }
        nocache = bench.time(calls, bench.args.nocache_repeats)
        for ctx in bench.args.contexts:
            s, n = res[str(ctx)], stats_ms(nocache[ctx])
            s["nocache"] = n
            rows.append(
                [
                    size,
                    ctx,
                    s["median_ms"],
                    f"{cell(s['q1_ms'])}..{cell(s['q3_ms'])}",
                    n["median_ms"],
                    n["median_ms"] / s["median_ms"],
                ]
            )
        bench.results.setdefault("decode", {}).setdefault(size, {}).update(res)
    table(
        bench.out,
        "decode: one KV-cached step, and the same token without a KV cache",
        "ms per model.forward([tok], cache, last_only=True) with n_past tokens cached (median, IQR); "
        "no cache = a forward over all n_past tokens, as simple NumPy GPT-2s do",
        ["size", "n_past", "median ms", "IQR ms", "no cache ms", "x"],
        rows,
    )


# ---------------------------------------------------------------------------
# verify: the cost curve r(m) of a pass over m new tokens.
# ---------------------------------------------------------------------------


def measure_verify(bench: Bench, size: str) -> dict:
    """r(m) = t(m tokens, all m logit rows) / t(1 token) at context 256 (timing.verify_curve)."""
    calls, rollback = pass_calls(
        bench.model(size), filled_cache(bench.model(size), VERIFY_CTX, bench.rng), VERIFY_M, token=TOKEN
    )
    times = bench.time(calls, after=rollback)
    return {
        "context": VERIFY_CTX,
        "m": list(VERIFY_M),
        "r": verify_curve(times),
        "ms": [stats_ms(times[m]) for m in VERIFY_M],
    }


def verify_r(bench: Bench, size: str) -> list[float]:
    per_size = bench.results.setdefault("verify", {})
    if size not in per_size:
        per_size[size] = measure_verify(bench, size)
    return per_size[size]["r"]


def section_verify(bench: Bench) -> None:
    for size in bench.args.sizes:
        res = bench.results.setdefault("verify", {})[size] = measure_verify(bench, size)
        rows = [[m, res["ms"][i]["median_ms"], res["r"][i], res["r"][i] / m] for i, m in enumerate(res["m"])]
        table(
            bench.out,
            f"verify: cost curve r(m), {size}",
            f"one forward over m new tokens (all m logit rows) at n_past={VERIFY_CTX}, relative to m=1 "
            f"(median of within-repeat ratios; the paper assumes r=1)",
            ["m", "median ms", "r(m)", "r(m)/m"],
            rows,
        )


# ---------------------------------------------------------------------------
# kernel, restricted, exact: the few-token kernel per matrix, cheaper drafts, float64's cost.
# ---------------------------------------------------------------------------

DISTILGPT2 = HParams(n_vocab=50257, n_ctx=1024, n_embd=768, n_head=12, n_layer=6)  # distilbert/distilgpt2
RESTRICTED_N = (4096, 8192, 16384)  # draft vocabularies of the restricted section


def kernel_name() -> str:
    """How linear() multiplies a few rows on this machine (model/kernels.py's constants, model/threads.py)."""
    core = threads.BLAS.core if threads.BLAS else "not found"
    how = "stacks of small GEMMs" if kernels.SMALL_GEMM else "stacked matrix-vector chunks"
    return f"OpenBLAS kernels {core}; {kernels.SPLIT_PARTS} part(s) per matrix; {how}"


def section_kernel(bench: Bench) -> None:
    """r(m) of each kind of weight matrix alone. A timed call runs linear() over that matrix
    of every block, in order, as a forward pass meets them: none is still in cache."""
    for size in bench.args.sizes:
        w = bench.model(size).weights
        groups = {
            name: [getattr(b, name) for b in w.blocks]
            for name in ("attn_c_attn", "attn_c_proj", "mlp_c_fc", "mlp_c_proj")
        }
        groups["lm_head"] = [w.lm_head]
        res, rows = {}, []
        for name, lins in groups.items():
            xs = {m: bench.rng.standard_normal((m, lins[0].w_t.shape[1]), dtype=F32) for m in VERIFY_M}
            times = bench.time({m: (lambda m=m: [linear(xs[m], lin) for lin in lins]) for m in VERIFY_M})
            res[name] = {
                "weight_shape": list(lins[0].weight.shape),
                "matrices": len(lins),
                "m1": stats_ms(times[1]),
                "m": list(VERIFY_M),
                "r": verify_curve(times),
            }
            rows.append(
                [name, "x".join(map(str, lins[0].weight.shape)), res[name]["m1"]["median_ms"], *res[name]["r"][1:]]
            )
        bench.results.setdefault("kernel", {})[size] = res
        table(
            bench.out,
            f"kernel: r(m) per weight matrix, {size} ({kernel_name()})",
            "linear() over m rows, over that matrix in every block; median of within-repeat ratios to m = 1",
            ["matrix", "W", "m=1 ms", *(f"r({m})" for m in VERIFY_M[1:])],
            rows,
        )


def section_restricted(bench: Bench) -> None:
    """c = draft step / target step for drafts whose LM head scores only N tokens (restricted.py)."""
    from ...drafters.restricted import restrict

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
    table(
        bench.out,
        "restricted: draft steps with an LM head over only the N most frequent tokens",
        f"ms per 1-token step at n_past={VERIFY_CTX}; c = draft step / target step (interleaved, medians)",
        ["draft", "step ms", *(f"c for {t}" for t in targets)],
        [[d, ms[d], *(res["c"][t][d] for t in targets)] for d in drafts],
    )


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
        rows += [
            [size, k, res[k]["step_ms"], res[k]["r5"], res[k]["step_ms"] / res["float32"]["step_ms"]] for k in models
        ]
    table(
        bench.out,
        "exact: the target in float64 (GPT2.astype(np.float64)), without float32's near-tie caveat",
        f"1-token step and r(5) at n_past={VERIFY_CTX}, medians",
        ["size", "dtype", "step ms", "r(5)", "step / float32"],
        rows,
    )
