"""Block verification against token-wise verification, on the same drafts: expected and realised tokens per round.

    python -m specdec.bench --only block                                   # the shipped family and SmolLM2
    python -m specdec.bench --only block --models family --tokens 24 --prompts 2    # a quick look, offline
    python -m specdec.bench --only block --models smollm2-135m --drafts ngram,early_exit:29 --K 2,4,8

What it adds over the other sections: how much the verification rule alone
changes (verify.sampled_chain against verify.block_chain, Sun et al., arXiv
2403.10444). For every (model, drafter, T, K), each prompt is decoded twice with
the same seed, once with each rule. At every round that drafted something, the
target's rows p and the draft's rows q give both rules' EXACT expected tokens
for that round's drafts, with no coin flipped:
    token-wise   1 + sum_i prod_(j<i) min(1, p_j(x_j) / q_j(x_j))     (verify.token_weights)
    block        1 + sum_i w_i, the weights carried along the block     (verify.block_weights)
(each term is the rule's P(keep at least i drafts | the first i drafts); its
mean over rounds is the rule's expected tau at that drafter's draft
distribution, and block's is never below token-wise's, round by round).
Columns E[tau] are these, averaged over the rounds of both runs (the same
drafts judged both ways); tau columns are what each run realised (accepted
drafts + 1, per round that drafted; ± one standard error over rounds).
gain = E[tau] block / E[tau] token - 1.
Deterministic drafts (n-gram, or any drafter at T=0) gain nothing: a point-mass
q makes the two rules the same law (docs/block.md). A script that prints
numbers, not a test.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from ..cli import flags
from ..checkpoints import family
from ..checkpoints.load import load_model
from ..sampling import SamplingParams, probabilities
from ..speculative import speculative_sample
from ..verify import block_weights, token_weights
from .progress import Progress, add_quiet
from .prompts import load_prompts

FAMILY_DRAFTS = f"{family.DRAFT},early_exit:{family.EARLY_EXIT_LAYER},ngram"
REAL_DRAFTS = "early_exit:29,ngram"


def load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def mean(xs) -> float:
    return float(np.mean(xs)) if xs else float("nan")


def stderr(xs) -> float:
    """The standard error of a mean of per-round values (rounds treated as independent: roughly)."""
    return float(np.std(xs, ddof=1) / np.sqrt(len(xs))) if len(xs) > 1 else float("nan")


def measure(target, draft, prompts, n_tokens: int, K: int, params: SamplingParams, seed: int) -> dict:
    """Both rules on the same prompts and seeds: expected tau of both on every drafted round, realised tau of each."""
    expected = {"token": [], "block": []}  # per drafted round, over both runs
    realised = {"token": [], "block": []}  # accepted + 1, per drafted round of that rule's run

    def on_round(proposal, logits):
        if not len(proposal):
            return
        p = probabilities(logits, params)  # [k+1, n_vocab], filtered as the round filters it
        tokens, q = proposal.tokens, proposal.q
        expected["token"].append(1 + float(token_weights(tokens, q, p)[1:].sum()))
        expected["block"].append(1 + float(block_weights(tokens, q, p)[1:].sum()))

    for verification in ("token", "block"):
        for i, ids in enumerate(prompts):
            out = speculative_sample(
                target,
                draft,
                ids,
                n_tokens,
                K=K,
                temperature=params.temperature,
                top_k=params.top_k,
                top_p=params.top_p,
                seed=seed + i,
                verification=verification,
                on_round=on_round,
            )
            realised[verification] += [n + 1 for k, n in zip(out.k_per_round, out.accepted_per_round) if k > 0]
    return {
        "rounds": len(expected["token"]),
        "E_token": mean(expected["token"]),
        "E_block": mean(expected["block"]),
        "tau_token": mean(realised["token"]),
        "tau_block": mean(realised["block"]),
        "se_token": stderr(realised["token"]),
        "se_block": stderr(realised["block"]),
        "min_round_gain": min((b - t for t, b in zip(expected["token"], expected["block"])), default=float("nan")),
    }


def main(argv=None) -> list[dict]:
    p = flags.documented("python -m specdec.bench --only block", __doc__)
    p.add_argument(
        "--models",
        default="family,smollm2-135m",
        help="'family' (stdlib-6L with its drafters) and/or a Llama/GPT-2 name (default %(default)s)",
    )
    p.add_argument(
        "--drafts", default=REAL_DRAFTS, help="drafters for the models other than the family (default %(default)s)"
    )
    p.add_argument("--temperatures", default="0.6,1.0,1.3", help="(default %(default)s)")
    p.add_argument("--K", default="2,3,4,5,6,7,8", help="draft lengths (default %(default)s)")
    p.add_argument("--prompts", type=int, default=3, help="prompts per setting (default %(default)s)")
    p.add_argument("--tokens", type=int, default=24, help="new tokens per prompt (default %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    add_quiet(p)
    args = p.parse_args(argv)
    progress = Progress("block", args.quiet)
    temperatures = [float(t) for t in args.temperatures.split(",")]
    Ks = [int(k) for k in args.K.split(",")]
    start, t0 = load(), time.perf_counter()
    print(
        f"load average {start:.2f} at the start; {args.prompts} prompts x {args.tokens} tokens per setting, "
        f"seeds {args.seed}..{args.seed + args.prompts - 1}, both rules on the same seeds"
    )
    print("| model | drafter | T | K | rounds | E[tau] token | E[tau] block | gain | tau token | tau block |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for name in args.models.split(","):
        if name == "family":
            target, draft_model = load_model(family.TARGET), load_model(family.DRAFT)
            drafts = {d: (draft_model if d == family.DRAFT else d) for d in FAMILY_DRAFTS.split(",")}
            texts = [p["text"] for p in family.prompts()[: args.prompts]]
            label = family.TARGET
        else:
            target, label = load_model(name), name
            drafts = {d: d for d in args.drafts.split(",")}
            suite = load_prompts()
            texts = [suite[kind][0] for kind in list(suite)[: args.prompts]]  # the first prompt of each kind
        prompts = [target.tokenizer.encode(t) for t in texts]
        for drafter, draft in drafts.items():
            for T in temperatures:
                for K in Ks:
                    progress(f"{label}, drafter {drafter}, T={T}, K={K}: {len(prompts)} prompts, both rules")
                    r = measure(target, draft, prompts, args.tokens, K, SamplingParams(T), args.seed)
                    r.update(model=label, drafter=drafter, T=T, K=K)
                    rows.append(r)
                    gain = r["E_block"] / r["E_token"] - 1
                    print(
                        f"| {label} | {drafter} | {T} | {K} | {r['rounds']} | {r['E_token']:.3f} | {r['E_block']:.3f} "
                        f"| {100 * gain:+.1f}% | {r['tau_token']:.2f} ± {r['se_token']:.2f} "
                        f"| {r['tau_block']:.2f} ± {r['se_block']:.2f} |",
                        flush=True,
                    )
                    assert r["min_round_gain"] >= -1e-5, "block's expected tokens fell below token-wise's on a round"
    print(f"\nload average {load():.2f} at the end; {time.perf_counter() - t0:.0f} s", file=sys.stdout)
    return rows
