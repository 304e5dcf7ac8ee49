"""A real model on this machine: step time and r(m) beside GPT-2 124M's shape, and what each drafter costs.

    python -m specdec.bench --only real                                   # SmolLM2-135M-Instruct
    python -m specdec.bench --only real --target smollm2-135m --drafts ngram,early_exit:15,early_exit:29

What it adds over the speed sections (random GPT-2-shaped weights): the model a
user actually runs. Two tables:
    step     ms per 1-token step at context 256 and r(m) = time(m new tokens) /
             time(1), m = 1..9, for the target and for random weights of GPT-2
             124M's shape, every pass interleaved with the others (timing.py), so
             the two columns saw the same machine load
    floor    each step beside the least time this machine can take to read the
             step's float32 weights once: weights x 4 bytes / the bandwidth of a
             matrix-vector product over a matrix far larger than the caches,
             measured in the same interleaved run
    drafters c = one draft step / one target step, for each drafter, measured by
             timing.measure_costs on the first prompt of the suite
    exits    how often the first L layers (then the final norm and LM head) pick
             the full model's greedy token, along the full model's own greedy
             reply to a chat request: early exit's acceptance at temperature 0
Acceptance (alpha, tau) and wall-clock speedups per drafter and prompt category
come from the suite section on the same target:
    python -m specdec.bench --only suite --target smollm2-135m --drafts ngram,early_exit:29 --temperature 0
A script that prints numbers, not a test.
"""

from __future__ import annotations

import os
import statistics
import sys

import numpy as np

from ..cli import flags
from ..autoregressive import autoregressive_sample
from ..checkpoints.download import DownloadError
from ..checkpoints.load import load_model
from ..checkpoints.settings import default_models_dir
from ..drafters import make_drafter
from ..drafters.specs import parse_draft
from ..model.fast import tuning
from ..model.linear import Linear
from ..model.shapes import random_model
from ..config import check_request
from ..timing import measure_costs, pass_calls, time_calls
from .progress import Progress, add_quiet
from .prompts import load_prompts

M_MAX = 9
CONTEXT = 256
STREAM_BYTES = 512 << 20  # the bandwidth probe's matrix: 16x a 32 MB L3 cache, so every pass reads RAM
EXIT_PROMPT = "Explain to a ten-year-old why the sky is blue."


def weights_read(model) -> int:
    """Weights one decoding step reads: every block's matrices and the LM head (norms and biases left out)."""
    w = model.weights
    blocks = sum(v.w_t.size for block in w.blocks for v in vars(block).values() if isinstance(v, Linear))
    return blocks + w.lm_head.w_t.size


def stream_call():
    """A call that reads STREAM_BYTES of float32 weights once (np.dot: OpenBLAS's matrix-vector product on
    every core), and the bytes it reads."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((STREAM_BYTES // 4096, 1024), dtype=np.float32)  # [rows, 1024]
    x = rng.standard_normal(1024, dtype=np.float32)
    return (lambda: np.dot(w, x)), w.nbytes


def step_table(models: dict, repeats: int) -> dict:
    """{name: {"step_ms": (median, min, max), "r": [r(1), ..], "floor_ms": .., "weights": ..}, "bandwidth": GB/s}:
    all models' passes and the bandwidth probe interleaved in one run."""
    calls, afters = {}, {}
    for name, model in models.items():
        cache = model.new_cache()
        model.forward(list(range(1, CONTEXT + 1)), cache)  # a real context of CONTEXT tokens
        passes, rollback = pass_calls(model, cache, range(1, M_MAX + 1), token=5)
        for m, call in passes.items():
            calls[(name, m)] = call
            afters[(name, m)] = rollback
    calls["stream"], stream_bytes = stream_call()
    times = time_calls(calls, repeats, after=lambda key: afters[key](key) if key in afters else None)
    bandwidth = stream_bytes / float(np.median(times["stream"]))  # bytes per second
    out = {"bandwidth": bandwidth / 1e9}
    for name, model in models.items():
        t1 = np.asarray(times[(name, 1)])
        weights = weights_read(model)
        out[name] = {
            "step_ms": (1e3 * float(np.median(t1)), 1e3 * float(t1.min()), 1e3 * float(t1.max())),
            "r": [float(np.median(np.asarray(times[(name, m)]) / t1)) for m in range(1, M_MAX + 1)],
            "weights": weights,
            "floor_ms": 1e3 * 4 * weights / bandwidth,
        }
    return out


def exit_agreement(target, layers, n_tokens: int = 120, text: str = EXIT_PROMPT) -> dict[int, float]:
    """{L: fraction of the reply's tokens that the first L layers' argmax predicts}, at temperature 0.

    The full model writes its greedy reply to `text` (as a chat request on a chat model); one pass
    over prompt + reply per L then gives the early exit's argmax at every
    position, which is compared with the token the full model chose there.
    """
    special = getattr(target.tokenizer, "_special_tokens", {})
    chat = "<|im_start|>" in special  # a chat model gets the request as a user turn
    reply = autoregressive_sample(target, text, n_tokens, temperature=0.0, chat=chat).tokens
    ids = check_request(target, text, n_tokens, chat=chat) + reply  # the prompt, as the decode saw it
    start = len(ids) - len(reply)  # logits at position i predict token i + 1
    out = {}
    for n_layer in layers:
        logits = target.forward(ids, target.new_cache(len(ids)), n_layer=n_layer)
        guesses = logits[start - 1 : len(ids) - 1].argmax(axis=-1)
        out[n_layer] = float(np.mean(guesses == np.asarray(reply)))
    return out


