"""Speculative decoding on a trained model: the stdlib family on held-out code, offline.

What it adds over specdec.bench (random GPT-2-shaped weights, where only the
timings mean something): acceptance rates of *trained* drafters, and the
cost model fed with both.

Three tables:
  1. measured on the family: for each drafter (the stdlib-2L draft model, early
     exit after block 2 of stdlib-6L, n-gram prompt lookup) at T=0 and T=1,
     alpha (accepted / judged drafts), target tokens per verification pass, and
     the wall-clock speedup over autoregressive decoding of stdlib-6L, summed
     over held-out prompts (the first lines of functions from held-out files).
  2. the cost model on the family: c and r(k+1) measured on these tiny models,
     and the speedup the model predicts from them and the measured alpha.
  3. predicted for GPT-2 sizes: c and r(m) measured on GPT-2 124M (draft) and
     355M (target) *shapes* with random weights (timings depend only on shapes),
     early exit after 8 of 355M's 24 layers (the same third as 2 of 6), combined
     with alpha measured in table 1. Nothing here runs a trained GPT-2: it is
     what the cost model predicts if a GPT-2 pair accepted as often as the family.

Commands:
    python -m specdec.bench --only family               # the tables in docs/family.md (19 min at load 6-17 on 2 vCPUs)
    python -m specdec.bench --only family --prompts 8 --tokens 32 --no-gpt2   # a quicker look (4 min, same machine)
    python -m specdec.bench --only family --json family.json
"""

from __future__ import annotations

import json
import sys

import numpy as np

from .. import costmodel
from ..cli import flags
from .. import safe_io
from ..autoregressive import autoregressive_sample
from ..checkpoints import family
from ..checkpoints.load import load_model
from ..model.base import CausalLM
from ..model.gpt2 import GPT2, random_weights
from ..race.render import jsonable
from ..speculative import speculative_sample
from ..timing import measure_costs, time_calls
from .progress import Progress, add_quiet
from .speed.common import SIZES, table

GPT2_DRAFT, GPT2_TARGET = "124M", "355M"


def drafters(draft: CausalLM, early_exit_layer: int) -> dict:
    return {
        "draft model stdlib-2L": draft,
        f"early_exit:{early_exit_layer}": f"early_exit:{early_exit_layer}",
        "ngram": "ngram",
    }


def measure_family(target: CausalLM, draft: CausalLM, args, rng: np.random.Generator, progress: Progress) -> list[dict]:
    """Table 1: every drafter at each temperature over the same prompts, runs interleaved per prompt."""
    prompts = [target.tokenizer.encode(p["text"]) for p in family.prompts()[: args.prompts]]
    rows = []
    for temperature in (0.0, 1.0):
        totals = {
            name: {"accepted": 0, "judged": 0, "tokens": 0, "passes": 0, "seconds": 0.0}
            for name in ["autoregressive", *drafters(draft, family.EARLY_EXIT_LAYER)]
        }
        for i, ids in enumerate(prompts):
            progress(
                f"table 1: T={temperature:g}, prompt {i + 1} of {len(prompts)} (autoregressive and "
                f"{len(totals) - 1} drafters, {args.repeats} repeats each)"
            )
            runs = {
                "autoregressive": lambda ids=ids, i=i: autoregressive_sample(
                    target, ids, args.tokens, temperature=temperature, seed=args.seed + i
                )
            }
            for name, d in drafters(draft, family.EARLY_EXIT_LAYER).items():
                runs[name] = lambda ids=ids, i=i, d=d: speculative_sample(
                    target, d, ids, args.tokens, K=args.K, temperature=temperature, seed=args.seed + i
                )
            results = {}
            times = time_calls({n: (lambda n=n: results.__setitem__(n, runs[n]())) for n in runs}, args.repeats, rng)
            for name, out in results.items():  # every repeat of a run gives the same tokens (same seed)
                t = totals[name]
                t["seconds"] += float(np.median(times[name]))
                t["tokens"] += len(out.tokens)
                t["passes"] += out.rounds if name != "autoregressive" else len(out.tokens)
                t["accepted"] += out.accepted
                t["judged"] += sum(out.judged)
        base = totals["autoregressive"]["seconds"]
        for name, t in totals.items():
            if name == "autoregressive":
                continue
            alpha = t["accepted"] / t["judged"] if t["judged"] else float("nan")  # nan: nothing was drafted
            rows.append(
                {
                    "drafter": name,
                    "T": temperature,
                    "alpha": alpha,
                    "tau": t["tokens"] / t["passes"],
                    "speedup": base / t["seconds"],
                    "seconds": t["seconds"],
                    "autoregressive_seconds": base,
                }
            )
    return rows


def costs_of(target: CausalLM, drafters: dict, K: int, context: list[int]) -> tuple[dict, list[float]]:
    """({drafter name: c}, r(m) for m = 1..K+1), all measured after `context`."""
    r = measure_costs(target, None, context, m_max=K + 1, repeats=21).r
    return {name: measure_costs(target, d, context, m_max=1, repeats=21).c for name, d in drafters.items()}, r


