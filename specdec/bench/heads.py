"""What Medusa and EAGLE heads cost, on GPT-2-shaped random weights: draft cost c and training speed.

    python -m specdec.bench --only heads             # 124M and 355M shapes (355M has about 3x the weights)
    python -m specdec.bench --only heads --sizes 124M   # 6 min 14 s on 2 shared vCPUs at load average 10-13
    python -m specdec.bench --only heads-accept --target stdlib-6L --prompts-file P.json \
        --drafts medusa:DIR,eagle:DIR,stdlib-2L,early_exit:2,ngram   # acceptance on a trained model

Prints, per model shape (speed only: random weights, so nothing here says how
often drafts are accepted; acceptance is measured on trained models):
  - the target's one-token decode step, the unit of the cost model;
  - c, the cost of drafting relative to that step: Medusa (all heads at once,
    once per round), an EAGLE draft step, an EAGLE commit of 3 accepted
    positions; each over the full vocabulary and a restricted 8k one;
  - training throughput (positions/s) of one step of batch 8 x 64, and the
    self-distillation generation rate (one target decode step per position);
  - an estimate of the wall-clock time to train heads on 1M positions.

With --accept, on a trained target instead: for each drafter at T=0 and T=1,
alpha (accepted / judged drafts), tau (new tokens per round = per target
pass, prefill excluded), draft passes per round, and the wall-clock speedup over
autoregressive decoding summed over the prompts (chains; trees need the
sampler's tree round).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np

from ..cli import flags
from ..autoregressive import autoregressive_sample
from ..checkpoints.load import load_model
from ..drafters import eagle, eagle_grad, make_drafter, medusa
from ..drafters.heads import DraftVocab
from ..drafters.specs import parse_draft
from ..model.base import CausalLM
from ..model.gpt2 import GPT2, HParams, random_weights
from ..model.shapes import GPT2_SHAPES
from ..result import fmt
from ..sampling import SamplingParams
from ..speculative import speculative_sample
from ..timing import time_calls
from ..train.loop import eagle_step, medusa_step
from .progress import Progress, add_quiet

SHAPES = GPT2_SHAPES
RESTRICTED = 8192  # an 8k draft vocabulary (EAGLE-3 / FR-Spec use 32k for LLaMA-3's 128k)


def bench_shape(name: str, h: HParams, repeats: int, progress: Progress, context: int = 128) -> dict:
    """Draft costs (interleaved with target steps, so both see the same machine load) and training speed."""
    progress(f"{name} shape: building random weights, then the draft costs ({repeats} repeats)")
    rng = np.random.default_rng(0)
    target = GPT2(h, random_weights(h, seed=0), name=name)
    ids = list(rng.integers(0, h.n_vocab, context + 1))
    cache = target.new_cache()
    _, hidden = target.forward(ids[:-1], cache, return_hidden=True)
    params = SamplingParams(1.0)
    calls = {"target": lambda: target.forward([ids[-1]], cache, last_only=True)}
    rollbacks = {"target": lambda: cache.rollback(context)}
    for label, vocab in (("full", DraftVocab.of(target)), ("8k", DraftVocab.of(target, np.arange(RESTRICTED)))):
        m = medusa.MedusaDrafter(
            {
                "w": rng.standard_normal((4, h.n_embd, h.n_embd), np.float32) * 0.01,
                "b": np.zeros((4, h.n_embd), np.float32),
            },
            vocab,
        )
        m.commit(ids, hidden)
        calls[f"medusa4_{label}"] = lambda m=m: m.propose(ids, 4, params, rng)
        model = eagle.EagleModel(
            eagle_grad.init_params(h.n_embd, rng), h.n_embd, h.n_head, h.n_ctx, h.layer_norm_epsilon
        )
        e = eagle.EagleDrafter(model, vocab, target.weights.wte)
        e.commit(ids, hidden)  # the whole prompt's pairs
        # A chain of k tokens costs k-1 block passes and k LM heads: chain(5) - chain(1) is 4 draft steps.
        for k in (1, 5):
            calls[f"eagle{k}_{label}"] = lambda e=e, k=k: e.propose(ids, k, params, rng)
            rollbacks[f"eagle{k}_{label}"] = lambda e=e, n=e.cache.length: e.cache.rollback(n)
        calls[f"commit3_{label}"] = lambda e=e: e.commit(ids, hidden[-3:])  # 3 newly accepted positions
    times = time_calls(calls, repeats, after=lambda key: rollbacks.get(key, lambda: None)())
    med = {key: statistics.median(t) for key, t in times.items()}
    t_target = med["target"]
    out = {"target_step_ms": 1e3 * t_target, "generate_pos_per_s": 1 / t_target}
    for label in ("full", "8k"):
        out[f"c_medusa4_{label}"] = med[f"medusa4_{label}"] / t_target
        out[f"c_eagle_step_{label}"] = (med[f"eagle5_{label}"] - med[f"eagle1_{label}"]) / (4 * t_target)
        out[f"c_eagle_commit3_{label}"] = med[f"commit3_{label}"] / t_target

    # Training: one step over 8 sequences of 64 positions.
    progress(f"{name} shape: training steps ({max(1, repeats // 3)} repeats)")
    tokens = rng.integers(0, h.n_vocab, (8, 64))
    feats = rng.standard_normal((8, 64, h.n_embd), np.float32)
    mp, ep = medusa.init_params(4, h.n_embd), eagle_grad.init_params(h.n_embd, rng)
    steps = {}
    for label, vocab in (("full", DraftVocab.of(target)), ("8k", DraftVocab.of(target, np.arange(RESTRICTED)))):
        steps[f"train_medusa4_{label}"] = lambda v=vocab: medusa_step(mp, target, v, tokens, feats, 4, "dist")
        steps[f"train_eagle_{label}"] = lambda v=vocab: eagle_step(ep, target, v, tokens, feats, "dist")
    for key, t in time_calls(steps, max(1, repeats // 3)).items():
        out[key + "_pos_per_s"] = 8 * 64 / statistics.median(t)
    return out


def accept(
    target: CausalLM,
    drafts: list[str],
    prompts: list[list[int]],
    n_tokens: int,
    K: int,
    temperatures,
    progress: Progress,
) -> list:
    """alpha, tau, draft passes per round and speedup of each drafter on a trained target."""
    rows = []
    autoregressive_sample(target, prompts[0], n_tokens)  # warm-up: the first run pays one-off costs
    for t in temperatures:
        ar_time = 0.0
        for i, prompt in enumerate(prompts):
            start = time.perf_counter()
            autoregressive_sample(target, prompt, n_tokens, temperature=t, seed=i)
            ar_time += time.perf_counter() - start
        for spec in drafts:
            progress(f"acceptance: T={t:g}, drafter {spec}, {len(prompts)} prompts")
            drafter = make_drafter(
                spec if parse_draft(spec).kind != "model" else load_model(spec, progress=False), target
            )
            speculative_sample(target, drafter, prompts[0], n_tokens, K=K, temperature=t, seed=0)  # warm-up
            judged = accepted = new = rounds = draft_calls = 0
            spec_time = 0.0
            for i, prompt in enumerate(prompts):
                start = time.perf_counter()
                r = speculative_sample(target, drafter, prompt, n_tokens, K=K, temperature=t, seed=i)
                spec_time += time.perf_counter() - start
                judged, accepted = judged + sum(r.judged), accepted + r.accepted
                new += len(r.tokens)
                rounds += r.rounds
                draft_calls += r.draft_calls
            alpha = accepted / judged if judged else float("nan")  # nan: nothing was drafted
            rows.append(
                {
                    "drafter": spec,
                    "T": t,
                    "alpha": alpha,
                    "tau": new / max(1, rounds),
                    "draft_calls_per_round": draft_calls / max(1, rounds),
                    "speedup": ar_time / spec_time,
                }
            )
    return rows


def main(argv=None) -> int:
    parser = flags.Parser(prog="python -m specdec.bench --only heads|heads-accept", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="124M,355M", help="comma-separated: 124M, 355M")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--accept", action="store_true", help="measure acceptance and speedup on a trained target")
    parser.add_argument("--target", help="--accept: the target (a name or folder)")
    parser.add_argument("--drafts", help="--accept: comma-separated drafter specs or model names")
    parser.add_argument("--prompts-file", help='--accept: JSON list of prompts (strings or {"text": ...})')
    parser.add_argument("--n-prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=48, help="--accept: new tokens per prompt")
    parser.add_argument("--K", type=int, default=4)
    add_quiet(parser)
    args = parser.parse_args(argv)
    progress = Progress("heads", args.quiet)
    if args.accept:
        if not (args.target and args.drafts and args.prompts_file):
            parser.error("--accept needs --target, --drafts and --prompts-file")
        target = load_model(args.target, progress=False)
        texts = json.loads(Path(args.prompts_file).read_text())[: args.n_prompts]
        prompts = [target.tokenizer.encode(p["text"] if isinstance(p, dict) else p) for p in texts]
        print(f"{target.name}: {len(prompts)} prompts, {args.tokens} new tokens each, K={args.K} (chains)")
        print(f"{'drafter':<40} {'T':>3} {'alpha':>6} {'tau':>6} {'draft passes/round':>19} {'speedup':>8}")
        for r in accept(target, args.drafts.split(","), prompts, args.tokens, args.K, (0.0, 1.0), progress):
            print(
                f"{r['drafter']:<40} {r['T']:>3g} {fmt(r['alpha'], 3):>6} {r['tau']:>6.2f} "
                f"{r['draft_calls_per_round']:>19.2f} {r['speedup']:>7.2f}x"
            )
        return 0
    for name in args.sizes.split(","):
        if name not in SHAPES:
            parser.error(f"unknown size {name!r}: choose from {', '.join(SHAPES)}")
        r = bench_shape(name, SHAPES[name], args.repeats, progress)
        print(f"\n{name} shape (random weights): target decode step {r['target_step_ms']:.1f} ms")
        print("  draft cost c (x target step)      full vocab   8k vocab")
        for key, label in (
            ("c_medusa4", "Medusa, 4 heads, per round"),
            ("c_eagle_step", "EAGLE, per draft step"),
            ("c_eagle_commit3", "EAGLE, commit 3 positions"),
        ):
            print(f"  {label:<32} {r[key + '_full']:>10.3f} {r[key + '_8k']:>10.3f}")
        print("  training (positions/s)            full vocab   8k vocab")
        for key, label in (("train_medusa4", "Medusa, 4 heads"), ("train_eagle", "EAGLE")):
            print(f"  {label:<32} {r[key + '_full_pos_per_s']:>10.0f} {r[key + '_8k_pos_per_s']:>10.0f}")
        gen = r["generate_pos_per_s"]
        print(f"  self-distillation: {gen:.0f} positions/s (one decode step each)")
        for key, label in (("train_medusa4_full", "Medusa"), ("train_eagle_full", "EAGLE")):
            train_rate = r[key + "_pos_per_s"]
            hours = (1e6 / gen + 1e6 / train_rate) / 3600
            print(f"  1M positions, 1 epoch, {label}: {hours:.1f} h (generation {1e6 / gen / 3600:.1f} h)")
    return 0