def main(argv=None) -> dict:
    p = flags.Parser(prog="python -m specdec.bench --only real", description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="smollm2-135m", help="a model name, folder or GGUF file (default %(default)s)")
    p.add_argument(
        "--drafts",
        "--draft",
        default="ngram,early_exit:8,early_exit:15,early_exit:22,early_exit:29",
        help="comma-separated drafters: ngram, early_exit:L, eagle, heads by folder, draft models by "
        "name (default %(default)s)",
    )
    p.add_argument("--repeats", type=int, default=15, help="interleaved repeats per pass (default %(default)s)")
    p.add_argument(
        "--exit-layers",
        "--exit_layers",
        default="4,8,12,16,20,24,26,28,29",
        help="early-exit layers whose greedy agreement to measure ('' for none; default %(default)s)",
    )
    add_quiet(p)
    args = p.parse_args(argv)
    progress = Progress("real", args.quiet)
    try:  # every model and drafter is found and checked before minutes of timing
        target = load_model(args.target)
        drafters = {
            spec: make_drafter(load_model(spec) if parse_draft(spec).kind == "model" else spec, target)
            for spec in args.drafts.split(",")
        }  # built once: a head file is read once
    except (ValueError, OSError, DownloadError) as e:  # (CheckpointError is a ValueError)
        print(f"python -m specdec.bench: error: {e}", file=sys.stderr)
        sys.exit(2)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"target {target!r}; load average {load:.2f} at the start")

    gpt2 = "GPT-2 124M shape (random)"
    progress(f"step and r(m) of {args.target} and a 124M shape, and this machine's bandwidth, {args.repeats} repeats")
    shaped = random_model("124M")
    tuning.tune(shaped, default_models_dir())  # the product paths load_model gives a loaded model
    steps = step_table({args.target: target, gpt2: shaped}, args.repeats)
    bandwidth = steps.pop("bandwidth")
    print(
        f"\n| model | step ms at ctx {CONTEXT} (median, min-max) | "
        + " | ".join(f"r({m})" for m in range(2, M_MAX + 1))
        + " |"
    )
    print("|---" * (M_MAX + 1) + "|")
    for name, row in steps.items():
        med, lo, hi = row["step_ms"]
        print(f"| {name} | {med:.1f} ({lo:.1f}-{hi:.1f}) | " + " | ".join(f"{r:.2f}" for r in row["r"][1:]) + " |")
    print(
        f"\nthe floor: this machine streams float32 weights at {bandwidth:.1f} GB/s (np.dot over a "
        f"{STREAM_BYTES >> 20} MB matrix, interleaved with the steps above)"
    )
    print("| model | weights per step | floor ms (weights x 4 B / bandwidth) | step ms | step / floor |")
    print("|---|---|---|---|---|")
    for name, row in steps.items():
        step = row["step_ms"][0]
        print(
            f"| {name} | {row['weights'] / 1e6:.1f}M | {row['floor_ms']:.1f} | {step:.1f} | "
            f"{step / row['floor_ms']:.2f} |"
        )
    print(
        f"{args.target} step / GPT-2 124M-shape step: {steps[args.target]['step_ms'][0] / steps[gpt2]['step_ms'][0]:.2f}"
    )

    prompt = target.tokenizer.encode(next(iter(load_prompts().values()))[0])
    print("\n| drafter | c = draft step / target step | draft step ms |")
    print("|---|---|---|")
    costs = {}
    for spec, drafter in drafters.items():
        progress(f"c of drafter {spec}")
        c = measure_costs(target, drafter, prompt, m_max=2, repeats=args.repeats)
        costs[spec] = {"c": c.c, "draft_step_ms": 1e3 * c.draft_step, "target_step_ms": 1e3 * c.target_step}
        print(f"| {spec} | {c.c:.3f} | {1e3 * c.draft_step:.2f} |")
    layers = [int(x) for x in args.exit_layers.split(",") if x.strip()]
    if layers:
        progress(f"early-exit agreement at layers {args.exit_layers}")
    agreement = exit_agreement(target, layers) if layers else {}
    if agreement:
        print(
            f"\nearly exit at temperature 0: the first L of {target.n_layer} layers against the full model's greedy reply"
        )
        print("| L | " + " | ".join(str(n) for n in agreement) + " |")
        print("|---" * (len(agreement) + 1) + "|")
        print("| agreement | " + " | ".join(f"{a:.2f}" for a in agreement.values()) + " |")
    end = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\nload average {end:.2f} at the end; {statistics.median([load, end]):.2f} in between, roughly")
    return {
        "steps": steps,
        "bandwidth_gb_s": bandwidth,
        "costs": costs,
        "exit_agreement": agreement,
        "load": (load, end),
    }
