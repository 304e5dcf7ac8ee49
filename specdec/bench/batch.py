"""Batched decoding: throughput against batch size, and where speculation stops paying.

    python -m specdec.bench --only batch                          # 124M and 355M shapes, SmolLM2-135M; B = 1..16
    python -m specdec.bench --only batch --models 124M --batches 1,4 --tokens 16 --repeats 3
    python -m specdec.bench --only batch --json batch.json

For each model and batch size B (B prompts of different lengths, decoded greedily
together by batch.py):
    throughput  tokens per second over the batch, batched autoregressive vs batched
                speculative decoding (n-gram drafts, K fixed), the two interleaved
                `--repeats` times; median, and the spread (min-max) of the speedup
    costs       the pass curve: one pass over n_tok new tokens (spread over min(B, n_tok)
                rows) for n_tok on pass_grid(B), each timed --pass-samples times per
                repeat; from it T_B (one B-row, 1-token step), r_B(m) = a pass over B rows
                of m tokens / T_B, m = 1..max(9, K + 1), and c_B = one batched draft step
                / T_B; at the runs' mean context, interleaved with the runs themselves
                (timing.time_calls: every repeat times every call once, in a fresh order)
    model       the cost model for batches (costmodel/batches.py): eq. 1 from the run's alpha
                with c_B and r_B, the run's own rounds priced by their own sizes on the
                pass curve (speedup_from_batch_rounds), the best K per batch size, and the
                batch size where speculation stops paying: measured, by the rounds-priced
                prediction, and by eq. 1's best K

GPT-2 shapes run on random weights: a pass's time depends on the shapes only
(decoding is memory-bound: the time is reading the weights), not on their values;
acceptance does depend on the text, so alpha on random weights is the random model's
own. SmolLM2-135M runs its real weights (SPECDEC_HOME names the models folder) on
the prompt suite's text. A script that prints numbers, not a test.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import numpy as np

from .. import costmodel
from ..cli import flags
from .. import safe_io
from ..batch import BatchModelDraft, Row, autoregressive_sample_batch, speculative_sample_batch
from ..checkpoints.load import load_model
from ..drafters import NgramDrafter
from ..drafters.specs import parse_draft
from ..model.fast import kernels
from ..model.shapes import GPT2_SHAPES, random_model
from ..config import Request, check_request
from ..result import DecodeResult
from ..sampling import SamplingParams
from ..timing import time_calls
from .progress import Progress, add_quiet
from .prompts import load_prompts

M_MAX = 9  # r_B(m) for m = 1..9: K up to 8 for the best-K search
PROMPT_TOKENS = 48  # suite prompts are cut to their first 48 tokens
PROMPT_LENGTHS = (12, 20, 8, 16, 24, 10, 18, 14)  # random-weight prompts: ragged on purpose


def prompts_for(model, n: int, rng: np.random.Generator) -> list[list[int]]:
    """n prompts: the suite's text for a model with a tokenizer, else random ids of PROMPT_LENGTHS."""
    if model.tokenizer is not None:
        suite = [p for prompts in load_prompts().values() for p in prompts]
        # The first PROMPT_TOKENS tokens of each (their prefill is not timed, but it takes the bench's time).
        return [check_request(model, suite[i % len(suite)], 1)[:PROMPT_TOKENS] for i in range(n)]
    return [[int(t) for t in rng.integers(0, model.n_vocab, PROMPT_LENGTHS[i % len(PROMPT_LENGTHS)])] for i in range(n)]


def filled_caches(model, n_rows: int, n_past: int, rng: np.random.Generator, room: int = M_MAX) -> list:
    """n_rows caches holding n_past positions of random keys and values (attention's cost depends
    only on the length; bench/speed/common.py's filled_cache), with room for timed passes of `room` tokens."""
    caches = []
    for _ in range(n_rows):
        cache = model.new_cache()
        cache.reserve(n_past + room)
        shape = cache.k[:, :, :n_past].shape
        cache.k[:, :, :n_past] = rng.standard_normal(shape, dtype=np.float32)
        cache.v[:, :, :n_past] = rng.standard_normal(shape, dtype=np.float32)
        cache.length = n_past
        caches.append(cache)
    return caches


