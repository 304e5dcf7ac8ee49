"""Plain autoregressive sampling: one target forward pass per new token.

The baseline speculative decoding is measured against, and the reference its
output distribution must equal. A request is checked in config.py.
"""

from __future__ import annotations

import numpy as np

from .model.base import CausalLM
from .config import Request, make_config, make_rng, setup
from .result import DecodeResult, TokenCallback
from .sampling import check_finite_logits, draw, greedy, probabilities


def autoregressive_sample(
    model: CausalLM,
    prompt_ids,
    n_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    rng: np.random.Generator | None = None,
    on_token: TokenCallback | None = None,
    chat: bool = False,
    allow_special: bool = False,
) -> DecodeResult:
    """Generate n_tokens after prompt_ids (token ids, or text when the model has a tokenizer),
    one forward pass each. chat=True: the text is a user message to a chat model, and decoding
    stops early after the token that ends the reply. allow_special=True: control strings typed
    in the text ("<|endoftext|>") become control tokens; by default they are plain text.

    The first pass reads the whole prompt into the KV cache; each later pass
    feeds only the previous token. Temperature 0 is greedy decoding.

        out = autoregressive_sample(model, ids, n_tokens=40, temperature=0.8, top_p=0.95, seed=0)
    """
    config = make_config(temperature=temperature, top_k=top_k, top_p=top_p, chat=chat, allow_special=allow_special)
    return decode_autoregressive(
        model, setup(model, None, prompt_ids, n_tokens, config).request, make_rng(seed, rng), on_token
    )


def decode_autoregressive(
    model: CausalLM, request: Request, rng: np.random.Generator, on_token: TokenCallback | None = None
) -> DecodeResult:
    """The loop of autoregressive_sample on a checked request (config.setup)."""
    params, stop = request.params, request.stop
    result = DecodeResult(tokenizer=model.tokenizer)
    cache = model.new_cache()
    new = request.prompt
    for _ in range(request.n_tokens):
        logits = check_finite_logits(model.forward(new, cache, last_only=True)[0], model.name)  # [n_vocab]
        result.target_calls += 1
        if params.greedy:
            token = greedy(logits)
        else:
            token = draw(probabilities(logits[None], params)[0], rng)
        result.tokens.append(token)
        if on_token:
            on_token(token, "target")
        if token == stop:
            break
        new = [token]
    return result
