"""How well a drafter's confidence predicts acceptance, on the prompt suite, and what stopping on it would buy.

    python docs/measure/calibration.py eagle smollm2-draft [--temperature 1] [--n-tokens 32]

Runs the suite's prompts as chat requests (SMOLLM2-135M, chains of K = 4) and reads, for every
drafted token that the verification reached, its draft distribution q's largest probability (its
confidence, known before the token is drawn) and whether it was accepted. At T > 0 q is the
distribution each draft was drawn from (greedy runs keep no q, so the temperature must be above 0).

Then, from the same rounds, a draft that stops at the first position whose confidence is below t
(a rule that reads only q, so the sampler stays exact): tokens per round and the speedup the cost
model predicts with this machine's measured r(m) and c. It is a prediction from the recorded rounds,
not a timed run: a real stop would change later rounds' alignment a little (the text is the same). A
round that drafts nothing is still charged one draft step (an EAGLE head reads the accepted tokens'
features each round), so no threshold predicts much more than 1 / (1 + c).
"""

import specdec  # noqa: F401  (first: sets OpenBLAS's thread spin before NumPy loads)

import argparse

import numpy as np

from specdec.bench.prompts import load_prompts
from specdec.checkpoints.load import load_model
from specdec.costmodel.chain import round_cost
from specdec.drafters import make_drafter
from specdec.drafters.specs import parse_draft
from specdec.speculative import speculative_sample
from specdec.timing import measure_costs

BINS = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
THRESHOLDS = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("drafts", nargs="+")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--n-tokens", type=int, default=32)
    parser.add_argument("--K", type=int, default=4)
    args = parser.parse_args()
    if args.temperature <= 0:
        parser.error("--temperature must be above 0: greedy runs keep no draft distribution to read")
    target = load_model("smollm2-135m")
    prompts = [p for group in load_prompts().values() for p in group]
    for name in args.drafts:
        drafter = make_drafter(load_model(name) if parse_draft(name).kind == "model" else name, target)
        rounds = []
        for prompt in prompts:
            proposals = []
            result = speculative_sample(
                target,
                drafter,
                prompt,
                args.n_tokens,
                K=args.K,
                temperature=args.temperature,
                seed=0,
                chat=True,
                on_round=lambda p, logits: proposals.append(p),
            )
            for proposal, n_accepted in zip(proposals, result.accepted_per_round):
                conf = [] if proposal.q is None else proposal.q.max(axis=1).tolist()
                rounds.append((conf, n_accepted))
        costs = measure_costs(target, drafter, target.tokenizer.encode(prompts[0]))
        report(name, rounds, costs)


def report(name, rounds, costs):
    reached = np.array([(cf, i < a) for conf, a in rounds for i, cf in enumerate(conf) if i <= a], dtype=float)
    print(
        f"\n{name}: {len(rounds)} rounds, {len(reached)} drafts judged; c = {costs.c:.3f}, "
        f"r(2) = {costs.r[1]:.2f}, r(5) = {costs.r[4]:.2f}"
    )
    print("| confidence | drafts | accepted |\n|---|---|---|")
    for lo, hi in zip(BINS, BINS[1:]):
        inside = reached[(reached[:, 0] >= lo) & ((reached[:, 0] < hi) | (hi == 1.0))]
        if len(inside):
            print(f"| {lo:.1f}-{hi:.1f} | {len(inside)} | {inside[:, 1].mean():.2f} |")
    print("| stop below | tokens per round | rounds that draft | predicted speedup |\n|---|---|---|---|")
    for t in THRESHOLDS:
        tokens = cost = drafting = 0.0
        for conf, a in rounds:
            k = next((i for i, cf in enumerate(conf) if cf < t), len(conf))
            tokens += min(a, k) + 1
            drafting += k > 0
            cost += round_cost(k, costs.c, costs.r) + (costs.c if k == 0 else 0.0)  # a round's commit is a step
        print(f"| {t:.1f} | {tokens / len(rounds):.2f} | {drafting / len(rounds):.2f} | {tokens / cost:.2f}x |")


if __name__ == "__main__":
    main()
