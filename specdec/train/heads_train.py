"""Training draft heads on distillation data at scale (the shards of `python -m specdec.train data`).

    python -m specdec.train eagle --model smollm2-135m --data distill-data --out heads/eagle-smollm2 \
        --vocab-top 8192 --epochs 4

What it does, in order:
1. Reads the shards (shards.load_distill_data: every shard's checksum checked) and
   splits the rows by request: a request's rows are all held out or all trained on
   (rows.held_out_rows), so the held-out figures are on requests the head never saw.
2. The draft vocabulary (FR-Spec, Zhao et al., arXiv 2502.14856): the --vocab-top
   most frequent tokens of the training replies (heads.top_tokens).
3. The target's hidden states at every position of every row (states.row_states),
   recomputed in one teacher-forced pass and kept in memory as float16; the layers
   are the ones the head kind reads (EAGLE: the last, after the final norm).
4. Labels: at every reply position, the target's own distribution at T=1 as the
   shards store it, its 8 most likely tokens, renormalised and restricted to the
   draft vocabulary (rows.soft_targets). Prompt positions carry no labels; they are the
   context the head attends to, as when it drafts.
5. Batches of whole rows of similar length (rows.row_batches, at most --batch-tokens
   positions each, right-padded; causal attention means padding at the end of a
   row changes nothing before it), shuffled per epoch; AdamW with a warm-up and a
   cosine decay; a checkpoint every --save-every steps (resume.save_checkpoint,
   written as one pair), so --resume continues.
6. Held-out teacher-forced top-1/top-5 before and after (rows.held_out_accuracy), then the head file
   (heads.save_heads) with a card's worth of config: the data, the steps, the
   figures, the command.

The head's own mathematics lives in its kind (HeadKind below): what layers it
reads, its parameters, its loss and gradients on a HeadBatch, its logits.
Shipping a trained head inside specdec is ship.py's.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Protocol

import numpy as np
from tqdm import tqdm

from ..checkpoints import locks
from ..checkpoints.registry import shipped_heads
from ..drafters import eagle, eagle_grad
from ..drafters.heads import DraftVocab, head_cross_entropy, model_fingerprint, save_heads, smooth_l1, top_tokens
from ..model.base import CausalLM
from .shards import load_distill_data
from .draft_model import DraftKind
from .eagle_llama import LlamaEagleKind
from .loop import LOCK_FILE, _check_finite_weights, take_step
from .resume import read_checkpoint, read_init
from .optim import AdamW
from .rows import HeadBatch, held_out_accuracy, held_out_rows, make_batch, row_batches
from .states import row_states

F32 = np.float32
F16 = np.float16


# ---------------------------------------------------------------------------
# The kinds of head this trainer can train.
# ---------------------------------------------------------------------------


class HeadKind(Protocol):
    """What the trainer needs from a kind of head.

    name: what the head file records as its kind (heads.save_heads / load_heads).
    layers(target): the hidden-state layers it reads (features.py's numbering).
    config(target, options): what the head file's config records about its shape.
    param_shapes / init_params: its parameters.
    loss_and_grads(params, target, config, vocab, batch): (loss, named parts, grads).
    logits(params, target, config, vocab, batch): ([n, N] teacher-forced logits, [n_labels] bool: which of
        the batch's label rows they are, in order).
    two_logits(params, target, config, vocab, batch), if the kind has it (a Llama-block head, which drafts
        from its own outputs): ((logits, rows) of drafting's first token, (logits, rows) of its second), from
        one unrolled pass; held-out accuracy then scores the second token too.
    save(out, target, params, card, vocab), if the kind has it: writes what was trained (the draft model's
        own file); otherwise heads.save_heads writes a head file.
    """

    name: str

    def layers(self, target: CausalLM) -> list[int]: ...
    def config(self, target: CausalLM, options: dict) -> dict: ...
    def param_shapes(self, target: CausalLM, config: dict) -> dict[str, tuple[int, ...]]: ...
    def init_params(self, target: CausalLM, config: dict, rng: np.random.Generator) -> dict[str, np.ndarray]: ...
    def loss_and_grads(self, params, target, config, vocab, batch: HeadBatch) -> tuple[float, dict, dict]: ...
    def logits(self, params, target, config, vocab, batch: HeadBatch) -> tuple[np.ndarray, np.ndarray]: ...


class EagleKind:
    """EAGLE (Li et al., arXiv 2401.15077) as drafters/eagle.py has it: pair (f_t, x_(t+1)) predicts
    the feature f_(t+1) (SmoothL1, at every position of a row) and the token x_(t+2) (cross-entropy
    against the target's distribution, at reply positions only)."""

    name = "eagle"

    def layers(self, target):
        return [target.hparams.n_layer]  # after the final norm: what the LM head reads

    def config(self, target, options):
        return {"n_heads": 1, "n_head": target.n_head, "layer_norm_epsilon": target.hparams.layer_norm_epsilon}

    def param_shapes(self, target, config):
        return eagle.param_shapes(1, target.n_embd)

    def init_params(self, target, config, rng):
        return eagle_grad.init_params(target.n_embd, rng)

    @staticmethod
    def _pairs(target, batch: HeadBatch):
        """Inputs and what each pair t = 0 .. T-2 is scored on."""
        f = batch.states[-1][:, :-1]  # [B, T-1, e] f_t
        emb = target.weights.wte[batch.tokens[:, 1:]]  # [B, T-1, e] x_(t+1)
        f_next = batch.states[-1][:, 1:]  # [B, T-1, e] f_(t+1)
        t = np.arange(f.shape[1])
        feat_mask = t[None, :] + 2 <= batch.lengths[:, None] - 1  # f_(t+1) exists: t + 1 <= length - 2
        label_mask = batch.label_mask[:, 1:]  # x_(t+2) is a reply token
        keep = batch.label_mask.copy()
        keep[:, 0] = False  # a label at position 0 has no pair before it (never in chat rows: position 0 is a prompt)
        rows = keep[batch.label_mask]  # which of the batch's label rows the pairs use
        return f, emb, f_next, feat_mask, label_mask, rows

    def loss_and_grads(self, params, target, config, vocab, batch):
        f, emb, f_next, feat_mask, label_mask, rows = self._pairs(target, batch)
        n_head, eps = config["n_head"], config["layer_norm_epsilon"]
        y, saved = eagle_grad.forward(params, f, emb, n_head, eps)  # [B, T-1, e]
        l_feat, d_feat = smooth_l1(y[feat_mask], f_next[feat_mask])
        ce, d_ce, _ = head_cross_entropy(y[label_mask], batch.p[rows], vocab)
        dy = np.zeros_like(y)
        dy[feat_mask] += d_feat
        dy[label_mask] += F32(eagle_grad.CE_WEIGHT) * d_ce
        grads = eagle_grad.backward(dy, params, saved, n_head)
        return l_feat + eagle_grad.CE_WEIGHT * ce, {"feat": l_feat, "ce": ce}, grads

    def logits(self, params, target, config, vocab, batch):
        f, emb, _, _, label_mask, rows = self._pairs(target, batch)
        y, _ = eagle_grad.forward(params, f, emb, config["n_head"], config["layer_norm_epsilon"])
        return vocab.logits(y[label_mask]), rows


KINDS: dict[str, HeadKind] = {"eagle": EagleKind(), "draft": DraftKind()}
# EAGLE's --block: the GPT-2 block above, or a Llama block (train/eagle_llama.py): EAGLE's, or EAGLE-3's.
EAGLE_BLOCKS: dict[str, HeadKind] = {
    "gpt2": KINDS["eagle"],
    "llama": LlamaEagleKind("llama"),
    "eagle3": LlamaEagleKind("eagle3"),
}


def head_kind(kind_name: str, options: dict) -> HeadKind:
    """The kind `python -m specdec.train KIND [--block BLOCK]` trains."""
    if kind_name not in KINDS:
        raise ValueError(f"--data trains {', '.join(sorted(KINDS))} heads, not {kind_name!r}")
    if kind_name != "eagle":
        return KINDS[kind_name]
    block = options.get("block", "gpt2")
    if block not in EAGLE_BLOCKS:
        raise ValueError(
            f"--block {block} is not a block an {kind_name} head has: use one of {', '.join(EAGLE_BLOCKS)}"
        )
    if options.get("ttt"):
        if block != "llama":
            raise ValueError(
                f"--ttt trains a Llama-block head on its own drafts: give --block llama (--block {block} "
                + ("always trains that way)" if block == "eagle3" else "has no training-time test)")
            )
        return LlamaEagleKind("llama", ttt=True)
    return EAGLE_BLOCKS[block]


# ---------------------------------------------------------------------------
# The run.
# ---------------------------------------------------------------------------


def train_from_data(
    kind_name: str,
    target: CausalLM,
    data_dir: str | Path,
    out: str | Path,
    vocab_top: int | None = 8192,
    epochs: float = 4.0,
    steps: int | None = None,
    batch_tokens: int = 4096,
    lr: float = 1e-3,
    held_out: float = 0.05,
    max_rows: int | None = None,
    seed: int = 0,
    resume: bool = False,
    init: str | Path | None = None,
    init_head: str | Path | None = None,
    save_every: int = 100,
    options: dict | None = None,
    progress: bool = True,
    command: str | None = None,
    log=print,
    states_cache: str | Path | None = None,
) -> dict:
    """Train a head of kind `kind_name` on the distillation data in data_dir; write it into out. Returns its config.
    states_cache: a folder keeping the target's hidden states between runs (row_states).
    init: the --out folder of an earlier run of the same kind: start from its last checkpoint's weights (with a
    fresh optimizer and schedule), for instance to go on training on data that has grown since.
    init_head: for an EAGLE-3 head, a trained EAGLE head's folder (block llama), or "eagle" for the one
    shipped for the target: start from its weights (LlamaEagleKind.start_from_head)."""
    if init is not None and resume:
        raise ValueError("--init starts a new run from another run's weights, --resume continues this one: not both")
    if init_head is not None and (init is not None or resume):
        raise ValueError(
            "--init-head starts a new run from a head's weights: not with --init or --resume (a run "
            "started with --init-head resumes with --resume alone)"
        )
    kind = head_kind(kind_name, options or {})
    if not (isinstance(epochs, (int, float)) and math.isfinite(epochs) and epochs > 0):
        raise ValueError(f"--epochs must be a number > 0, got {epochs!r}")
    if not 0 < held_out < 1:
        raise ValueError(f"--held-out must be a fraction between 0 and 1, got {held_out!r}")
    if batch_tokens < 64:
        raise ValueError(f"--batch-tokens must be at least 64, got {batch_tokens}")
    config = kind.config(target, options or {})  # (refuses a head this target cannot have, before reading data)
    shapes = kind.param_shapes(target, config)
    data = load_distill_data(data_dir, target, complete=False)
    if not data.replies:
        raise ValueError(f"{data_dir}: no whole shards yet; let `python -m specdec.train data` write some first")
    n_rows = len(data.replies) if max_rows is None else min(max_rows, len(data.replies))
    is_held = held_out_rows(data, held_out)[:n_rows]
    train_rows = [r for r in range(n_rows) if not is_held[r]]
    eval_rows = [r for r in range(n_rows) if is_held[r]]
    if not train_rows or not eval_rows:
        raise ValueError(
            f"{data_dir}: {n_rows} rows leave {len(train_rows)} to train and {len(eval_rows)} to hold "
            f"out; make more data or change --held-out"
        )
    reply_ids = np.concatenate([data.replies[r] for r in train_rows])
    ids = None if vocab_top is None or vocab_top >= target.n_vocab else top_tokens(reply_ids, vocab_top, target.n_vocab)
    vocab = DraftVocab.of(target, ids)

    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder (it is made if missing)")
    settings = {
        "kind": kind.name,
        "model_fingerprint": model_fingerprint(target),
        "data": str(Path(data_dir).resolve()),
        "rows": n_rows,
        "vocab_top": vocab_top,
        "batch_tokens": batch_tokens,
        "seed": seed,
        "held_out": held_out,
        "config": config,
    }
    if getattr(kind, "ttt", False):  # a training choice, not the head's shape: --init may start from a head without it
        settings["training_time_test"] = True  # (the card says so too)
    start_from = None
    init_dir = Path(init).expanduser() if init is not None else None
    if init_dir is not None:  # checked before --out is made: a refused --init leaves nothing behind
        if init_dir.resolve() == out.resolve():
            raise ValueError(
                f"--init {init} is the --out folder itself, whose checkpoint this run would overwrite; "
                f"give the new run another --out"
            )
        start_from = read_init(init_dir, settings, shapes)
    head_config, head_params, head_dir = None, None, None
    if init_head is not None:  # checked before --out is made, as --init is
        if not hasattr(kind, "read_init_head"):
            raise ValueError("--init-head starts an EAGLE-3 head from a trained EAGLE head: give --block eagle3")
        head_dir = shipped_heads(target.name, "eagle") if str(init_head) == "eagle" else Path(init_head).expanduser()
        head_config, head_params = kind.read_init_head(head_dir, target)
    out.mkdir(parents=True, exist_ok=True)
    with locks.exclusive(out / LOCK_FILE, wait=False) as held:
        if not held:
            raise ValueError(
                f"{out}: another training is writing into this folder (it holds {out / LOCK_FILE}); "
                f"wait for it to end, or choose another --out"
            )
        batches_per_epoch = len(row_batches(data, train_rows, batch_tokens, None))
        steps = steps if steps is not None else max(1, round(epochs * batches_per_epoch))
        saved = read_checkpoint(out, settings, shapes, steps) if resume else None

        t0 = time.perf_counter()
        states = row_states(
            target,
            data,
            train_rows + eval_rows,
            kind.layers(target),
            progress,
            Path(states_cache).expanduser() if states_cache else None,
            log,
        )
        states_s = time.perf_counter() - t0
        rng = np.random.default_rng(seed)
        params = kind.init_params(target, config, rng)
        initial = {name: a.copy() for name, a in params.items()}
        opt = AdamW(params, lr=lr, weight_decay=0.0)
        start, init_card = 0, None
        if saved is not None:
            record, tensors = saved
            start = record["step"]
            for name, w in opt.params.items():
                w[...] = tensors[name]
            opt.load_state(tensors, record["adam_t"])
            log(f"resuming from step {start} of {steps}")
            # Where a run started with --init began: kept in its checkpoints, so a resumed run's card says it too.
            init_card = record.get("init")
        if start_from is not None:
            record, tensors = start_from
            for name, w in opt.params.items():
                w[...] = tensors[name]
            init_card = {
                "folder": init_dir.resolve().name,
                "step": record["step"],
                "rows": record.get("rows"),
                "weights_sha256": record.get("weights_sha256"),
                "top1_top5": held_out_accuracy(
                    kind, params, target, config, vocab, data, eval_rows, states, batch_tokens
                ),
            }
            log(
                f"starting from {init} (step {record['step']}, {record.get('rows')} rows): held-out top-1 "
                f"{init_card['top1_top5']['top1']:.3f}"
            )
        if head_params is not None:
            weights, r2, fitted = kind.start_from_head(head_params, target, data, train_rows, states)
            for name, w in opt.params.items():
                w[...] = weights[name]
            init_card = {
                "head": head_dir.resolve().name,
                "weights_sha256": head_config.get("weights_sha256"),
                "fuse_r2": round(r2, 4),
                "fit_positions": fitted,
                "top1_top5": held_out_accuracy(
                    kind, params, target, config, vocab, data, eval_rows, states, batch_tokens
                ),
            }
            log(
                f"starting from the head in {head_dir} (fuse fitted on {fitted:,} positions, R^2 {r2:.3f}): held-out "
                f"top-1 {init_card['top1_top5']['top1']:.3f}"
            )
        before = held_out_accuracy(kind, initial, target, config, vocab, data, eval_rows, states, batch_tokens)

        checkpointed = settings if init_card is None else {**settings, "init": init_card}  # what checkpoints record
        t1 = time.perf_counter()
        epoch_batches: list[list[int]] = []
        bar = tqdm(
            range(start, steps),
            desc=f"train {kind.name}",
            unit="step",
            disable=not progress,
            initial=start,
            total=steps,
        )
        with np.errstate(over="ignore", invalid="ignore"):
            for step in bar:
                epoch, within = divmod(step, batches_per_epoch)
                if within == 0 or not epoch_batches:  # each epoch's order depends on (seed, epoch) only: resumable
                    epoch_batches = row_batches(data, train_rows, batch_tokens, np.random.default_rng([seed, epoch]))
                batch = make_batch(data, epoch_batches[within % len(epoch_batches)], states, vocab)
                loss, parts, grads = kind.loss_and_grads(params, target, config, vocab, batch)
                take_step(opt, loss, parts, grads, step, steps, lr, bar, save_every, out, checkpointed)
        train_s = time.perf_counter() - t1
        _check_finite_weights(params, steps, lr)
        after = held_out_accuracy(kind, params, target, config, vocab, data, eval_rows, states, batch_tokens)
        card = {
            **config,
            "data": {
                "folder": Path(data_dir).name,
                "requests_sha256": data.settings.get("requests_sha256"),
                "rows_train": len(train_rows),
                "rows_held_out": len(eval_rows),
                "reply_tokens_train": int(sum(len(data.replies[r]) for r in train_rows)),
                "reply_tokens_held_out": int(sum(len(data.replies[r]) for r in eval_rows)),
                "held_out_rule": f"sha256(request text) in the first {held_out:g} of its range",
            },
            "steps": steps,
            "epochs": round(steps / batches_per_epoch, 2),
            "batch_tokens": batch_tokens,
            "lr": lr,
            "seed": seed,
            "vocab_top": vocab_top,
            "states_seconds": round(states_s, 1),
            "train_seconds": round(train_s, 1),
            "held_out": {"untrained": before, "trained": after},
            "command": command,
        }
        if settings.get("training_time_test"):
            card["training_time_test"] = True
        if init_card is not None:
            card["init"] = init_card
        if hasattr(kind, "save"):
            kind.save(out, target, params, card, vocab)
        else:
            save_heads(out, kind.name, target, params, card, vocab)
    log(
        f"held-out ({after['positions']:,} reply positions of {len(eval_rows)} rows), teacher-forced: top-1 "
        f"{before['top1']:.3f} -> {after['top1']:.3f}, top-5 {before['top5']:.3f} -> {after['top5']:.3f}; "
        f"by reply position {after['top1_by_position']}"
        + (
            f"; second draft token (from its own output) {before['top1_second']:.3f} -> {after['top1_second']:.3f}"
            if "top1_second" in after
            else ""
        )
    )
    log(f"saved a {kind.name} head for {target.name!r} in {out} ({train_s:.0f} s training, {steps} steps)")
    return card


def command_line() -> str:
    """The command as typed (for the card)."""
    return " ".join(["python -m specdec.train"] + sys.argv[1:])
