"""The training loop for draft heads: one step per kind, held-out accuracy, the run (its checkpoints: resume.py)."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..config import whole_number
from ..checkpoints import locks
from ..drafters import eagle, eagle_grad, medusa
from ..drafters.heads import DraftVocab, model_fingerprint, one_hot, save_heads, target_distributions, top_tokens
from ..model.base import CausalLM
from .data import load_or_make_data, text_data
from .optim import AdamW, cosine_lr
from .resume import read_checkpoint, save_checkpoint

F32 = np.float32
DEFAULT_LR = {"medusa": 1e-3, "eagle": 1e-3}
LOCK_FILE = ".specdec-train.lock"  # held by the training writing into a folder


# ---------------------------------------------------------------------------
# 2-3. Batches, losses, one training step per kind.
# ---------------------------------------------------------------------------


def labels(target: CausalLM, vocab: DraftVocab, tokens: np.ndarray, features: np.ndarray, kind: str) -> np.ndarray:
    """What a head should put on each draft-vocabulary token at these positions.

    tokens: [n] the token that followed each position; features: [n, n_embd] the
    target's features there -> [n, N]: the target's distribution ("dist") or
    point masses on the actual tokens ("tokens"), restricted to the draft vocabulary.
    """
    if kind == "dist":
        return target_distributions(features, vocab, target)
    p = one_hot(tokens, target.n_vocab)
    return vocab.targets(p)


def medusa_step(params, target, vocab, tokens, features, n_heads, label_kind):
    """Medusa-1 loss on B sequences [B, T]: head i reads h_t and learns token t+i+2.

    With T positions, head i has rows t = 0 .. T-i-3; its label is the target's
    distribution at position t+i+1 (the one that chose x_(t+i+2)), or x_(t+i+2).
    """
    B, T, e = features.shape
    hs, targets = [], []
    for i in range(n_heads):
        n = T - i - 2  # rows per sequence with a token i+2 places ahead
        hs.append(features[:, :n].reshape(-1, e))  # h_t, t = 0 .. n-1
        after = features[:, i + 1 : i + 1 + n].reshape(-1, e)  # the target's features that chose x_(t+i+2)
        targets.append(labels(target, vocab, tokens[:, i + 2 :].reshape(-1), after, label_kind))
    loss, per_head, grads = medusa.loss_and_grads(params, hs, targets, vocab)
    return loss, {f"ce{i}": ce for i, ce in enumerate(per_head)}, grads


def eagle_step(params, target, vocab, tokens, features, label_kind):
    """EAGLE loss on B sequences [B, T]: pair (f_j, x_(j+1)) predicts f_(j+1) and x_(j+2), j = 0 .. T-3."""
    B, T, e = features.shape
    f, f_next = features[:, : T - 2], features[:, 1 : T - 1]  # [B, T-2, e]
    emb = target.weights.wte[tokens[:, 1 : T - 1]]  # [B, T-2, e]
    p = labels(target, vocab, tokens[:, 2:].reshape(-1), f_next.reshape(-1, e), label_kind)
    n_head, eps = target.n_head, target.hparams.layer_norm_epsilon
    loss, (l_feat, ce), grads, _ = eagle_grad.loss_and_grads(params, f, emb, f_next, p, vocab, n_head, eps)
    return loss, {"feat": l_feat, "ce": ce}, grads


# ---------------------------------------------------------------------------
# 4. Held-out teacher-forced accuracy.
# ---------------------------------------------------------------------------


def head_logits_for_eval(kind, params, target, vocab, tokens, features, n_heads):
    """Per head: (logits [n, N], the true next tokens [n]) over every usable position, teacher-forced."""
    B, T, e = features.shape
    if kind == "medusa":
        out = []
        for i in range(n_heads):
            n = T - i - 2
            z = medusa.head_logits(params, features[:, :n].reshape(-1, e), vocab, heads=[i])[0]
            out.append((z, tokens[:, i + 2 :].reshape(-1)))
        return out
    emb = target.weights.wte[tokens[:, 1 : T - 1]]  # [B, T-2, e]
    y, _ = eagle_grad.forward(params, features[:, : T - 2], emb, target.n_head, target.hparams.layer_norm_epsilon)
    return [(vocab.logits(y.reshape(-1, e)), tokens[:, 2:].reshape(-1))]


def accuracy(kind, params, target, vocab, tokens, features, n_heads) -> list[tuple[float, float]]:
    """Teacher-forced (top-1, top-5) accuracy of each head on (tokens, features)."""
    result = []
    for z, truth in head_logits_for_eval(kind, params, target, vocab, tokens, features, n_heads):
        top5 = vocab.ids[np.argsort(-z, axis=-1, kind="stable")[:, :5]]  # [n, 5] token ids, best first
        result.append((float((top5[:, 0] == truth).mean()), float((top5 == truth[:, None]).any(axis=1).mean())))
    return result


def accuracy_table(before, after) -> str:
    """Medusa's table format: one row per head, top-1 and top-5, untrained -> trained."""
    lines = ["head   top-1 (untrained -> trained)   top-5 (untrained -> trained)"]
    for i, ((b1, b5), (a1, a5)) in enumerate(zip(before, after)):
        lines.append(f"{i:>4}   {b1:>10.3f} -> {a1:.3f}            {b5:>10.3f} -> {a5:.3f}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# The training run.
# ---------------------------------------------------------------------------


def check_settings(
    kind: str,
    n_tokens: int,
    n_heads: int,
    steps: int | None,
    batch: int,
    seq_len: int,
    lr: float | None,
    vocab_top: int | None,
    label_kind: str,
    greedy_frac: float,
    eval_tokens: int | None,
    save_every: int,
) -> None:
    """The settings that need no model, checked before anything is loaded, generated or allocated
    (ValueError naming the flag). train() calls it; the CLI calls it before loading the model."""
    if kind not in ("medusa", "eagle"):
        raise ValueError(f"kind must be 'medusa' or 'eagle', got {kind!r}")
    for value, flag in (
        (n_tokens, "--tokens"),
        (n_heads, "--heads"),
        (batch, "--batch"),
        (seq_len, "--seq-len"),
        (save_every, "--save-every"),
    ):
        whole_number(value, flag, 1)
    for value, flag in ((steps, "--steps"), (vocab_top, "--vocab-top"), (eval_tokens, "--eval-tokens")):
        if value is not None:
            whole_number(value, flag, 1)
    if label_kind not in ("dist", "tokens"):
        raise ValueError(f"--labels must be 'dist' or 'tokens', got {label_kind!r}")
    if lr is not None and not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"--lr must be a finite number > 0, got {lr!r}")
    if not (isinstance(greedy_frac, (int, float)) and 0 <= greedy_frac <= 1):  # (NaN fails both)
        raise ValueError(f"--greedy-frac must be a number from 0 to 1, got {greedy_frac!r}")


