"""Self-distillation data at scale: a chat model answers many requests, batched, in resumable shards.

What it adds over data.py (one sequence at a time, features kept in memory):
the target answers real chat requests (train/requests.py), B replies at a time
with the packed ragged batch (model.forward_batch; a finished row's place is
refilled by the next request in the same pass), and what training needs is
written to disk shard by shard (train/shards.py: the folder's format, and the
reader that checks it), so a run of hours survives being killed.

Determinism: row r (counted over the whole run) answers request r mod
n_requests with np.random.default_rng((seed, r)) for its draws, and is greedy
when default_rng((seed, r, 1)).random() < greedy_frac. Shard s always holds rows
s * shard_rows ... (s + 1) * shard_rows - 1, batched in the same order, so
regenerating a shard gives the same bytes: resuming after kill -9 gives the data
an uninterrupted run gives.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..checkpoints import locks
from ..drafters.heads import model_fingerprint
from ..model.attention import KVCache, check_rows_fit
from ..model.tokenizer import DEFAULT_SYSTEM, chat_prompt
from ..sampling import SamplingParams, check_finite_logits, draw, greedy, probabilities
from .requests import OVERLAP_N, RequestPool
from .shards import (
    FORMAT,
    LOCK,
    MANIFEST,
    DistillSettings,
    read_manifest,
    shard_rows_of,
    trusted_shards,
    write_manifest,
    write_shard,
)


def check_data_settings(
    n_tokens: int, batch: int, max_reply: int, temperature: float, greedy_frac: float, top_k: int, shard_rows: int
) -> None:
    """ValueError, saying which flag to fix, for settings no run can use."""
    for name, value in (
        ("--tokens", n_tokens),
        ("--batch", batch),
        ("--max-reply", max_reply),
        ("--top-k", top_k),
        ("--shard-rows", shard_rows),
    ):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    if not 0 < temperature <= 10:
        raise ValueError(f"--temperature is the sampled rows' temperature, in (0, 10], got {temperature}")
    if not 0 <= greedy_frac <= 1:
        raise ValueError(f"--greedy-frac must be in [0, 1], got {greedy_frac}")


# ---------------------------------------------------------------------------
# 1. Replies, batched, with refills.
# ---------------------------------------------------------------------------


@dataclass
class Reply:
    """One request being answered: its prompt, its mode, its generator, and what it has written so far."""

    prompt: list[int]
    greedy: bool
    rng: np.random.Generator
    cache: KVCache | None = None  # its KV cache while it is in the batch
    tokens: list[int] = field(default_factory=list)
    top_ids: list[np.ndarray] = field(default_factory=list)  # one [top_k] per reply token
    top_probs: list[np.ndarray] = field(default_factory=list)
    ended: bool = False


def top_k_of(p: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k most likely tokens of p [n_vocab], most likely first (ties: lower id first): (ids, probs)."""
    k = min(k, len(p))
    ids = np.argpartition(-p, k - 1)[:k]  # the k largest, unordered
    ids = ids[np.lexsort((ids, -p[ids]))]  # by probability, then id: the same order every time
    return ids.astype(np.int32), p[ids]


def answer(
    model,
    replies: list[Reply],
    max_reply: int,
    batch: int,
    top_k: int,
    params: SamplingParams,
    stop: int | None,
    on_step: Callable[[int], None] | None = None,
) -> list[Reply]:
    """Decode every reply, `batch` rows at a time: one model.forward_batch per step for all rows in the batch.

    A row enters with its whole prompt (its prefill shares the pass with the other
    rows' single new tokens: the batch is ragged), and leaves after `stop` or
    max_reply tokens; the next waiting row takes its place in the next pass.
    Each row's tokens depend only on its own prompt, mode and generator (up to
    float32 rounding of the packed products). on_step(new tokens) after every pass.
    """
    waiting, active = deque(replies), []
    probs_t1 = SamplingParams(temperature=1.0)
    while waiting or active:
        while waiting and len(active) < batch:
            row = waiting.popleft()
            row.cache = model.new_cache(min(model.n_ctx, len(row.prompt) + max_reply))
            active.append(row)
        feed = [row.tokens[-1:] or row.prompt for row in active]  # a new row: its prompt; else its last token
        logits = model.forward_batch(feed, [row.cache for row in active], last_only=True)
        for row, row_logits in zip(active, logits):
            row_logits = check_finite_logits(row_logits[0], model.name)  # [n_vocab]
            p = probabilities(row_logits[None], probs_t1)[0]  # [n_vocab] the target's distribution at T=1
            ids, top = top_k_of(p, top_k)
            if row.greedy:
                token = greedy(row_logits)  # argmax: its own branch, not a tiny temperature
            else:
                token = draw(p if params.temperature == 1.0 else probabilities(row_logits[None], params)[0], row.rng)
            row.tokens.append(token)
            row.top_ids.append(ids)
            row.top_probs.append(top)
            row.ended = token == stop
        if on_step:
            on_step(len(active))
        for row in active:
            if row.ended or len(row.tokens) >= max_reply or len(row.prompt) + len(row.tokens) >= model.n_ctx:
                row.cache = None  # leaves the batch; its memory goes
        active = [row for row in active if row.cache is not None]
    return replies


