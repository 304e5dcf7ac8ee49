"""Two checkouts of specdec timed against each other, interleaved: a code change that should cost nothing, checked.

    python docs/measure/ab_speed.py --a PATH_TO_CHECKOUT_A --b PATH_TO_CHECKOUT_B [--rounds 3]

Each round runs this file once per checkout (A B, then B A, ...), each run a fresh process that imports that
checkout's specdec (PYTHONPATH) and times, in one process:
    step      ms per 1-token step of SmolLM2-135M (memory-bound) at a 64-token context
    r(m)      a pass over m = 2, 3, 5, 9 tokens over the 1-token step (interleaved, median of ratios)
    gpt2      ms per 1-token step of GPT-2 124M's shape (random weights), context 64
    stdlib    ms per 1-token step of the shipped stdlib-6L (small: Python overhead shows here)
    round     seconds for 48 greedy tokens of speculative decoding, SmolLM2 with prompt lookup, K=4
The table gives each figure's median over rounds per checkout, their spread, and B / A. Only APIs both old and
new checkouts have are used (load_model, forward, new_cache, speculative_sample, random_model).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPEATS = 21


def measure() -> dict:
    import numpy as np

    import specdec

    def step_ms(model, context: int = 64, m: int = 1) -> list[float]:
        cache = model.new_cache()
        model.forward(list(range(10, 10 + context)), cache)
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            model.forward([7] * m, cache)
            times.append((time.perf_counter() - start) * 1e3)
            cache.rollback(context)
        return times

    out = {}
    smol = specdec.load_model("smollm2-135m", progress=False)
    step_ms(smol)  # warm
    ms = {m: [] for m in (1, 2, 3, 5, 9)}
    for _ in range(3):  # interleaved blocks of repeats, every m alike
        for m in ms:
            ms[m] += step_ms(smol, m=m)
    out["step"] = statistics.median(ms[1])
    for m in (2, 3, 5, 9):
        out[f"r({m})"] = statistics.median(a / b for a, b in zip(ms[m], ms[1]))
    gpt2 = specdec.random_model("124M")
    step_ms(gpt2)
    out["gpt2"] = statistics.median(step_ms(gpt2))
    small = specdec.load_model("stdlib-6L", progress=False)
    step_ms(small)
    out["stdlib"] = statistics.median(step_ms(small))
    prompt = "Repeat this sentence twice: The meeting is moved to Thursday at ten in the small room."
    ids = smol.tokenizer.encode(prompt)
    specdec.speculative_sample(smol, "ngram", ids, 8, K=4)
    rounds = []
    for _ in range(3):
        start = time.perf_counter()
        specdec.speculative_sample(smol, "ngram", ids, 48, K=4)
        rounds.append(time.perf_counter() - start)
    out["round"] = statistics.median(rounds)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", help="checkout A (its folder holds specdec/)")
    ap.add_argument("--b", help="checkout B")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--measure", action="store_true", help="(internal) time this process's specdec, print JSON")
    a = ap.parse_args()
    if a.measure:
        print(json.dumps(measure()))
        return
    runs = {"A": [], "B": []}
    for r in range(a.rounds):
        for side in ("A", "B") if r % 2 == 0 else ("B", "A"):
            env = {**os.environ, "PYTHONPATH": a.a if side == "A" else a.b}
            done = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--measure"],
                env=env,
                cwd="/",
                capture_output=True,
                text=True,
                check=True,
            )
            runs[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {side}: {runs[side][-1]}  (load {os.getloadavg()[0]:.1f})", flush=True)
    print(f"{'figure':<8} {'A median [min-max]':>24} {'B median [min-max]':>24} {'B / A':>7}")
    for key in runs["A"][0]:
        va, vb = [x[key] for x in runs["A"]], [x[key] for x in runs["B"]]
        ma, mb = statistics.median(va), statistics.median(vb)
        print(
            f"{key:<8} {ma:10.3f} [{min(va):.3f}-{max(va):.3f}] {mb:10.3f} [{min(vb):.3f}-{max(vb):.3f}] {mb / ma:7.3f}"
        )


if __name__ == "__main__":
    main()
