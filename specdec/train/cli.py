"""`python -m specdec.train`: the command line of the training loop (specdec/train/loop.py) and of
distillation data at scale (`python -m specdec.train data ...`, specdec/train/distill.py)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .. import safe_io
from ..cli import flags
from .draft_model import LOSSES
from .heads_train import KINDS
from .loop import check_settings, train


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["data"]:
        return data_main(argv[1:])
    if argv[:1] == ["ship"]:
        return ship_main(argv[1:])
    if argv[:1] == ["datastore"]:
        return datastore_main(argv[1:])
    parser = flags.Parser(
        prog="python -m specdec.train",
        description="Train Medusa or EAGLE draft heads, or (draft) a small distilled draft model, in NumPy. "
        "(`python -m specdec.train data --help`: self-distillation data from a chat model, batched and resumable.)",
    )
    parser.add_argument("kind", choices=["medusa"] + sorted(KINDS))
    parser.add_argument("--model", required=True, help="the target: a name (124M, ...), a Hub repo id or a folder")
    parser.add_argument("--tokens", type=int, help="self-distilled training tokens to generate (or --data)")
    parser.add_argument(
        "--data",
        metavar="DIR",
        help="train on distillation shards (`python -m specdec.train data`) "
        "instead of generating --tokens; with --epochs, --batch-tokens, --held-out, --max-rows",
    )
    parser.add_argument("--epochs", type=float, default=4.0, help="with --data: passes over the data (default 4)")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="with --data: positions per step (default 4096)")
    parser.add_argument("--held-out", type=float, default=0.05, help="with --data: share of requests held out (0.05)")
    parser.add_argument("--max-rows", type=int, default=None, help="with --data: use only the first N rows")
    parser.add_argument(
        "--states-cache",
        metavar="DIR",
        help="with --data: keep the target's hidden states in DIR "
        "between runs (float16, about 1.2 kB per token per layer; checked before reuse)",
    )
    parser.add_argument(
        "--block",
        choices=["gpt2", "llama", "eagle3"],
        default=None,
        help="with --data: EAGLE's block: GPT-2's (default), a Llama block (Llama targets), or "
        "EAGLE-3's (a Llama block on fused low/mid/high features, trained on its own drafts)",
    )
    parser.add_argument("--out", required=True, help="folder for the heads (and data/checkpoint caches)")
    parser.add_argument("--heads", type=int, default=4, help="Medusa heads (default 4)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: about 4 epochs)")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step (default 8)")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per generated sequence (default 64)")
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate (default 1e-3)")
    parser.add_argument("--vocab-top", type=int, default=None, help="draft only the N most frequent tokens")
    parser.add_argument(
        "--labels",
        choices=["dist", "tokens"],
        default="dist",
        help="train towards the target's distributions (default) or its sampled tokens",
    )
    parser.add_argument("--greedy-frac", type=float, default=0.5, help="fraction of greedy sequences (default 0.5)")
    parser.add_argument("--eval-tokens", type=int, default=None, help="held-out self-distilled tokens")
    parser.add_argument("--eval-text", metavar="FILE", help="also report accuracy on this held-out text file")
    parser.add_argument(
        "--ttt",
        action="store_true",
        help="with --block llama: train on its own drafts too "
        "(EAGLE-3's training-time test: a second step reads the head's own output)",
    )
    parser.add_argument(
        "--layers",
        type=layer_list,
        default=None,
        help="draft: the target layers its blocks start from, comma-separated (default 0: one block)",
    )
    parser.add_argument("--n-ff", type=int, default=None, help="draft: its MLP width (default: the target's)")
    parser.add_argument(
        "--loss",
        choices=LOSSES,
        default=None,
        help="draft: the divergence, forward KL (fkl, the default) or total variation (tvd = 1 - acceptance)",
    )
    parser.add_argument("--save-every", type=int, default=100, help="checkpoint every N steps (default 100)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", action="store_true", help="continue from DIR/checkpoint.*")
    parser.add_argument(
        "--init",
        metavar="DIR",
        help="with --data: start from the weights of an earlier run of the "
        "same kind (its --out folder), e.g. to go on training on data that has grown",
    )
    parser.add_argument(
        "--init-head",
        metavar="DIR",
        help="with --block eagle3: start from a trained EAGLE head "
        "with a Llama block (its folder, or 'eagle' for the shipped one): its weights, and the fused "
        "layers fitted to stand in for the final feature it read",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)
    flags.refuse_ignored(
        parser,
        args,
        [
            (
                "heads",
                args.kind != "medusa",
                "only applies to medusa: EAGLE trains one head that drafts autoregressively",
            )
        ],
    )
    flags.refuse_ignored(
        parser,
        args,
        [
            (name, args.kind != "draft", "only applies to draft (a distilled draft model)")
            for name in ("layers", "n_ff", "loss")
        ]
        + [
            (name, args.kind == "draft", "only applies to eagle (a draft model is Llama blocks)")
            for name in ("block", "ttt", "init_head")
        ],
    )
    if (args.tokens is None) == (args.data is None):
        parser.error("give either --tokens N (generate data) or --data DIR (distillation shards), not both")
    if args.data is not None:
        return data_train_main(parser, args)
    if args.kind not in ("medusa", "eagle"):
        parser.error(f"{args.kind} heads train on distillation shards: give --data DIR")
    with_data = ("epochs", "batch_tokens", "held_out", "max_rows", "block", "ttt", "states_cache", "init", "init_head")
    flags.refuse_ignored(parser, args, [(name, True, "only applies with --data DIR") for name in with_data])
    try:
        from ..checkpoints.load import load_model

        check_settings(
            args.kind,
            args.tokens,
            args.heads,
            args.steps,
            args.batch,
            args.seq_len,
            args.lr,
            args.vocab_top,
            args.labels,
            args.greedy_frac,
            args.eval_tokens,
            args.save_every,
        )

        target = load_model(args.model, progress=not args.quiet)
        eval_text = read_text_file(args.eval_text, "--eval-text") if args.eval_text else None
        train(
            args.kind,
            target,
            args.tokens,
            args.out,
            n_heads=args.heads,
            steps=args.steps,
            batch=args.batch,
            seq_len=args.seq_len,
            lr=args.lr,
            vocab_top=args.vocab_top,
            label_kind=args.labels,
            greedy_frac=args.greedy_frac,
            seed=args.seed,
            resume=args.resume,
            eval_tokens=args.eval_tokens,
            save_every=args.save_every,
            progress=not args.quiet,
            eval_text=eval_text,
        )
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except MemoryError:  # (the data's size is checked first: this is the rest of training)
        print(
            f"error: out of memory training {args.kind} heads in {args.out}; use fewer --tokens or a smaller --batch",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print(f"\ninterrupted; continue with --resume (checkpoint in {args.out})", file=sys.stderr)
        return 130
    return 0


def read_text_file(path: str, flag: str) -> str:
    """A UTF-8 text file a flag names, by the one reader (safe_io: a regular file of at most 64 MB, a FIFO
    refused at once); ValueError naming the flag and the file otherwise."""
    try:
        return safe_io.read_bytes(path, 64 << 20).decode("utf-8")
    except FileNotFoundError:
        raise ValueError(f"{flag} {path}: no such file") from None
    except (OSError, ValueError) as e:  # safe_io.Refused, UnicodeDecodeError
        raise ValueError(f"{flag} {path}: {e}") from None


def timed_log(quiet: bool) -> Callable[[str], None]:
    """Progress lines on standard error, each stamped with the time of day; none when quiet."""

    def log(line: str) -> None:
        if not quiet:
            print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)

    return log


def layer_list(text: str) -> list[int]:
    """--layers "0,15" -> [0, 15]."""
    try:
        layers = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected layer numbers separated by commas, such as 0 or 0,15; got {text!r}")
    return layers


def data_train_main(parser, args) -> int:
    """`python -m specdec.train KIND --data DIR ...`: a head trained on distillation shards (heads_train.py)."""
    if args.kind == "medusa":
        parser.error("--data trains EAGLE heads; Medusa heads generate their data with --tokens N")
    flags.refuse_ignored(
        parser,
        args,
        [
            (name, True, "only applies with --tokens")
            for name in ("seq_len", "labels", "greedy_frac", "eval_tokens", "eval_text")
        ],
    )
    try:
        from ..checkpoints.load import load_model
        from .heads_train import command_line, train_from_data

        target = load_model(args.model, progress=not args.quiet)
        train_from_data(
            args.kind,
            target,
            args.data,
            args.out,
            vocab_top=args.vocab_top,
            epochs=args.epochs,
            steps=args.steps,
            batch_tokens=args.batch_tokens,
            lr=args.lr or 1e-3,
            held_out=args.held_out,
            max_rows=args.max_rows,
            seed=args.seed,
            resume=args.resume,
            init=args.init,
            init_head=args.init_head,
            save_every=args.save_every,
            progress=not args.quiet,
            command=command_line(),
            states_cache=args.states_cache,
            options={
                "block": args.block or "gpt2",
                "ttt": args.ttt,
                "layers": args.layers,
                "n_ff": args.n_ff,
                "loss": args.loss,
            },
        )
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\ninterrupted; continue with --resume (checkpoint in {args.out})", file=sys.stderr)
        return 130
    return 0


def ship_main(argv) -> int:
    """`python -m specdec.train ship ...`: a trained head copied as float16 into the package, with its card."""
    parser = flags.Parser(
        prog="python -m specdec.train ship",
        description="Copy a trained EAGLE head into a "
        "folder as float16 (checked before and after), with CARD.txt: how heads shipped inside "
        "specdec are made.",
    )
    parser.add_argument("--model", required=True, help="the target the head was trained for")
    parser.add_argument("--head", required=True, metavar="DIR", help="the trained head's folder")
    parser.add_argument("--out", required=True, metavar="DIR", help="where the float16 copy goes")
    args = parser.parse_args(argv)
    try:
        from ..checkpoints.load import load_model
        from .ship import ship_head

        weights = ship_head(args.head, args.out, load_model(args.model, progress=False))
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"shipped {weights} ({weights.stat().st_size / 2**20:.1f} MiB) with {Path(args.out) / 'CARD.txt'}")
    return 0


def datastore_main(argv) -> int:
    """`python -m specdec.train datastore ...`: the target's replies in distillation shards, as a suffix decoding
    datastore (train/datastore.py)."""
    parser = flags.Parser(
        prog="python -m specdec.train datastore",
        description="A datastore for suffix decoding (--draft suffix:DIR): the replies of distillation shards "
        "(`python -m specdec.train data`) end to end, sorted for the lookup, with a card. Reads a data run still "
        "going as far as its whole shards go.",
    )
    parser.add_argument("--model", required=True, help="the model that wrote the replies: smollm2-135m, or a folder")
    parser.add_argument("--data", required=True, metavar="DIR", help="the folder of `python -m specdec.train data`")
    parser.add_argument("--out", required=True, metavar="DIR", help="where datastore.json and its file go")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="take replies, in order, while the datastore stays within N tokens (6 bytes each: 1,747,626 fit in "
        "10 MB; default: all)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    log = timed_log(args.quiet)
    try:
        from ..checkpoints.load import load_model
        from .datastore import make_datastore, portable_command

        if args.max_tokens is not None and args.max_tokens < 3:
            raise ValueError(f"--max-tokens must be at least 3 (a reply and its separators), got {args.max_tokens}")
        model = load_model(args.model, progress=not args.quiet)
        log(f"reading the replies in {args.data}")
        command = portable_command(["datastore", *argv])
        store = make_datastore(model, args.data, args.out, args.max_tokens, command, log)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    shards, seconds = store.card["source"]["shards"], store.card["build_seconds"]
    print(f"datastore: {store.describe()} from {shards} shards of {args.data}, built in {seconds} s -> {args.out}")
    return 0


def data_main(argv) -> int:
    """`python -m specdec.train data ...`: a chat model answers many requests; shards in --out (distill.py)."""
    parser = flags.Parser(
        prog="python -m specdec.train data",
        description="Self-distillation data: a chat model answers thousands of requests, batched, into resumable "
        "shards (replies, greedy/sampled mode, the target's top-k tokens and probabilities). Run the same command "
        "again to resume.",
    )
    parser.add_argument("--model", required=True, help="the chat model: smollm2-135m, or a folder")
    parser.add_argument("--out", required=True, help="folder for manifest.json and the shards")
    parser.add_argument("--tokens", type=int, required=True, help="reply tokens to make in all")
    parser.add_argument("--batch", type=int, default=16, help="replies decoded side by side (default 16)")
    parser.add_argument("--max-reply", type=int, default=256, help="reply tokens at most, per row (default 256)")
    parser.add_argument("--temperature", type=float, default=1.0, help="of the sampled rows (default 1.0)")
    parser.add_argument("--greedy-frac", type=float, default=0.5, help="fraction of greedy rows (default 0.5)")
    parser.add_argument("--top-k", type=int, default=8, help="target tokens kept per reply position (default 8)")
    parser.add_argument("--shard-rows", type=int, default=64, help="rows per shard (default 64)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    log = timed_log(args.quiet)
    try:
        from ..checkpoints.load import load_model
        from .distill import check_data_settings, make_data
        from .requests import build_requests

        check_data_settings(
            args.tokens, args.batch, args.max_reply, args.temperature, args.greedy_frac, args.top_k, args.shard_rows
        )
        target = load_model(args.model, progress=not args.quiet)
        pool = build_requests(args.seed)
        log(
            f"{len(pool.requests):,} distinct requests ({pool.n_templated:,} templated, {pool.n_docs:,} from "
            f"docstrings; {len(pool.dropped)} dropped for overlapping evaluation text)"
        )
        manifest = make_data(
            target,
            args.out,
            args.tokens,
            pool,
            batch=args.batch,
            max_reply=args.max_reply,
            temperature=args.temperature,
            greedy_frac=args.greedy_frac,
            top_k=args.top_k,
            shard_rows=args.shard_rows,
            seed=args.seed,
            log=log,
        )
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\ninterrupted; run the same command again to resume (shards in {args.out})", file=sys.stderr)
        return 130
    log(f"done: {manifest['reply_tokens']:,} reply tokens in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
