"""A restricted vocabulary: the N tokens a draft may propose, and models whose LM head scores only those.

On a CPU a draft step is memory-bound, and an LM head is a large part of what it
reads (SmolLM2's is its 49,152 x 576 embedding, a fifth of one of its steps;
GPT-2's a third of a 124M step). Scoring only the N most frequent tokens (FR-Spec,
Zhao et al., arXiv 2502.14856) reads an [N, n_embd] slice instead.

`DraftVocab` holds the N ids and their LM head rows (the Medusa and EAGLE heads
score through it too); `RestrictedHead` is a GPT2 and `RestrictedLlama` a Llama
whose logits are full-width, -inf outside the draft vocabulary, so every sampler
and drafter takes them unchanged. Why that stays exact, and how the N tokens are
chosen: drafters/restricted.py (`restrict`).

Shape notation: n rows (positions), n_embd the model's width, n_vocab the full
vocabulary, N the draft vocabulary (N = n_vocab unrestricted).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .base import CausalLM, LanguageModel
from .gpt2 import GPT2
from .linear import Linear

FEW_ROWS = 16  # rows scored through the Linear (a draft step, a tree layer); more (training) multiply plainly
from .llama import Llama

F32 = np.float32


@dataclass
class DraftVocab:
    """The tokens a head may propose, and the LM head rows that score them.

    ids: [N] sorted token ids (all n_vocab of them when unrestricted);
    w: [N, n_embd] the target's wte rows for them (a view when unrestricted).
    """

    ids: np.ndarray  # [N] int64
    w: np.ndarray  # [N, n_embd] float32
    n_vocab: int  # the full vocabulary, for scattering q back
    head: Linear | None = None  # w as a bias-free Linear, for drafting (the fast products' few-row path)

    def __post_init__(self):
        if self.head is None and self.w.dtype == F32:
            self.head = Linear(self.w, None)  # [N, n_embd] is already Linear's transposed layout: no copy

    @classmethod
    def of(cls, target: CausalLM, ids: np.ndarray | None = None) -> DraftVocab:
        wte = target.weights.lm_head.w_t  # [n_vocab, n_embd]: the LM head's rows (wte itself when tied)
        if ids is None:
            return cls(np.arange(target.n_vocab), wte, target.n_vocab)
        ids = np.unique(np.asarray(ids, dtype=np.int64))
        if len(ids) == 0 or ids[0] < 0 or ids[-1] >= target.n_vocab:
            raise ValueError(f"draft vocabulary ids must lie in 0..{target.n_vocab - 1}")
        return cls(ids, np.ascontiguousarray(wte[ids]), target.n_vocab)

    @property
    def restricted(self) -> bool:
        return len(self.ids) < self.n_vocab

    def logits(self, r: np.ndarray) -> np.ndarray:
        """[n, n_embd] features -> [n, N] logits over the draft vocabulary.

        NOTE: drafting is memory-bound like decoding: w is read from RAM once per
        call whatever n is, so score several rows (all Medusa heads, a tree layer)
        in one call, as a Linear's product does for float32 (model/fast/); training
        (many rows, or float64 in the gradient checks) takes the plain product.
        """
        if self.head is not None and r.dtype == F32 and len(r) <= FEW_ROWS:
            return r @ self.head
        return r @ self.w.T

    def full(self, logits: np.ndarray) -> np.ndarray:
        """[n, N] draft-vocabulary logits -> [n, n_vocab], -inf outside the draft vocabulary.

        NOTE: -inf, not a large negative number: softmax then gives exactly q = 0
        there, so a token outside the draft vocabulary can never be drawn.
        """
        if not self.restricted:
            return logits
        out = np.full((logits.shape[0], self.n_vocab), -np.inf, dtype=logits.dtype)
        out[:, self.ids] = logits
        return out

    def targets(self, p_full: np.ndarray) -> np.ndarray:
        """Target distributions [n, n_vocab] -> their mass on the draft vocabulary [n, N]."""
        return p_full if not self.restricted else p_full[:, self.ids]


class Restricted:
    """`model` with its LM head cut to the rows of `ids`; logits are -inf for every other token.

    Shares every weight with `model` (no copy) except the [N, n_embd] rows of the
    LM head the new head reads, which are copied once to make them contiguous.
    Mixed into a model class: RestrictedHead (GPT-2) and RestrictedLlama below.
    """

    def __init__(self, model, ids):
        self.vocab = DraftVocab.of(model, ids)  # ids sorted, unique, checked; w = the head's rows [ids]
        weights = dataclasses.replace(model.weights, lm_head=Linear(self.vocab.w, None))  # [N, n_embd]
        super().__init__(model.hparams, weights, model.tokenizer, name=f"{model.name}[{len(self.vocab.ids)} tokens]")

    def forward(self, tokens, cache, last_only=False, n_layer=None, return_hidden=False, parents=None):
        """As the model's forward, with [n_seq, n_vocab] logits that are -inf outside the draft vocabulary."""
        out = super().forward(tokens, cache, last_only, n_layer, return_hidden, parents)
        if return_hidden:
            logits, hidden = out
            return self.vocab.full(logits), hidden
        return self.vocab.full(out)  # [n_seq, N] -> [n_seq, n_vocab]

    def forward_batch(self, tokens, caches, last_only=False, n_layer=None, return_hidden=False, parents=None):
        """As the model's forward_batch (one logits array per row), each row widened as in `forward`."""
        out = super().forward_batch(tokens, caches, last_only, n_layer, return_hidden, parents)
        logits = out[0] if return_hidden else out
        logits = [self.vocab.full(row) for row in logits]
        return (logits, out[1]) if return_hidden else logits


class RestrictedHead(Restricted, GPT2):
    """A GPT-2 scoring only the draft vocabulary."""


class RestrictedLlama(Restricted, Llama):
    """A Llama scoring only the draft vocabulary."""


RESTRICTED: dict[type[LanguageModel], type[Restricted]] = {GPT2: RestrictedHead, Llama: RestrictedLlama}
