"""A real model on this machine: step time and r(m) beside GPT-2 124M's shape, and what each drafter costs.

    python -m specdec.bench --only real                                   # SmolLM2-135M-Instruct
    python -m specdec.bench --only real --target smollm2-135m --drafts ngram,early_exit:15,early_exit:29

What it adds over the speed sections (random GPT-2-shaped weights): the model a
user actually runs. Two tables:
    step     ms per 1-token step at context 256 and r(m) = time(m new tokens) /
             time(1), m = 1..9, for the target and for random weights of GPT-2
             124M's shape, every pass interleaved with the others (timing.py), so
             the two columns saw the same machine load
    drafters c = one draft step / one target step, for each drafter, measured by
             timing.measure_costs on the first prompt of the suite
Acceptance (alpha, tau) and wall-clock speedups per drafter and prompt category
come from the suite section on the same target:
    python -m specdec.bench --only suite --target smollm2-135m --drafts ngram,early_exit:29 --temperature 0
A script that prints numbers, not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics

import numpy as np

from ..checkpoints.load import load_model
from ..model.shapes import random_model
from ..timing import measure_costs, pass_calls, time_calls
from .suite import load_prompts

M_MAX = 9
CONTEXT = 256


def step_table(models: dict, repeats: int) -> dict:
    """{name: {"step_ms": (median, min, max), "r": [r(1), ..]}}: all models' passes interleaved in one run."""
    calls, afters = {}, {}
    for name, model in models.items():
        cache = model.new_cache()
        model.forward(list(range(1, CONTEXT + 1)), cache)  # a real context of CONTEXT tokens
        passes, rollback = pass_calls(model, cache, range(1, M_MAX + 1), token=5)
        for m, call in passes.items():
            calls[(name, m)] = call
            afters[(name, m)] = rollback
    times = time_calls(calls, repeats, after=lambda key: afters[key](key))
    out = {}
    for name in models:
        t1 = np.asarray(times[(name, 1)])
        out[name] = {"step_ms": (1e3 * float(np.median(t1)), 1e3 * float(t1.min()), 1e3 * float(t1.max())),
                     "r": [float(np.median(np.asarray(times[(name, m)]) / t1)) for m in range(1, M_MAX + 1)]}  # fmt: skip
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m specdec.bench --only real", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False)  # fmt: skip
    p.add_argument("--target", default="smollm2-135m", help="a model name, folder or GGUF file (default %(default)s)")
    p.add_argument("--drafts", "--draft", default="ngram,early_exit:8,early_exit:15,early_exit:22,early_exit:29",
                   help="comma-separated drafters (default %(default)s)")  # fmt: skip
    p.add_argument("--repeats", type=int, default=15, help="interleaved repeats per pass (default %(default)s)")
    args = p.parse_args(argv)
    target = load_model(args.target)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"target {target!r}; load average {load:.2f} at the start")

    steps = step_table({args.target: target, "GPT-2 124M shape (random)": random_model("124M")}, args.repeats)
    print(f"\n| model | step ms at ctx {CONTEXT} (median, min-max) | " + " | ".join(f"r({m})" for m in range(2, M_MAX + 1)) + " |")
    print("|---" * (M_MAX + 1) + "|")
    for name, row in steps.items():
        med, lo, hi = row["step_ms"]
        print(f"| {name} | {med:.1f} ({lo:.1f}-{hi:.1f}) | " + " | ".join(f"{r:.2f}" for r in row["r"][1:]) + " |")

    prompt = target.tokenizer.encode(next(iter(load_prompts().values()))[0])
    print("\n| drafter | c = draft step / target step | draft step ms |")
    print("|---|---|---|")
    costs = {}
    for spec in args.drafts.split(","):
        c = measure_costs(target, spec, prompt, m_max=2, repeats=args.repeats)
        costs[spec] = {"c": c.c, "draft_step_ms": 1e3 * c.draft_step, "target_step_ms": 1e3 * c.target_step}
        print(f"| {spec} | {c.c:.3f} | {1e3 * c.draft_step:.2f} |")
    end = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\nload average {end:.2f} at the end; {statistics.median([load, end]):.2f} in between, roughly")
    return {"steps": steps, "costs": costs, "load": (load, end)}
