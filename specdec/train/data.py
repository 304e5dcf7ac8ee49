"""Training data for draft heads: the target's own text and features (self-distillation).

Medusa (Cai et al., arXiv 2401.10774, section 3.3.2) and EAGLE (Li et al., arXiv
2401.15077) both train on what the target itself generates; see the package
docstring (specdec/train/__init__.py) for the whole recipe.
"""

from __future__ import annotations

import json
import math
import zipfile
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .. import safe_io
from ..checkpoints.pairs import show
from ..drafters.heads import model_fingerprint
from ..model.base import CausalLM
from ..model.tokenizer import DEFAULT_SYSTEM
from ..sampling import SamplingParams, draw, greedy, probabilities

F32 = np.float32


# ---------------------------------------------------------------------------
# 1. Self-distillation data.
# ---------------------------------------------------------------------------


def bos_token(target: CausalLM) -> int:
    """<|endoftext|>, which GPT-2 tokenizers put last: every sequence starts with it."""
    return target.tokenizer.eot_token if target.tokenizer is not None else target.n_vocab - 1


def start_tokens(target: CausalLM) -> list[int]:
    """Where every self-distilled sequence starts: <|endoftext|> for a plain language model.

    For a chat model (one with <|im_start|>, as SmolLM2-Instruct) it is the chat
    template's system turn and the opening of a user turn: the model then writes
    a request, closes it with <|im_end|>, and usually answers it, so the heads
    learn from the model's own replies, the text they will draft at run time
    (Medusa-2 and EAGLE self-distil from replies to chat prompts in the same spirit).
    """
    tokenizer = target.tokenizer
    if "<|im_start|>" not in getattr(tokenizer, "_special_tokens", {}):
        return [bos_token(target)]
    return (
        tokenizer.encode("<|im_start|>system\n", allowed_special="all")
        + tokenizer.encode(DEFAULT_SYSTEM)
        + tokenizer.encode("<|im_end|>\n<|im_start|>user\n", allowed_special="all")
    )


