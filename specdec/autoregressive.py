"""Plain autoregressive sampling: one target forward pass per new token.

The baseline speculative decoding is measured against, and the reference its
output distribution must equal. Also home to the checks on a request that
both samplers share.
"""

from __future__ import annotations

import numbers

import numpy as np

from .model.base import CausalLM
from .model.tokenizer import ENDOFTEXT, chat_prompt, encode_text
from .result import DecodeResult, TokenCallback
from .sampling import SamplingParams, check_finite_logits, draw, greedy, probabilities


def check_request(model: CausalLM, prompt, n_tokens: int, chat: bool = False, allow_special: bool = False) -> list[int]:
    """Validate a prompt (token ids, or text for a model with a tokenizer) and a length
    against a model; return the prompt as a list of ints. chat=True wraps text as one
    user turn of the model's chat template (ChatML, model/tokenizer.chat_prompt).

    The rules every entry point (and the command line) shares:
    - text is plain text: a control string typed in it ("<|endoftext|>", "<|im_end|>") stays
      text unless allow_special=True (model/tokenizer.encode_text);
    - an empty prompt (text or ids) starts from the model's end-of-text token, as GPT-2
      samples unconditionally; with chat=True, empty text is an empty user message;
    - n_tokens is at least 1, and prompt + n_tokens fit the context window.
    """
    if chat:
        end_of_reply(model, chat)  # checks that the model has a chat template
        if not isinstance(prompt, str):
            raise ValueError("chat=True wraps a text prompt as a user message: pass text, not token ids")
        prompt = chat_prompt(model.tokenizer, prompt, allow_special=allow_special)
    if isinstance(prompt, str):
        if model.tokenizer is None:
            raise ValueError(
                "the prompt is text but this model has no tokenizer: pass token ids (encode the text with "
                "the tokenizer the model was trained with)"
            )
        prompt = encode_text(model.tokenizer, prompt, allow_special)
    prompt = check_token_ids(prompt, model.n_vocab)
    if not prompt:
        if ENDOFTEXT not in getattr(model.tokenizer, "special_tokens_set", ()):
            raise ValueError("the prompt is empty and this model has no end-of-text token to start from: give the "
                             "model at least one token to condition on")  # fmt: skip
        prompt = [model.tokenizer.eot_token]
    n_tokens = whole_number(n_tokens, "n_tokens", 1)
    if len(prompt) + n_tokens > model.n_ctx:
        room = model.n_ctx - len(prompt)
        if room >= 1:
            advice = f"shorten the prompt or ask for at most {room} tokens"
        elif n_tokens < model.n_ctx:
            advice = f"shorten the prompt to at most {model.n_ctx - n_tokens} tokens"
        else:
            advice = f"shorten the prompt and ask for fewer than {model.n_ctx} tokens"
        raise ValueError(
            f"prompt ({len(prompt)} tokens) + n_tokens ({n_tokens}) exceeds the context window of {model.n_ctx}: "
            f"{advice}"
        )
    return prompt


def end_of_reply(model: CausalLM, chat: bool) -> int | None:
    """The token that ends a chat reply (<|im_end|>), after which decoding stops; None when not chatting."""
    if not chat:
        return None
    special = getattr(model.tokenizer, "_special_tokens", {}) if model.tokenizer is not None else {}
    if "<|im_start|>" not in special or "<|im_end|>" not in special:
        raise ValueError(f"chat needs a chat model (one whose tokenizer has <|im_start|> and <|im_end|>, such as "
                         f"smollm2-135m); {model.name} has none")  # fmt: skip
    return special["<|im_end|>"]


def check_token_ids(ids, n_vocab: int) -> list[int]:
    """A flat list, tuple or 1-D integer array of token ids in 0..n_vocab-1, as a list of ints.

    NOTE: checked one by one as Python values, before any conversion: np.asarray would
    raise OverflowError on 2**70, truncate 2.7 to 2, flatten [[1, 2], [3]] and take True as 1.
    """
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1:
            raise ValueError(f"the prompt must be text or a flat list of token ids, got a {ids.ndim}-D array")
        if ids.size and ids.dtype.kind not in "iu":
            raise ValueError(f"the prompt must be text or a flat list of token ids, got an array of {ids.dtype}")
        ids = ids.tolist()
    elif not isinstance(ids, (list, tuple, range)):
        raise ValueError(f"the prompt must be text or a flat list of token ids, got {type(ids).__name__}")
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < n_vocab:
            raise ValueError(f"prompt token ids must be whole numbers in 0..{n_vocab - 1}; got {t!r:.40} at position {i}")
    return [int(t) for t in ids]


def whole_number(value, name: str, low: int = 0, high: int | None = None) -> int:
    """value as an int if it is a whole number in low..high (an int or NumPy integer, never a bool), else a
    ValueError naming it. The CLI checks its flags with this too (name "--seed"), so both say the same."""
    ok = not isinstance(value, bool) and isinstance(value, numbers.Integral)
    if ok and value >= low and (high is None or value <= high):
        return int(value)
    limits = f">= {low}" if high is None else f"in {low}..{high}"
    raise ValueError(f"{name} must be {limits} (a whole number), got {value!r:.80}")


def check_seed(seed, name: str = "seed") -> int | None:
    """None (fresh randomness) or a whole number >= 0."""
    return None if seed is None else whole_number(seed, name)


def make_rng(seed: int | None, rng: np.random.Generator | None) -> np.random.Generator:
    if seed is not None and rng is not None:
        raise ValueError("pass either seed or rng, not both")
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator (np.random.default_rng(seed)), got {rng!r:.80}")
    return rng if rng is not None else np.random.default_rng(check_seed(seed))


def autoregressive_sample(
    model: CausalLM, prompt_ids, n_tokens: int,
    temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
    seed: int | None = None, rng: np.random.Generator | None = None, on_token: TokenCallback | None = None,
    chat: bool = False, allow_special: bool = False,
) -> DecodeResult:  # fmt: skip
    """Generate n_tokens after prompt_ids (token ids, or text when the model has a tokenizer),
    one forward pass each. chat=True: the text is a user message to a chat model, and decoding
    stops early after the token that ends the reply. allow_special=True: control strings typed
    in the text ("<|endoftext|>") become control tokens; by default they are plain text.

    The first pass reads the whole prompt into the KV cache; each later pass
    feeds only the previous token. Temperature 0 is greedy decoding.

        out = autoregressive_sample(model, ids, n_tokens=40, temperature=0.8, top_p=0.95, seed=0)
    """
    params = SamplingParams(temperature, top_k, top_p)
    prompt = check_request(model, prompt_ids, n_tokens, chat, allow_special)
    stop = end_of_reply(model, chat)
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
        if token == stop:
            break
        new = [token]
    return result
