"""A request to a sampler, checked once: what to continue, how far, how to draw and how to judge drafts.

Every entry point (the samplers, the batch, the race, the command line) asks here, so
each rule about a request is written once and says the same thing everywhere:

    prompt         text (encoded as plain text) or token ids; with chat=True a user message,
                   wrapped once in the model's chat template (ChatML)
    n_tokens       at least 1, and prompt + n_tokens fit the context window
    sampling       temperature, top-k, top-p (sampling.SamplingParams)
    acceptance     "exact", or Medusa's lossy "typical"
    verification   how the drafts are judged: "token" or "block" for a chain; "token",
                   "spectr" or "traversal" for a tree (verify/)

make_request returns a Request: the prompt as the model reads it, and the settings checked.
A caller that runs the same request many times (the race) checks it once and hands the
Request to the samplers' loops (autoregressive.decode, speculative.decode).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, replace

import numpy as np

from .model.base import CausalLM
from .model.tokenizer import ENDOFTEXT, chat_prompt, encode_text
from .sampling import SamplingParams
from .verify import ACCEPTANCE, TREE_VERIFICATION, VERIFICATION

TREES_REFUSED = ("a draft confidence bar (draft_confidence=, --draft_confidence) cuts chains; a tree is already "
                 "grown by its draft's confidence (EAGLE-2's expansion): give one or the other")


@dataclass(frozen=True)
class Request:
    """A checked request: build it with make_request, which applies every rule below once."""

    prompt: list[int]  # token ids as the model reads them (text encoded, the chat template applied)
    n_tokens: int  # new tokens wanted, >= 1 (a chat reply may end sooner)
    params: SamplingParams
    stop: int | None = None  # the token ending a chat reply (decoding stops after it); None when not chatting
    acceptance: str = "exact"  # or "typical" (lossy)
    verification: str = "token"  # how drafts are judged (check_verification)
    template_tokens: int = 0  # how many of the prompt's tokens are the chat template (0 when not chatting)


def make_request(
    model: CausalLM, prompt, n_tokens: int, params: SamplingParams | None = None, chat: bool = False,
    allow_special: bool = False, acceptance: str = "exact", verification: str = "token", tree=None, drafter=None,
) -> Request:  # fmt: skip
    """Check a request against the model (and the drafter that will draft for it, if any) and return it.

    tree: None for chains, anything else for trees (which verification rules apply). drafter: the
    one that will draft, whose `siblings` decide whether SpecTr's rule is exact, and a cross-vocabulary
    drafter's rule whether it can serve these sampling settings. params None: greedy.
    """
    ids = check_request(model, prompt, n_tokens, chat, allow_special)
    stop = end_of_reply(model, chat)
    template = len(ids) - len(encode_text(model.tokenizer, prompt, allow_special)) if chat else 0
    return with_settings(Request(ids, int(n_tokens), SamplingParams(), stop, template_tokens=template),
                         params, acceptance, verification, tree, drafter)  # fmt: skip


def with_settings(
    request: Request, params: SamplingParams | None = None, acceptance: str = "exact", verification: str = "token",
    tree=None, drafter=None,
) -> Request:  # fmt: skip
    """A made request (its prompt checked, the chat template applied) with these settings, checked as
    make_request checks them; the prompt is not read again. The race takes a request the command line
    made before it loaded the draft, and settles its drafting settings here."""
    params = params or SamplingParams()
    if hasattr(drafter, "check"):  # a drafter serving only some settings (cross-vocabulary SLEM: greedy only)
        drafter.check(params)
    if acceptance not in ACCEPTANCE:
        raise ValueError(f"acceptance must be 'exact' or 'typical' (lossy), got {acceptance!r}")
    check_verification(verification, tree, acceptance, getattr(drafter, "siblings", None))
    if tree is not None and getattr(drafter, "stop", None) is not None:
        raise ValueError(TREES_REFUSED)
    return replace(request, params=params, acceptance=acceptance, verification=verification)


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




def check_verification(verification: str, tree, acceptance: str = "exact", siblings: str | None = None) -> None:
    """Refuse, in one line each, the verification settings that are unknown or would not be exact.

    siblings: how the drafter draws a sampled tree's children of one node, "iid" or "without
    replacement" (a model or early-exit drafter's `siblings`), None for drafters that do not draw
    them (n-gram tries, heads, cross-vocabulary). The API, race and the command line all ask here;
    the messages name both spellings (tree=N / --tree N).
    """
    if verification not in VERIFICATION + TREE_VERIFICATION:
        raise ValueError(f"verification must be 'token', 'block', 'spectr' or 'traversal', got {verification!r}")
    if verification in ("block", "spectr", "traversal") and acceptance != "exact":
        raise ValueError(f"verification {verification!r} is an exact rule: leave out acceptance='typical' (lossy)")
    if verification == "block" and tree is not None:
        raise ValueError("verification 'block' judges a chain jointly: leave out tree= (--tree), or judge the tree "
                         "with 'traversal' (block verification read along every path)")  # fmt: skip
    if verification in ("spectr", "traversal") and tree is None:
        chain_rule = "block" if verification == "traversal" else "token"
        raise ValueError(f"verification {verification!r} judges trees: pass tree=N (--tree N); on a chain it is "
                         f"verification {chain_rule!r}")  # fmt: skip
    if verification == "spectr" and siblings != "iid":
        raise ValueError("verification 'spectr' needs a tree's siblings drawn i.i.d. (SpecTr's proof): a draft "
                         "model or early exit with siblings='iid' (--siblings iid), or verification 'token'")  # fmt: skip
