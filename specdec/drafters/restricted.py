"""A draft model (GPT-2 or Llama) whose LM head scores only N tokens: cheaper draft steps, still exact.

What it adds over a plain draft model: on a CPU a draft step is memory-bound
like the target's, and GPT-2's LM head (wte, [50257, n_embd]) is a large part
of what it reads: a third of a 124M step, about half of a 6-layer distilgpt2
step. Scoring only the N most frequent tokens (FR-Spec, Zhao et al., arXiv
2502.14856) reads an [N, n_embd] slice of wte instead.

The draft's distribution q is then 0 outside those N tokens. That is still a
distribution, and speculative sampling is exact for any q (Leviathan et al.,
Algorithm 1): the target's residual max(0, p - q) and its bonus token are drawn
over the full vocabulary as always, so a token outside the draft vocabulary is
still produced whenever the target wants it; it is just never guessed. The
price is acceptance: a draft cannot propose a token it cannot score.

    draft = restrict(load_model("124M"), 8192)      # the 8192 most frequent tokens
    speculative_sample(target, draft, ids, 40, K=4)

`RestrictedHead` is a GPT2 like any other, and `RestrictedLlama` a Llama (both in
model/restricted.py: full-width logits, -inf outside the draft vocabulary), so every
sampler and drafter takes them unchanged. (SmolLM2's head is its 49,152 x 576
embedding, a fifth of what one of its steps reads.)
The vocabulary itself is model/restricted.py's DraftVocab, which the Medusa and EAGLE heads use.
"""

from __future__ import annotations

import numpy as np

from ..model.base import CausalLM
from ..model.restricted import RESTRICTED, Restricted, RestrictedHead, RestrictedLlama  # noqa: F401 (re-exported)
from .heads import top_tokens


def restrict(model: CausalLM, n: int, corpus_ids=None) -> RestrictedHead | RestrictedLlama:
    """`model` scoring only n tokens: the n most frequent in `corpus_ids` (token ids of
    some representative text), or without a corpus, ids 0..n-2 and <|endoftext|>.

    Why the low ids: GPT-2's BPE numbers its tokens in the order their merges were
    learned, and a merge is learned when its pair is the most frequent one left,
    so low ids are, roughly, the frequent pieces of GPT-2's training text (after
    the 256 single bytes, which are kept anyway: any text can be spelt with them).
    A corpus of the text you will decode does better; measure acceptance either way.
    (A Llama's byte-level BPE numbers its tokens the same way; SmolLM2's special
    tokens come first, ids 0-2, so they are kept too.)
    """
    restricted = next((cls for arch, cls in RESTRICTED.items() if isinstance(model, arch)), None)
    if restricted is None:
        raise ValueError(f"restrict takes a GPT-2 or Llama model, not {type(model).__name__}")
    n_vocab = model.n_vocab
    if not 1 <= n <= n_vocab:
        raise ValueError(f"a restricted head needs 1..{n_vocab} tokens, got {n}")
    if corpus_ids is not None:
        ids = top_tokens(np.asarray(corpus_ids, dtype=np.int64), n, n_vocab)
    else:
        ids = np.append(np.arange(n - 1), n_vocab - 1)  # ... and the last id, GPT-2's <|endoftext|>
    return restricted(model, ids)