def self_distill(
    target: CausalLM,
    n_tokens: int,
    seq_len: int,
    rng: np.random.Generator,
    greedy_frac: float = 0.5,
    prompt_len: int = 4,
    progress: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Text the target writes itself, with its features.

    Returns tokens [n_seq, seq_len] int64 and features [n_seq, seq_len, n_embd]
    float32, features[s, t] being the target's hidden state (after the final norm)
    after reading tokens[s, :t+1], the one whose logits chose tokens[s, t+1].
    Every sequence begins with start_tokens(target). A fraction greedy_frac of
    the sequences continue greedily after prompt_len sampled tokens; the others
    keep sampling at T=1.
    """
    if seq_len > target.n_ctx:
        raise ValueError(f"--seq-len {seq_len} exceeds the model's context of {target.n_ctx}")
    start = start_tokens(target)
    if seq_len < len(start) + prompt_len:
        raise ValueError(
            f"--seq-len {seq_len} leaves no room to write: each sequence starts with {len(start)} "
            f"tokens of {target.name}'s chat template; use at least {len(start) + 2 * prompt_len}"
        )
    n_seq = max(1, math.ceil(n_tokens / seq_len))
    tokens = np.zeros((n_seq, seq_len), np.int64)
    features = np.zeros((n_seq, seq_len, target.n_embd), F32)
    sample = SamplingParams(temperature=1.0)
    bar = tqdm(total=n_seq * seq_len, desc="self-distillation", unit="tok", disable=not progress, leave=False)
    for s in range(n_seq):
        greedy_run = rng.random() < greedy_frac
        cache = target.new_cache(seq_len)
        tokens[s, : len(start)] = start
        if len(start) > 1:  # the template's tokens in one pass, features kept
            _, hidden = target.forward(start[:-1], cache, return_hidden=True)
            features[s, : len(start) - 1] = hidden
        token = start[-1]
        for t in range(len(start) - 1, seq_len):
            tokens[s, t] = token
            logits, hidden = target.forward([token], cache, return_hidden=True)
            features[s, t] = hidden[0]
            if greedy_run and t >= len(start) - 1 + prompt_len:
                token = greedy(logits[0])
            else:
                token = draw(probabilities(logits, sample)[0], rng)
        bar.update(seq_len)
    bar.close()
    return tokens, features


def load_or_make_data(
    path: Path, target: CausalLM, n_tokens: int, seq_len: int, seed: int, greedy_frac: float, progress: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Self-distillation data, cached in `path`: reused when made for the same model and settings
    (and checked: read_data), made afresh otherwise."""
    meta = {
        "model_fingerprint": model_fingerprint(target),
        "n_tokens": n_tokens,
        "seq_len": seq_len,
        "seed": seed,
        "greedy_frac": greedy_frac,
        "start": start_tokens(target),
    }
    if path.exists() or path.is_symlink():
        cached = read_data(path, meta, target)
        if cached is not None:
            return cached
    rng = np.random.default_rng(seed)
    tokens, features = self_distill(target, n_tokens, seq_len, rng, greedy_frac, progress=progress)
    with safe_io.replacing(path, mode=0o600) as f:  # a cache of this user's run
        np.savez(f, tokens=tokens, features=features, meta=json.dumps(meta))
    return tokens, features


def read_data(path: Path, meta: dict, target: CausalLM) -> tuple[np.ndarray, np.ndarray] | None:
    """The data cached in `path` if its meta is `meta` (None when made with other settings: it is made
    again), after checking it: ValueError naming the file if it is not readable, not shaped as the
    settings say, has token ids outside the vocabulary or features that are not finite."""
    fix = "delete it and run again (it is a cache: it is made afresh)"
    try:
        with safe_io.open_regular(path) as f, safe_io.open_npz(f) as data:  # no FIFO, no pickle, no zip bomb
            if "meta" not in data.files:
                raise ValueError("it has no 'meta' entry")
            if json.loads(str(data["meta"])) != meta:
                return None
            missing = [key for key in ("tokens", "features") if key not in data.files]
            if missing:
                raise ValueError(f"it has no {missing[0]!r} entry")
            tokens, features = data["tokens"], data["features"]
    except (OSError, ValueError, EOFError, RecursionError, zipfile.BadZipFile) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else show(str(e), 120).strip("'\"")
        raise ValueError(f"{path}: not readable training data ({reason}); {fix}") from e
    n_seq = max(1, math.ceil(meta["n_tokens"] / meta["seq_len"]))
    if tokens.shape != (n_seq, meta["seq_len"]) or tokens.dtype.kind not in "iu":
        raise ValueError(
            f"{path}: tokens are {tokens.dtype} of shape {tokens.shape}, not whole numbers of shape "
            f"{(n_seq, meta['seq_len'])}; {fix}"
        )
    if features.shape != (n_seq, meta["seq_len"], target.n_embd) or features.dtype != F32:
        raise ValueError(
            f"{path}: features are {features.dtype} of shape {features.shape}, not float32 of shape "
            f"{(n_seq, meta['seq_len'], target.n_embd)}; {fix}"
        )
    if tokens.min() < 0 or tokens.max() >= target.n_vocab:
        raise ValueError(f"{path}: token ids outside 0..{target.n_vocab - 1}; {fix}")
    if not np.isfinite(features).all():
        raise ValueError(f"{path}: features hold NaN or infinite values; {fix}")
    return tokens, features


def text_data(target: CausalLM, text: str, seq_len: int, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Held-out text for teacher-forced evaluation: windows of seq_len tokens and the target's features.

    Returns tokens [n_seq, seq_len] and features [n_seq, seq_len, n_embd], as self_distill does,
    from consecutive windows of the text (at most max_tokens tokens in all).
    """
    if target.tokenizer is None:
        raise ValueError(f"--eval-text needs a tokenizer, and the model {target.name!r} has none")
    ids = target.tokenizer.encode(text, allowed_special="all")[:max_tokens]
    n_seq = len(ids) // seq_len
    if n_seq == 0:
        raise ValueError(f"--eval-text: {len(ids)} tokens are fewer than one window of --seq-len {seq_len}")
    tokens = np.array(ids[: n_seq * seq_len], np.int64).reshape(n_seq, seq_len)
    features = np.stack([target.forward(row, target.new_cache(seq_len), return_hidden=True)[1] for row in tokens])
    return tokens, features
