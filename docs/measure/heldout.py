"""Held-out figures of trained Llama-block EAGLE heads on the distillation data, side by side.

    python docs/measure/heldout.py --data distill-data --states-cache states [--max-rows N] HEAD_DIR [HEAD_DIR ...]

For each head folder (a training run's --out, or a shipped head): teacher-forced top-1 and top-5 over
the reply positions of the held-out requests (the trainer's rule: sha256 of the request's text, the
first --held-out of its range), top-1 by reply position, and top-1 of the second draft token, which
drafting reads from the head's own first output (train/eagle_llama.two_step_logits). The trainer
prints these at the end of a run; this script scores heads trained before it did, or several heads
on the same rows. The target is SmolLM2-135M.
"""

import specdec  # noqa: F401  (first: sets OpenBLAS's thread spin before NumPy loads)

import argparse
from pathlib import Path

from specdec.checkpoints.load import load_model
from specdec.drafters.eagle import head_shapes
from specdec.drafters.heads import load_heads
from specdec.train.shards import load_distill_data
from specdec.train.eagle_llama import LlamaEagleKind
from specdec.train.rows import held_out_accuracy, held_out_rows
from specdec.train.states import row_states


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("heads", nargs="+", metavar="HEAD_DIR")
    parser.add_argument("--data", required=True, help="the distillation shards the heads were trained on")
    parser.add_argument("--states-cache", default=None, help="the trainer's hidden-states cache folder, if any")
    parser.add_argument("--held-out", type=float, default=0.05, help="the runs' --held-out (default 0.05)")
    parser.add_argument(
        "--max-rows",
        type=int,
        default=None,
        help="the runs' --max-rows, if they had one (default: all rows, the held-out rows of a run over all the data)",
    )
    parser.add_argument("--batch-tokens", type=int, default=4096)
    args = parser.parse_args()

    target = load_model("smollm2-135m")
    data = load_distill_data(args.data, target, complete=False)  # (the whole shards of a run still going too)
    rows = [r for r, held in enumerate(held_out_rows(data, args.held_out)[: args.max_rows]) if held]
    n_tokens = sum(len(data.replies[r]) for r in rows)
    print(f"{args.data}: {len(data.replies)} rows, {len(rows)} held out ({n_tokens:,} reply tokens)")
    states = {}
    print("| head | block | top-1 | top-5 | top-1 by reply position (0-15, 16-63, 64+) | second draft token top-1 |")
    print("|---|---|---|---|---|---|")
    for folder in args.heads:
        config, params, vocab = load_heads(folder, "eagle", target, head_shapes(folder, target))
        block = config.get("block", "gpt2")
        if block not in ("llama", "eagle3"):
            raise SystemExit(f"error: {folder} holds a {block} head; this script scores Llama-block heads")
        kind = LlamaEagleKind(block)
        layers = tuple(kind.layers(target))
        if layers not in states:
            cache = Path(args.states_cache).expanduser() if args.states_cache else None
            states[layers] = row_states(target, data, rows, list(layers), True, cache)
        acc = held_out_accuracy(kind, params, target, config, vocab, data, rows, states[layers], args.batch_tokens)
        by = ", ".join(f"{v:.3f}" for v in acc["top1_by_position"].values())
        print(
            f"| {Path(folder).name} | {block} | {acc['top1']:.3f} | {acc['top5']:.3f} | {by} | "
            f"{acc['top1_second']:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