def data_bytes(n_tokens: int, seq_len: int, n_embd: int) -> int:
    """Memory for self-distilled data: every position's token (int64) and feature vector (float32)."""
    return max(1, math.ceil(n_tokens / seq_len)) * seq_len * (8 + 4 * n_embd)


def memory_bytes() -> int | None:
    """This machine's physical memory, where the system says (None elsewhere)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def train(
    kind: str,
    target: CausalLM,
    n_tokens: int,
    out: str | Path,
    n_heads: int = 4,
    steps: int | None = None,
    batch: int = 8,
    seq_len: int = 64,
    lr: float | None = None,
    vocab_top: int | None = None,
    label_kind: str = "dist",
    greedy_frac: float = 0.5,
    seed: int = 0,
    resume: bool = False,
    eval_tokens: int | None = None,
    save_every: int = 100,
    progress: bool = True,
    eval_text: str | None = None,
    log=print,
) -> dict:
    """Make data, train heads, evaluate them, save them in `out`; returns the saved config.

    Everything is checked before the work it guards: the settings, the memory the data
    will take, a checkpoint to resume from, the data cached in `out`. One training at a
    time writes into `out` (a lock file there; a second one refuses at once: waiting
    would only let it overwrite the first one's heads). A NaN or infinite loss stops the
    run with a message, and heads are saved only if every value is finite.
    """
    check_settings(
        kind, n_tokens, n_heads, steps, batch, seq_len, lr, vocab_top, label_kind, greedy_frac, eval_tokens, save_every
    )
    seq_len = min(seq_len, target.n_ctx)
    if seq_len < n_heads + 3:
        raise ValueError(f"--seq-len {seq_len} is too short for {n_heads} heads (need at least {n_heads + 3})")
    if vocab_top is not None and not 1 <= vocab_top <= target.n_vocab:
        raise ValueError(f"--vocab-top must be in 1..{target.n_vocab}, got {vocab_top}")
    eval_tokens = eval_tokens or max(4 * seq_len, n_tokens // 8)
    needed = data_bytes(n_tokens, seq_len, target.n_embd) + data_bytes(eval_tokens, seq_len, target.n_embd)
    memory = memory_bytes()
    if memory is not None and needed > memory:  # refused before allocating (or generating) anything
        raise ValueError(
            f"--tokens {n_tokens} and --eval-tokens {eval_tokens} need about {needed / 1e9:,.1f} GB for the "
            f"target's features ({target.n_embd} float32 values per token), more than this machine's "
            f"{memory / 1e9:,.1f} GB of memory: use fewer tokens"
        )
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; give a folder (it is made if missing)")
    out.mkdir(parents=True, exist_ok=True)
    lr = DEFAULT_LR[kind] if lr is None else float(lr)
    with locks.exclusive(out / LOCK_FILE, wait=False) as held:
        if not held:
            raise ValueError(
                f"{out}: another training is writing into this folder (it holds {out / LOCK_FILE}); "
                f"wait for it to end, or choose another --out"
            )
        if kind == "eagle":
            n_heads = 1  # one draft model
        shapes = (medusa if kind == "medusa" else eagle).param_shapes(n_heads, target.n_embd)
        settings = {
            "kind": kind,
            "model_fingerprint": model_fingerprint(target),
            "n_heads": n_heads,
            "vocab_top": vocab_top,
            "labels": label_kind,
            "n_tokens": n_tokens,
            "seq_len": seq_len,
            "seed": seed,
            "batch": batch,
        }
        saved = read_checkpoint(out, settings, shapes, steps) if resume else None  # before hours of data making

        t0 = time.perf_counter()
        tokens, features = load_or_make_data(out / "data.npz", target, n_tokens, seq_len, seed, greedy_frac, progress)
        ev_tokens, ev_features = load_or_make_data(
            out / "eval.npz", target, eval_tokens, seq_len, seed + 1_000_003, greedy_frac, progress
        )
        if eval_text is not None:  # checked (and its features computed) before any training
            tx_tokens, tx_features = text_data(target, eval_text, seq_len, max(eval_tokens, 4096))
        data_s = time.perf_counter() - t0
        n_seq = len(tokens)
        steps = steps if steps is not None else max(1, 4 * n_seq // batch)  # about 4 epochs
        ids = (
            None if vocab_top is None or vocab_top >= target.n_vocab else top_tokens(tokens, vocab_top, target.n_vocab)
        )
        vocab = DraftVocab.of(target, ids)

        rng = np.random.default_rng(seed)
        params = (
            medusa.init_params(n_heads, target.n_embd)
            if kind == "medusa"
            else eagle_grad.init_params(target.n_embd, rng)
        )
        initial = {name: a.copy() for name, a in params.items()}  # the untrained heads, the baseline
        opt = AdamW(params, lr=lr, weight_decay=0.0)
        start = 0
        if saved is not None:
            record, tensors = saved
            start, adam_t = record["step"], record["adam_t"]
            if start > steps:
                raise ValueError(
                    f"--resume: the checkpoint in {out} is at step {start}, past --steps {steps}; "
                    f"use --steps {start} or more"
                )
            for name, w in opt.params.items():
                w[...] = tensors[name]
            opt.load_state(tensors, adam_t)
            log(f"resuming from step {start} of {steps}")

        before = accuracy(kind, initial, target, vocab, ev_tokens, ev_features, n_heads)
        bar = tqdm(
            range(start, steps), desc=f"train {kind}", unit="step", disable=not progress, initial=start, total=steps
        )
        t1 = time.perf_counter()
        # NOTE: NumPy's overflow warnings are off while training: a diverging run is said below, in one line.
        with np.errstate(over="ignore", invalid="ignore"):
            for step in bar:
                order = np.random.default_rng([seed, step]).choice(n_seq, size=min(batch, n_seq), replace=False)
                if kind == "medusa":
                    loss, parts, grads = medusa_step(
                        params, target, vocab, tokens[order], features[order], n_heads, label_kind
                    )
                else:
                    loss, parts, grads = eagle_step(params, target, vocab, tokens[order], features[order], label_kind)
                take_step(opt, loss, parts, grads, step, steps, lr, bar, save_every, out, settings)
        train_s = time.perf_counter() - t1
        trained_rows = (steps - start) * min(batch, n_seq) * seq_len
        _check_finite_weights(params, steps, lr)

        after = accuracy(kind, params, target, vocab, ev_tokens, ev_features, n_heads)
        held_out_text = None
        if eval_text is not None:
            held_out_text = {
                "tokens": int(tx_tokens.size),
                "top1_top5_untrained": accuracy(kind, initial, target, vocab, tx_tokens, tx_features, n_heads),
                "top1_top5": accuracy(kind, params, target, vocab, tx_tokens, tx_features, n_heads),
            }
        config = {
            "n_heads": n_heads,
            "labels": label_kind,
            "train_tokens": int(tokens.size),
            "steps": steps,
            "batch": batch,
            "seq_len": seq_len,
            "lr": lr,
            "seed": seed,
            "data_seconds": round(data_s, 2),
            "train_seconds": round(train_s, 2),
            "train_tokens_per_second": round(trained_rows / train_s, 1) if trained_rows and train_s > 0 else None,
            "held_out": {"tokens": int(ev_tokens.size), "top1_top5_untrained": before, "top1_top5": after},
            "held_out_text": held_out_text,
        }
        save_heads(out, kind, target, params, config, vocab)
    log(f"held-out self-distilled text ({ev_tokens.size} tokens), teacher-forced:")
    log(accuracy_table(before, after))
    if held_out_text is not None:
        log(f"--eval-text ({held_out_text['tokens']} tokens), teacher-forced:")
        log(accuracy_table(held_out_text["top1_top5_untrained"], held_out_text["top1_top5"]))
    log(
        f"saved {kind} heads for {target.name!r} in {out} ({train_s:.1f} s training, "
        f"{config['train_tokens_per_second']} positions/s)"
    )
    return config


def take_step(
    opt: AdamW,
    loss: float,
    parts: dict,
    grads: dict,
    step: int,
    steps: int,
    lr: float,
    bar,
    save_every: int,
    out: Path,
    settings: dict,
) -> None:
    """One optimizer step of a training run (0-based `step` of `steps`): refuse a non-finite loss, step
    with the warm-up and cosine schedule, show the loss, checkpoint every save_every steps and at the end."""
    if not math.isfinite(loss):  # NOTE: before the step: NaN gradients would make every weight NaN
        raise ValueError(
            f"the loss is {loss} at step {step + 1}: training diverged (NaN or infinite values) and "
            f"nothing was saved; lower --lr (it is {lr:g}) and run again"
        )
    opt.step(grads, lr=cosine_lr(step, steps, lr, warmup=max(1, steps // 20)))
    bar.set_postfix(loss=f"{loss:.3f}", **{k: f"{v:.3f}" for k, v in parts.items()})
    if (step + 1) % save_every == 0 or step + 1 == steps:
        _check_finite_weights(opt.params, step + 1, lr)
        save_checkpoint(out, settings, opt, step + 1)


def _check_finite_weights(params: dict[str, np.ndarray], step: int, lr: float) -> None:
    """A finite loss can still leave NaN weights behind (an infinite step): never save those."""
    bad = [name for name, w in params.items() if not np.isfinite(w).all()]
    if bad:
        raise ValueError(
            f"the weights ({bad[0]!r}) are NaN or infinite after step {step}: training diverged and "
            f"no heads were saved; lower --lr (it is {lr:g}) and run again"
        )