def draft_step_call(model, draft: str, prompts: list[list[int]]):
    """One batched draft step for every row, as the batch's drafter takes it (a call for time_calls)."""
    params = SamplingParams(0.0)
    rows = [
        Row(Request(p, 1, params), model.new_cache(), np.random.default_rng(0), DecodeResult(), index=i)
        for i, p in enumerate(prompts)
    ]
    spec = parse_draft(draft)
    if spec.kind == "ngram":
        drafters = [NgramDrafter(model.n_vocab, spec.arg) for _ in rows]
        return lambda: [d.propose(row.ids, 1, params, row.rng) for d, row in zip(drafters, rows)]
    if spec.kind != "early_exit":
        raise ValueError(f"the batch section drafts with ngram[:N] or early_exit:L, not {draft}")
    n_layer = spec.arg
    drafts = BatchModelDraft(model, n_layer=n_layer)
    drafts.begin(rows)
    for row in rows:  # a real context in each row's cache, then one drafted token per call
        model.forward(row.prompt[:-1], row.cache)
    return lambda: drafts.propose(rows, [1] * len(rows), params)


def pass_grid(b: int, m_max: int = M_MAX) -> list[int]:
    """The token counts n_tok whose pass is timed at batch size b: b x m for m = 1..m_max (r_B(m)),
    fewer than b (the last rounds, after rows have left), and both sides of each of kernels.linear's
    switches (from stacked matrix-vector chunks to one product per part at MAX_CHUNKED_ROWS, to
    OpenBLAS's threaded product at MAX_SPLIT_ROWS), where a pass's price may jump, so that pricing a
    ragged round by interpolation never straddles one.

        pass_grid(4)   # [1, 2, 4, 8, 12, 16, 17, 20, 24, 28, 32, 36]
    """
    fewer = [n for n in (1, 2, 4, 8) if n < b]
    switch = [
        n for edge in (kernels.MAX_CHUNKED_ROWS, kernels.MAX_SPLIT_ROWS) for n in (edge, edge + 1) if n <= b * m_max
    ]
    return sorted({*fewer, *(b * m for m in range(1, m_max + 1)), *switch})