# ---------------------------------------------------------------------------
# 2. A shard's rows, made afresh.
# ---------------------------------------------------------------------------


def make_shard(
    model, pool: RequestPool, settings: DistillSettings, index: int, on_step: Callable[[int], None] | None = None
) -> dict[str, np.ndarray]:
    """Shard `index`'s arrays (SHARD_ARRAYS), made afresh: the same for the same model, pool and settings."""
    tokenizer = model.tokenizer
    stop = tokenizer._special_tokens["<|im_end|>"]
    rows = list(shard_rows_of(settings, index))
    requests = [r % len(pool.requests) for r in rows]
    replies = [
        Reply(
            chat_prompt(tokenizer, pool.requests[q], settings.system),
            bool(np.random.default_rng((settings.seed, r, 1)).random() < settings.greedy_frac),
            np.random.default_rng((settings.seed, r)),
        )
        for r, q in zip(rows, requests)
    ]
    answer(
        model,
        replies,
        settings.max_reply,
        settings.batch,
        settings.top_k,
        SamplingParams(temperature=settings.temperature),
        stop,
        on_step,
    )

    def offsets(lists):
        return np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)

    return {
        "row": np.array(rows, np.int64),
        "request": np.array(requests, np.int64),
        "greedy": np.array([r.greedy for r in replies], bool),
        "ended": np.array([r.ended for r in replies], bool),
        "prompt_offsets": offsets([r.prompt for r in replies]),
        "prompt_ids": np.concatenate([r.prompt for r in replies]).astype(np.int32),
        "reply_offsets": offsets([r.tokens for r in replies]),
        "reply_ids": np.concatenate([r.tokens for r in replies]).astype(np.int32),
        "top_ids": np.concatenate([np.stack(r.top_ids) for r in replies]).astype(np.int32),
        "top_probs": np.concatenate([np.stack(r.top_probs) for r in replies]).astype(np.float16),
        "request_text": np.array([pool.requests[q] for q in requests], dtype=str),
        "reply_text": np.array([tokenizer.decode(r.tokens[:-1] if r.ended else r.tokens) for r in replies], dtype=str),
    }


# ---------------------------------------------------------------------------
# 3. The run: shards until n_tokens reply tokens, resumable.
# ---------------------------------------------------------------------------


def make_data(
    model,
    out: str | Path,
    n_tokens: int,
    pool: RequestPool,
    batch: int = 16,
    max_reply: int = 256,
    temperature: float = 1.0,
    greedy_frac: float = 0.5,
    top_k: int = 8,
    shard_rows: int = 64,
    seed: int = 0,
    system: str = DEFAULT_SYSTEM,
    log: Callable[[str], None] | None = None,
    stop_after: int | None = None,
) -> dict:
    """Answer pool's requests with `model` until the shards hold n_tokens reply tokens; the manifest.

    Resumes: shards already in out/manifest.json, and whose sha256 checks, are kept;
    a missing, truncated or foreign one is made again. Refuses (ValueError) a folder made
    with other settings or another model. log(line) gets progress (tokens, tokens/s, ETA).
    stop_after: make at most this many shards in this call (tests: a run cut short).
    """
    check_data_settings(n_tokens, batch, max_reply, temperature, greedy_frac, top_k, shard_rows)
    if model.tokenizer is None or "<|im_end|>" not in getattr(model.tokenizer, "_special_tokens", {}):
        raise ValueError(
            f"distillation data needs a chat model (a tokenizer with <|im_start|> and <|im_end|>, "
            f"such as smollm2-135m); {model.name} has none"
        )
    # The rows decoded side by side (a shard's at most), each with a KV cache of its reply and more: their
    # memory checked before a single row is made.
    check_rows_fit(model.hparams, min(batch, shard_rows), max(64, max_reply + 1), f"--batch {batch}")
    log = log or (lambda line: None)
    settings = DistillSettings(
        model.name,
        model_fingerprint(model),
        seed,
        batch,
        max_reply,
        float(temperature),
        float(greedy_frac),
        top_k,
        shard_rows,
        system,
        pool.sha256,
        len(pool.requests),
    )
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    # One writer per folder: a second run would make the same shards and race on the manifest.
    with locks.exclusive(folder / LOCK, wait=False) as held:  # (opened without following a link)
        if not held:
            raise ValueError(f"{folder} is being written by another run; wait for it, or use another --out")
        return _make_data(model, folder, n_tokens, pool, settings, log, stop_after)


