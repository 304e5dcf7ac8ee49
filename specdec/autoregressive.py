"""Plain autoregressive sampling: one target forward pass per new token.

The baseline speculative decoding is measured against, and the reference its
output distribution must equal. Also home to the checks on a request that
both samplers share.
"""

from __future__ import annotations

import numpy as np

from .model.gpt2 import GPT2
from .result import DecodeResult, TokenCallback
from .sampling import SamplingParams, check_finite_logits, draw, greedy, probabilities


def check_request(model: GPT2, prompt, n_tokens: int) -> list[int]:
    """Validate a prompt (token ids, or text for a model with a tokenizer) and a length
    against a model; return the prompt as a list of ints."""
    if isinstance(prompt, str):
        if model.tokenizer is None:
            raise ValueError(
                "the prompt is text but this model has no tokenizer: pass token ids (encode the text with "
                "the tokenizer the model was trained with)"
            )
        prompt = model.tokenizer.encode(prompt, allowed_special="all")
    prompt = [int(t) for t in np.asarray(prompt, dtype=np.int64).reshape(-1)]
    if not prompt:
        raise ValueError(
            "the prompt is empty: GPT-2 needs at least one token to condition on; to start "
            "from nothing pass [tokenizer.eot_token] (<|endoftext|>, id 50256), as GPT-2 was trained"
        )
    if min(prompt) < 0 or max(prompt) >= model.n_vocab:
        raise ValueError(f"prompt token ids must lie in 0..{model.n_vocab - 1}")
    if not isinstance(n_tokens, (int, np.integer)) or n_tokens < 0:
        raise ValueError(f"n_tokens must be a non-negative integer, got {n_tokens!r}")
    if len(prompt) + n_tokens > model.n_ctx:
        raise ValueError(
            f"prompt ({len(prompt)} tokens) + n_tokens ({n_tokens}) exceeds the context window "
            f"of {model.n_ctx}: shorten the prompt or ask for at most {max(0, model.n_ctx - len(prompt))} tokens"
        )
    return prompt


def make_rng(seed: int | None, rng: np.random.Generator | None) -> np.random.Generator:
    if seed is not None and rng is not None:
        raise ValueError("pass either seed or rng, not both")
    return rng if rng is not None else np.random.default_rng(seed)


def autoregressive_sample(
    model: GPT2, prompt_ids, n_tokens: int,
    temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
    seed: int | None = None, rng: np.random.Generator | None = None, on_token: TokenCallback | None = None,
) -> DecodeResult:  # fmt: skip
    """Generate n_tokens after prompt_ids (token ids, or text when the model has a tokenizer),
    one forward pass each.

    The first pass reads the whole prompt into the KV cache; each later pass
    feeds only the previous token. Temperature 0 is greedy decoding.

        out = autoregressive_sample(model, ids, n_tokens=40, temperature=0.8, top_p=0.95, seed=0)
    """
    params = SamplingParams(temperature, top_k, top_p)
    prompt = check_request(model, prompt_ids, n_tokens)
    rng = make_rng(seed, rng)
    result = DecodeResult(tokenizer=model.tokenizer)
    cache = model.new_cache()
    new = prompt
    for _ in range(n_tokens):
        logits = check_finite_logits(model.forward(new, cache, last_only=True)[0], model.name)  # [n_vocab]
        result.target_calls += 1
        if params.greedy:
            token = greedy(logits)
        else:
            token = draw(probabilities(logits[None], params)[0], rng)
        result.tokens.append(token)
        if on_token:
            on_token(token, "target")
        new = [token]
    return result