def spread(n_tok: int, b: int) -> list[int]:
    """n_tok new tokens over min(b, n_tok) rows, as evenly as possible: spread(10, 4) == [3, 3, 2, 2]."""
    rows = min(b, n_tok)
    return [n_tok // rows + (i < n_tok % rows) for i in range(rows)]


def cost_calls(model, draft: str, prompts, n_past: int, samples: int, rng, m_max: int = M_MAX) -> tuple[dict, object]:
    """Calls timing a pass over n_tok new tokens for every n_tok of pass_grid (keys (n_tok, j), `samples`
    of each per repeat) and one batched draft step ("draft"), B = len(prompts); and the `after` that rolls
    the caches back so every pass sees the same context."""
    b = len(prompts)
    caches = filled_caches(model, b, n_past, rng, room=m_max)
    calls = {}
    for n_tok in pass_grid(b, m_max):
        rows = spread(n_tok, b)
        for j in range(samples):
            calls[n_tok, j] = lambda rows=rows: model.forward_batch([[5] * m for m in rows], caches[: len(rows)])
    calls["draft"] = draft_step_call(model, draft, prompts)

    def rollback(key):
        for cache in caches:
            cache.rollback(n_past)

    return calls, rollback


def batch_costs(times: dict, b: int, m_max: int = M_MAX) -> dict:
    """From the interleaved timings (cost_calls' keys): the pass curve (n_tok grid, median seconds over
    every sample), T_B = its point at n_tok = B, and r_B(m) and c_B as ratios to T_B within each repeat
    (each pass's median over that repeat's samples), then the median over repeats, so a repeat that ran
    on a busier machine moves both sides of its ratios together."""
    samples: dict = {}  # {n_tok: [[seconds per repeat] per sample]}
    for key, seconds in times.items():
        if isinstance(key, tuple):  # (n_tok, sample); the other keys are the draft step and the runs
            samples.setdefault(key[0], []).append(seconds)
    grid = sorted(samples)
    per_repeat = {n: np.median(samples[n], axis=0) for n in grid}  # [repeats]: the median of each repeat's samples
    every_sample = {n: np.concatenate(samples[n]) for n in grid}
    t1 = per_repeat[b]
    return {
        "step": float(np.median(every_sample[b])),
        "r": [float(np.median(per_repeat[b * m] / t1)) for m in range(1, m_max + 1)],
        "c": float(np.median(np.asarray(times["draft"]) / t1)),
        "grid": grid,
        "pass_seconds": [float(np.median(every_sample[n])) for n in grid],
    }


def run_calls(model, draft, prompts, n_tokens: int, K: int) -> tuple[dict, object]:
    """Calls running batched autoregressive and speculative decoding of the same prompts ("auto", "spec"),
    and a function that summarises what they did (tokens checked equal).

    Only decoding is timed: the clock starts when the first pass (prefill included) has given every row
    its first token (autoregressive) or its first round (speculative), and the tokens counted are those
    emitted after that, so the prompts' prefill, the same for both, does not dilute the speedup.
    """
    b = len(prompts)
    rounds, outs, decode = [], {}, {"auto": [], "spec": []}  # decode[name]: (seconds, tokens) per call

    def spec():
        rounds.clear()
        marks = {}

        def on_round(record):
            if not rounds:
                marks["start"], marks["first"] = time.perf_counter(), sum(record.new_tokens)
            rounds.append(record)

        outs["spec"] = speculative_sample_batch(model, draft, prompts, n_tokens, K=K, on_batch_round=on_round)
        decode["spec"].append((time.perf_counter() - marks["start"], b * n_tokens - marks["first"]))

    def auto():
        marks = {"n": 0}

        def on_token(row, token, kind):
            marks["n"] += 1
            if marks["n"] == b:  # every row has its first token: the first pass is done
                marks["start"] = time.perf_counter()

        outs["auto"] = autoregressive_sample_batch(model, prompts, n_tokens, on_token=on_token)
        decode["auto"].append((time.perf_counter() - marks["start"], b * (n_tokens - 1)))

    def summary() -> dict:
        timed = {name: runs[1:] for name, runs in decode.items()}  # without time_calls' untimed warm-up call
        same = [a.tokens == s.tokens for a, s in zip(outs["auto"], outs["spec"])]
        results = outs["spec"]
        accepted = sum(r.accepted for r in results)
        judged = sum(sum(r.judged) for r in results)
        throughput = {name: np.asarray([n / t for t, n in runs]) for name, runs in timed.items()}
        ratios = throughput["spec"] / throughput["auto"]  # per repeat: the two ran in the same repeat
        return {
            "throughput_auto": float(np.median(throughput["auto"])),
            "throughput_spec": float(np.median(throughput["spec"])),
            "speedup": float(np.median(ratios)),
            "speedup_min": float(ratios.min()),
            "speedup_max": float(ratios.max()),
            "alpha": accepted / judged if judged else float("nan"),
            "tau": sum(len(r.tokens) for r in results) / max(1, sum(r.rounds for r in results)),
            "identical": all(same),
            "tokens_timed": {name: runs[-1][1] for name, runs in timed.items()},
            "rounds": [(len(r.rows), list(r.k), r.draft_passes) for r in rounds],
        }

    return {"auto": auto, "spec": spec}, summary


def load(name: str):
    if name == "tiny":  # a smoke test's model (tests/bench/test_bench.py)
        return random_model(n_layer=2, n_embd=64, n_head=4, n_vocab=512, n_ctx=256, scale=0.3)
    if name in GPT2_SHAPES:
        return random_model(name)  # random weights: times depend on the shapes only
    return load_model(name)


def main(argv=None) -> int:
    p = flags.Parser(prog="python -m specdec.bench --only batch", description=__doc__.splitlines()[0])
    p.add_argument("--models", default="124M,355M,smollm2-135m", help="GPT-2 shapes (random weights) or model names")
    p.add_argument("--batches", default="1,2,4,8,16", help="batch sizes (default 1,2,4,8,16)")
    p.add_argument("--tokens", type=flags.at_least_one, default=32, help="new tokens per prompt (default 32)")
    p.add_argument("--K", type=flags.at_least_one, default=4, help="draft tokens per round (default 4)")
    p.add_argument("--draft", default="ngram", help="ngram or early_exit:L (default ngram)")
    p.add_argument(
        "--repeats", type=flags.at_least_one, default=5, help="interleaved repeats of every run and pass (default 5)"
    )
    p.add_argument(
        "--pass-samples", type=flags.at_least_one, default=3, help="timings of each costing pass per repeat (default 3)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", metavar="PATH", help="also write every measurement as JSON")
    add_quiet(p)
    args = p.parse_args(argv)
    progress = Progress("batch", args.quiet)
    batches = [int(b) for b in args.batches.split(",")]
    rng = np.random.default_rng(args.seed)
    out = sys.stdout
    load_start = os.getloadavg()
    print(f"load average at start: {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}", file=out)
    m_max = max(M_MAX, args.K + 1)  # r_B(m) as far as a round's pass goes
    results = {"args": flags.settings(args), "load_start": load_start, "models": {}}
    for name in args.models.split(","):
        model = load(name)
        res = {}
        print(
            f"\n== batch: {name} ({model.name}), greedy, {args.tokens} tokens per prompt, draft {args.draft}, "
            f"K={args.K}",
            file=out,
            flush=True,
        )
        print(
            "|  B | AR tok/s | spec tok/s | speedup (min-max) | alpha | tau | T_B ms | c_B | r_B(2) | r_B(5) | "
            "r_B(9) | eq. 1 | rounds | rounds err | best K (pred.) | same |",
            file=out,
        )
        print("|---" * 16 + "|", file=out, flush=True)
        for b in batches:
            progress(f"{name}: batch size {b}, {args.repeats} interleaved repeats of both decoders and the passes")
            # Their own generator: the same prompts for a batch size whatever the repeats and samples drew.
            prompts = prompts_for(model, b, np.random.default_rng([args.seed, b]))
            n_past = int(statistics.mean(len(x) for x in prompts)) + args.tokens // 2  # the runs' mean context
            # Every pass timing and both decoders in one interleaved loop: each repeat runs each call once,
            # in a fresh order, so the costs and the runs they should predict saw the same machine load.
            passes, rollback = cost_calls(model, args.draft, prompts, n_past, args.pass_samples, rng, m_max)
            runs, summary = run_calls(model, args.draft, prompts, args.tokens, args.K)
            t = time_calls({**passes, **runs}, args.repeats, rng, after=lambda key: key in runs or rollback(key))
            costs, run = batch_costs(t, b, m_max), summary()
            # This batch size's own passes price its rounds, the last ones (after rows have left) included.
            times = costmodel.BatchPassTimes(
                {b: costs["step"]}, {b: costs["r"]}, {b: costs["c"]}, {b: (costs["grid"], costs["pass_seconds"])}
            )
            eq1 = costmodel.predicted_speedup(run["alpha"], args.K, costs["c"], costs["r"])
            # The timed part: every round but the first, against every autoregressive step but the first.
            timed = run["tokens_timed"]
            from_rounds = costmodel.speedup_from_batch_rounds(run["rounds"][1:], [b] * (args.tokens - 1), times)
            from_rounds *= timed["spec"] / timed["auto"]  # the two timed parts emit different numbers of tokens
            best_k, best_speedup = costmodel.best_k(run["alpha"], costs["c"], costs["r"])
            entry = {
                **costs,
                **run,
                "n_rounds": len(run["rounds"]),
                "predicted_eq1": eq1,
                "predicted_rounds": from_rounds,
                "error_rounds": from_rounds / run["speedup"] - 1,
                "error_eq1": eq1 / run["speedup"] - 1,
                "best_k": best_k,
                "best_k_speedup": best_speedup,
                "load": os.getloadavg()[0],
            }
            res[b] = entry
            r = costs["r"]
            print(
                f"| {b:2d} | {entry['throughput_auto']:.1f} | {entry['throughput_spec']:.1f} | "
                f"{run['speedup']:.2f} ({run['speedup_min']:.2f}-{run['speedup_max']:.2f}) | {run['alpha']:.2f} | "
                f"{run['tau']:.2f} | {1e3 * costs['step']:.1f} | {costs['c']:.3f} | {r[1]:.2f} | {r[4]:.2f} | "
                f"{r[8]:.2f} | {eq1:.2f} | {from_rounds:.2f} | {entry['error_rounds']:+.0%} | "
                f"{best_k} ({best_speedup:.2f}) | {'yes' if run['identical'] else 'NO'} |",
                file=out,
                flush=True,
            )
        measured_even = next((b for b in batches if res[b]["speedup"] < 1), None)
        best = {b: (res[b]["best_k"], res[b]["best_k_speedup"]) for b in batches}
        predicted_even = costmodel.batch_break_even(best)
        rounds_even = next((b for b in batches if res[b]["predicted_rounds"] < 1), None)
        errors = [abs(res[b]["error_rounds"]) for b in batches]
        print(
            f"speculation stops paying at B = {measured_even} (measured: first speedup < 1), "
            f"B = {rounds_even} (the rounds priced: first prediction < 1), "
            f"B = {predicted_even} (eq. 1: first best K = 0); rounds-priced prediction vs measured: "
            f"median |error| {statistics.median(errors):.0%}, {sum(e <= 0.15 for e in errors)} of {len(errors)} "
            f"within 15%",
            file=out,
            flush=True,
        )
        results["models"][name] = {
            "batches": res,
            "break_even_measured": measured_even,
            "break_even_predicted": predicted_even,
            "break_even_rounds": rounds_even,
            "median_error": statistics.median(errors),
        }
    load_end = os.getloadavg()
    results["load_end"] = load_end
    print(f"\nload average at end: {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}", file=out)
    if args.json:  # whole or not at all
        safe_io.write_file(args.json, json.dumps(results, indent=1, default=float).encode())
    return 0
