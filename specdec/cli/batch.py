"""`python -m specdec --batch N --prompt_file PATH`: N prompts decoded together by both batched decoders.

The decoders are batch.py's; this times them (timing.time_calls) and prints each row and the throughput.
"""

from __future__ import annotations

import json

import numpy as np

from ..batch import autoregressive_sample_batch, speculative_sample_batch
from ..race.render import jsonable
from ..timing import time_calls
from .terminal import shorten, visible


def run_batch(args, target, draft, draft_label: str) -> int:
    """--batch N: the file's N prompts decoded together by both batched decoders, each run `--repeats`
    times, interleaved (timing.time_calls, after one untimed run each); every row's text and record,
    and tokens per second over the batch (prefill included)."""
    n, prompts = args.n_tokens_to_generate, args.prompts  # text: the samplers encode (or wrap) each one
    settings = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed, chat=args.chat)
    outs, calls = {}, {}
    if args.only in (None, "autoregressive"):
        calls["autoregressive"] = lambda: outs.__setitem__(
            "autoregressive", autoregressive_sample_batch(target, prompts, n, **settings)
        )
    if args.only in (None, "speculative"):
        calls["speculative"] = lambda: outs.__setitem__(
            "speculative",
            speculative_sample_batch(target, draft, prompts, n, K=args.K, verification=args.verification, **settings),
        )
    seconds = {name: [float(t) for t in ts] for name, ts in time_calls(calls, args.repeats).items()}
    tokens = {name: sum(len(out.tokens) for out in results) for name, results in outs.items()}
    throughput = {name: tokens[name] / float(np.median(seconds[name])) for name in outs}
    speedup = (throughput["speculative"] / throughput["autoregressive"]) if len(outs) == 2 else None
    if args.json:
        rows = [{"prompt": p, **{name: outs[name][i].to_dict() for name in outs}} for i, p in enumerate(args.prompts)]
        out = {
            "settings": {
                "target": args.target_model_size,
                "draft": str(args.draft_spec),
                "K": args.K,
                "batch": args.batch,
                **settings,
                "repeats": args.repeats,
            },
            "rows": rows,
            "seconds": seconds,
            "tokens_per_second": throughput,
            "speedup": speedup,
        }
        print(json.dumps(jsonable(out), indent=2, allow_nan=False))
        return 0
    print(
        f"target: {args.target_model_size}; draft: {draft_label}; K={args.K}; batch of {args.batch} prompts from "
        f"{args.prompt_file}; {n} new tokens each; repeats {args.repeats}"
    )
    for i, prompt in enumerate(args.prompts):
        shown = outs.get("speculative", outs.get("autoregressive"))[i]
        print(f"\n── row {i + 1}: {shorten(prompt, 120)!r}")
        print(visible(shown.text) if shown.text is not None else shown.tokens)
        if "speculative" in outs:
            spec = outs["speculative"][i]
            same = (
                (
                    "; identical to autoregressive: "
                    + ("yes" if spec.tokens == outs["autoregressive"][i].tokens else "no")
                )
                if "autoregressive" in outs and args.temperature == 0
                else ""
            )
            print(f"   {spec.rounds} rounds, alpha {spec.alpha:.2f}, tau {spec.tau:.2f}{same}")
    print()
    for name in outs:
        ts = seconds[name]
        print(
            f"{name}: {throughput[name]:.1f} tokens/s over the batch (median of {len(ts)}: {np.median(ts):.2f} s, "
            f"{min(ts):.2f}-{max(ts):.2f} s)"
        )
    if speedup is not None:
        print(f"speedup of batched speculative decoding: {speedup:.2f}x (why it shrinks with the batch: docs/batch.md)")
    return 0
