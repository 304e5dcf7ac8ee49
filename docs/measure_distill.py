"""Reply tokens per second of `specdec.train data` at several batch sizes (docs/distill.md, Throughput).

    SPECDEC_HOME=... python docs/measure_distill.py --steps 24 --batches 8 16 32
    SPECDEC_HOME=... python docs/measure_distill.py --features 8 220

For each B: the first B requests of the pool (seed 0), half greedy, half sampled
at T=1, decoded by distill.answer for --steps passes (the first pass is the
prompts' prefill; no row stops early), with top-8 labels as in a real run.
Prints wall-clock and process CPU seconds (CPU time is less sensitive to other
processes on the machine than wall time) and the load average. --features R N
times features.layer_states instead: R rows of N random tokens, teacher-forced,
for the last layer and for EAGLE-3's four.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from specdec.checkpoints.load import load_model
from specdec.model.tokenizer import chat_prompt
from specdec.sampling import SamplingParams
from specdec.train.distill import Reply, answer
from specdec.train.features import eagle3_layers, layer_states
from specdec.train.requests import build_requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--features", type=int, nargs=2, metavar=("ROWS", "TOKENS"))
    args = parser.parse_args()
    model = load_model(args.model, progress=False)
    if args.features:
        n_rows, n_tokens = args.features
        rng = np.random.default_rng(0)
        rows = [rng.integers(0, model.n_vocab, n_tokens) for _ in range(n_rows)]
        for layers in ([model.n_layer], eagle3_layers(model.n_layer)):
            load, wall, cpu = os.getloadavg()[0], time.perf_counter(), time.process_time()
            layer_states(model, rows, layers)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            print(
                f"layers {layers}: {n_rows * n_tokens} tokens  {wall:6.1f} s wall  {cpu:6.1f} s CPU  "
                f"{n_rows * n_tokens / cpu:5.0f} tokens per CPU-second  load {load:.1f}",
                flush=True,
            )
        return
    pool = build_requests(0)
    for batch in args.batches:
        rows = [
            Reply(chat_prompt(model.tokenizer, pool.requests[i]), i % 2 == 0, np.random.default_rng(i))
            for i in range(batch)
        ]
        load, wall, cpu = os.getloadavg()[0], time.perf_counter(), time.process_time()
        answer(model, rows, args.steps, batch, 8, SamplingParams(temperature=1.0), stop=None)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        n = sum(len(r.tokens) for r in rows)
        print(
            f"B={batch:3d}  {n} tokens  {wall:6.1f} s wall  {cpu:6.1f} s CPU  {n / wall:5.1f} tokens/s  "
            f"{n / cpu:5.1f} tokens per CPU-second  load {load:.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