def main(argv=None) -> dict:
    p = flags.documented("python -m specdec.bench --only family", __doc__)
    p.add_argument("--prompts", type=int, default=32, help="held-out prompts (default 32, at most 64)")
    p.add_argument("--tokens", type=int, default=64, help="new tokens per prompt (default 64)")
    p.add_argument("--K", type=int, default=4, help="draft tokens per round (default 4)")
    p.add_argument(
        "--repeats", type=int, default=3, help="timed runs of each decoder per prompt, median kept (default 3)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-gpt2", action="store_true", help="skip table 3 (it builds 124M/355M-shaped weights, ~2 GB)")
    p.add_argument("--json", metavar="PATH", help="also write every number as JSON to PATH")
    add_quiet(p)
    args = p.parse_args(argv)
    if not 1 <= args.prompts <= len(family.prompts()) or args.tokens < 1 or args.K < 1:
        p.error(f"--prompts must be 1..{len(family.prompts())}; --tokens and --K at least 1")
    rng = np.random.default_rng(args.seed)
    progress = Progress("family", args.quiet)
    target, draft = load_model(family.TARGET), load_model(family.DRAFT)
    out = sys.stdout
    res = {"args": flags.settings(args), "family": measure_family(target, draft, args, rng, progress)}

    table(
        out,
        f"1. measured on {family.TARGET}: {args.prompts} held-out prompts x {args.tokens} tokens, K={args.K}",
        "alpha = accepted / judged drafts; tau = tokens per round = per target pass (autoregressive: 1); "
        "wall-clock speedup",
        ["drafter", "T", "alpha", "tau", "speedup"],
        [[r["drafter"], r["T"], r["alpha"], r["tau"], r["speedup"]] for r in res["family"]],
    )

    # 2. The cost model on the family's own measured costs.
    progress("table 2: measuring c and r(m) on the family")
    context = target.tokenizer.encode(family.prompts()[0]["text"])
    cs, rm = costs_of(target, drafters(draft, family.EARLY_EXIT_LAYER), args.K, context)
    for r in res["family"]:
        c = cs[r["drafter"]]
        r.update(c=c, r_k1=rm[args.K], predicted=costmodel.predicted_speedup(r["alpha"], args.K, c, rm))
    table(
        out,
        "2. cost model on the family: c and r(K+1) measured on these models",
        "predicted = (1 - alpha^(K+1)) / (1 - alpha) / (K c + r(K+1)), Leviathan et al. section 3",
        ["drafter", "T", "alpha", "c", "r(K+1)", "predicted", "measured"],
        [[r["drafter"], r["T"], r["alpha"], r["c"], r["r_k1"], r["predicted"], r["speedup"]] for r in res["family"]],
    )

    if not args.no_gpt2:
        progress(f"table 3: building {GPT2_TARGET}- and {GPT2_DRAFT}-shaped random weights, measuring c and r(m)")
        big = GPT2(SIZES[GPT2_TARGET], random_weights(SIZES[GPT2_TARGET]), name=GPT2_TARGET)
        small = GPT2(SIZES[GPT2_DRAFT], random_weights(SIZES[GPT2_DRAFT]), name=GPT2_DRAFT)
        layer = SIZES[GPT2_TARGET].n_layer * family.EARLY_EXIT_LAYER // target.n_layer  # 8 of 24
        ctx = [int(t) for t in rng.integers(0, SIZES[GPT2_TARGET].n_vocab, 256)]
        # family drafter -> (the GPT-2 drafter in its place, what it is)
        gpt2_drafters = {
            "draft model stdlib-2L": (small, GPT2_DRAFT),
            f"early_exit:{family.EARLY_EXIT_LAYER}": (f"early_exit:{layer}", f"early_exit:{layer}"),
            "ngram": ("ngram", "ngram"),
        }
        cs, rm = costs_of(big, {name: d for name, (d, _) in gpt2_drafters.items()}, args.K, ctx)
        rows = []
        for r in res["family"]:
            c = cs[r["drafter"]]
            r.update(
                gpt2_drafter=gpt2_drafters[r["drafter"]][1],
                gpt2_c=c,
                gpt2_r_k1=rm[args.K],
                gpt2_predicted=costmodel.predicted_speedup(r["alpha"], args.K, c, rm),
            )
            rows.append([r["drafter"], r["gpt2_drafter"], r["T"], r["alpha"], c, rm[args.K], r["gpt2_predicted"]])
        table(
            out,
            f"3. predicted for GPT-2 {GPT2_TARGET}: measured c and r(K+1) on GPT-2 shapes (random weights, "
            f"context 256) x alpha measured in table 1",
            "a prediction, not a run of trained GPT-2 models (none are available offline)",
            ["family drafter", "GPT-2 drafter", "T", "alpha", "c", "r(K+1)", "predicted"],
            rows,
        )

    if args.json:
        safe_io.write_file(args.json, json.dumps(jsonable(res), indent=1).encode())
    return res