def _make_data(model, folder: Path, n_tokens: int, pool: RequestPool, settings: DistillSettings, log, stop_after):
    """make_data, with the folder locked."""
    manifest = read_manifest(folder)
    if manifest is not None and manifest.get("settings") != asdict(settings):
        old = manifest.get("settings") or {}
        diff = [k for k, v in asdict(settings).items() if old.get(k) != v]
        raise ValueError(
            f"{folder} holds data made with other settings ({', '.join(diff) or 'unknown'} differ); "
            f"use another --out, or the same settings to resume"
        )
    if manifest is None:
        manifest = {"format": FORMAT, "settings": asdict(settings), "shards": []}
    manifest["requests"] = {
        "distinct": len(pool.requests),
        "templated": pool.n_templated,
        "docstrings": pool.n_docs,
        "dropped_for_overlap": len(pool.dropped),
        "overlap_n": OVERLAP_N,
    }
    good = trusted_shards(folder, manifest, model.n_vocab, log)
    manifest["shards"] = [good.get(i) for i in range(len(manifest["shards"]))]
    # What a killed run leaves behind: temporary files, and shards renamed before the manifest named them.
    for path in [*folder.glob(".shard-*.tmp"), *folder.glob(f".{MANIFEST}.*.tmp"), *folder.glob("shard-*.npz")]:
        if path.name not in {e["file"] for e in good.values()}:
            path.unlink()
    done = sum(e["reply_tokens"] for e in good.values())
    log(f"{folder}: {len(good)} shards trusted, {done:,} of {n_tokens:,} reply tokens")
    start, made_tokens, made, index = time.perf_counter(), 0, 0, 0
    shown = [start, 0]  # when progress was last logged; tokens so far in the current shard

    def on_step(n_new: int) -> None:
        shown[1] += n_new
        now = time.perf_counter()
        if now - shown[0] >= 60:
            rate = (made_tokens + shown[1]) / (now - start)
            log(
                f"shard {index}: {done + shown[1]:,} / {n_tokens:,} reply tokens, {rate:.1f} tokens/s, "
                f"ETA {max(0, n_tokens - done - shown[1]) / rate / 60:.0f} min"
            )
            shown[0] = now

    while done < n_tokens and (stop_after is None or made < stop_after):
        if index in good:
            index += 1
            continue
        t0, shown[1] = time.perf_counter(), 0
        arrays = make_shard(model, pool, settings, index, on_step)
        entry = write_shard(folder, index, arrays)
        entry["seconds"] = round(time.perf_counter() - t0, 1)
        manifest["shards"] += [None] * (index + 1 - len(manifest["shards"]))
        manifest["shards"][index] = entry
        done += entry["reply_tokens"]
        manifest["reply_tokens"] = done
        manifest["complete"] = done >= n_tokens
        write_manifest(folder, manifest)
        made, made_tokens = made + 1, made_tokens + entry["reply_tokens"]
        rate = made_tokens / (time.perf_counter() - start)
        eta = max(0, n_tokens - done) / rate
        log(
            f"shard {index}: {entry['rows']} rows, {entry['reply_tokens']:,} tokens in {entry['seconds']:.0f} s; "
            f"{done:,} / {n_tokens:,} reply tokens, {rate:.1f} tokens/s, ETA {eta / 60:.0f} min"
        )
        index += 1
    manifest["reply_tokens"] = done
    manifest["complete"] = done >= n_tokens
    write_manifest(folder, manifest)
    return manifest
