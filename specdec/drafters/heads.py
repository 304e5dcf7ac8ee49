"""What Medusa and EAGLE draft heads share: the frozen LM head, the losses, head files.

Both kinds of head (medusa.py, eagle.py) end in the TARGET's own LM head, frozen:
a head produces a vector r in the target's feature space (the space of the
final hidden state after ln_f) and its logits are r @ wte.T, exactly as the
target turns its own features into logits. Training therefore needs, besides
each head's own backward pass, the gradient of a cross-entropy through that
frozen matrix. This module holds that, the SmoothL1 feature loss of EAGLE,
and reading/writing trained heads (safetensors + JSON).

Restricted draft vocabulary (FR-Spec, Zhao et al., arXiv 2502.14856; EAGLE-3):
a head may score only the N most frequent tokens of its training data. Its LM
head is then wte[vocab] ([N, n_embd]), N/n_vocab of the full matrix's cost,
and q = 0 for every other token. That is still a proposal distribution like
any other, so speculative sampling stays exact: the verifier's residual and
bonus are drawn over the full vocabulary as always (its business, unchanged).

Shape notation: n rows (positions) in a batch, n_embd the target's width,
n_vocab the full vocabulary, N the draft vocabulary (N = n_vocab unrestricted).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..checkpoints.safetensors import read_safetensors, write_safetensors
from ..model.gpt2 import GPT2, softmax
from ..model.kernels import MAX_CHUNKED_ROWS, Linear, linear
from ..sampling import SamplingParams, greedy, probabilities

F32 = np.float32


# ---------------------------------------------------------------------------
# The frozen (optionally restricted) LM head and the losses.
# ---------------------------------------------------------------------------


@dataclass
class DraftVocab:
    """The tokens a head may propose, and the LM head rows that score them.

    ids: [N] sorted token ids (all n_vocab of them when unrestricted);
    w: [N, n_embd] the target's wte rows for them (a view when unrestricted).
    """

    ids: np.ndarray  # [N] int64
    w: np.ndarray  # [N, n_embd] float32
    n_vocab: int  # the full vocabulary, for scattering q back
    head: Linear | None = None  # w as a bias-free Linear, for drafting (gpt2.linear's fast few-row path)

    def __post_init__(self):
        if self.head is None and self.w.dtype == F32:
            self.head = Linear(self.w, None)  # [N, n_embd] is already Linear's transposed layout: no copy

    @classmethod
    def of(cls, target: GPT2, ids: np.ndarray | None = None) -> "DraftVocab":
        wte = target.weights.wte  # [n_vocab, n_embd]
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
        in one call. gpt2.linear does that for float32; training (many rows, or
        float64 in the gradient checks) takes the plain product.
        """
        if self.head is not None and r.dtype == F32 and len(r) <= MAX_CHUNKED_ROWS:
            return linear(r, self.head)
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


def top_tokens(token_ids: np.ndarray, n: int, n_vocab: int) -> np.ndarray:
    """The n most frequent ids in token_ids (FR-Spec's draft vocabulary), ties to the lower id."""
    counts = np.bincount(np.asarray(token_ids).ravel(), minlength=n_vocab)
    order = np.argsort(-counts, kind="stable")  # most frequent first; stable keeps ties by id
    return np.sort(order[:n])


def one_hot(tokens: np.ndarray, n_vocab: int, dtype=F32) -> np.ndarray:
    """[n] token ids -> [n, n_vocab] point masses (the hard-label target)."""
    p = np.zeros((len(tokens), n_vocab), dtype=dtype)
    p[np.arange(len(tokens)), tokens] = 1
    return p


def cross_entropy(logits: np.ndarray, p: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean over rows of -sum_j p_j log softmax(logits)_j, and its gradient.

    logits: [n, N] the head's logits over its draft vocabulary; p: [n, N] the
    target distribution restricted to that vocabulary (one-hot rows for token
    labels). A restricted row may sum to less than 1 (the target's mass outside
    the draft vocabulary cannot be matched); the gradient below stays correct:
        L = -sum_j p_j (z_j - logsumexp(z))
        dL/dz_j = q_j * sum(p) - p_j,          q = softmax(z)
    """
    n = logits.shape[0]
    z = logits - logits.max(axis=-1, keepdims=True)  # [n, N]
    log_q = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))  # [n, N]
    loss = -(p * log_q).sum() / n
    dlogits = (np.exp(log_q) * p.sum(axis=-1, keepdims=True) - p) / n  # [n, N]
    return float(loss), dlogits.astype(logits.dtype, copy=False)


def head_cross_entropy(r: np.ndarray, p: np.ndarray, vocab: DraftVocab) -> tuple[float, np.ndarray, np.ndarray]:
    """Cross-entropy of the frozen LM head on features r; the gradient flows to r only.

    r: [n, n_embd]; p: [n, N]. Returns (loss, dr [n, n_embd], logits [n, N]).
    logits = r @ W.T  =>  dr = dlogits @ W   (W = wte rows, frozen: no dW).
    """
    logits = vocab.logits(r)  # [n, N]
    loss, dlogits = cross_entropy(logits, p)
    return loss, dlogits @ vocab.w, logits  # dr: [n, N] @ [N, n_embd]


def target_distributions(features: np.ndarray, vocab: DraftVocab, target: GPT2) -> np.ndarray:
    """The target's own next-token distributions at these features, on the draft vocabulary.

    features: [n, n_embd] target hidden states after ln_f -> [n, N] probabilities
    (softmax over the FULL vocabulary, then restricted: the mass the target puts
    outside the draft vocabulary is what a restricted head must give up).
    """
    p = softmax(features @ target.weights.wte.T)  # [n, n_vocab]
    return vocab.targets(p)


def smooth_l1(pred: np.ndarray, target: np.ndarray, beta: float = 1.0) -> tuple[float, np.ndarray]:
    """SmoothL1 (Huber) loss, mean over all elements, and its gradient (EAGLE's feature loss).

    l(d) = 0.5 d^2 / beta  if |d| < beta  else |d| - 0.5 beta,   d = pred - target
    """
    d = pred - target
    small = np.abs(d) < beta
    loss = np.where(small, 0.5 * d * d / beta, np.abs(d) - 0.5 * beta).mean()
    grad = np.where(small, d / beta, np.sign(d)) / d.size
    return float(loss), grad.astype(pred.dtype, copy=False)


# ---------------------------------------------------------------------------
# ---------------------------------------------------------------------------
# Head files: DIR/heads.safetensors + DIR/heads.json.
# ---------------------------------------------------------------------------

WEIGHTS_FILE, CONFIG_FILE = "heads.safetensors", "heads.json"


class HeadFileError(ValueError):
    """A head folder that is missing, malformed, or made for another model."""


def model_fingerprint(target: GPT2) -> str:
    """A short hash of the target's embedding and final LayerNorm: tells apart two models of one shape."""
    w = target.weights
    digest = hashlib.sha256()
    for a in (w.wte[:64], w.wte[-64:], w.ln_f_weight, w.ln_f_bias):
        digest.update(np.ascontiguousarray(a, dtype=F32).tobytes())
    return digest.hexdigest()[:16]


def save_heads(folder, kind: str, target: GPT2, params: dict[str, np.ndarray], config: dict, vocab: DraftVocab):
    """Write trained heads: tensors as safetensors, and a JSON config naming the model they belong to."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = dict(params)
    if vocab.restricted:  # token ids < 2^24 are exact in float32
        tensors["vocab_ids"] = vocab.ids.astype(F32)
    meta = {
        "kind": kind,
        "model": target.name,
        "model_fingerprint": model_fingerprint(target),
        "n_embd": target.n_embd,
        "n_vocab": target.n_vocab,
        "draft_vocab": len(vocab.ids),
        **config,
    }
    # Write to temporary names, then rename: an interrupted save never leaves a half-written pair.
    write_safetensors(folder / (WEIGHTS_FILE + ".tmp"), tensors)
    (folder / (CONFIG_FILE + ".tmp")).write_text(json.dumps(meta, indent=1))
    (folder / (WEIGHTS_FILE + ".tmp")).replace(folder / WEIGHTS_FILE)
    (folder / (CONFIG_FILE + ".tmp")).replace(folder / CONFIG_FILE)


def load_heads(folder, kind: str, target: GPT2) -> tuple[dict, dict[str, np.ndarray], DraftVocab]:
    """Read heads written by save_heads and check they were trained for this target.

    Returns (config, params, vocab). Refuses, with a message that says what to do,
    a folder without heads, heads of another kind, and heads whose width,
    vocabulary or model fingerprint differ from the target's.
    """
    folder = Path(folder)
    config_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not config_path.is_file() or not weights_path.is_file():
        raise HeadFileError(
            f"{folder}: no trained heads here (need {CONFIG_FILE} and {WEIGHTS_FILE}); "
            f"make them with: python -m specdec.train {kind} --model MODEL --tokens N --out {folder}"
        )
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as e:
        raise HeadFileError(f"{config_path}: not valid JSON ({e})") from e
    if config.get("kind") != kind:
        have = config.get("kind")
        raise HeadFileError(f"{folder} holds {have!r} heads, not {kind!r}: use '{have}:{folder}'")
    for field, have in (("n_embd", target.n_embd), ("n_vocab", target.n_vocab)):
        if config.get(field) != have:
            raise HeadFileError(
                f"{folder}: these heads were trained for {config.get('model')!r} with {field}={config.get(field)}, "
                f"but the target {target.name!r} has {field}={have}; train heads for this model"
            )
    if config.get("model_fingerprint") != model_fingerprint(target):
        raise HeadFileError(
            f"{folder}: these heads were trained for {config.get('model')!r}, whose weights differ from the "
            f"target {target.name!r} (same shape, other weights); train heads for this model"
        )
    tensors = {k: np.array(v) for k, v in read_safetensors(weights_path).items()}  # writable copies
    ids = tensors.pop("vocab_ids", None)
    vocab = DraftVocab.of(target, None if ids is None else ids.astype(np.int64))
    if len(vocab.ids) != config.get("draft_vocab"):
        raise HeadFileError(f"{folder}: {len(vocab.ids)} draft vocabulary ids, config says {config.get('draft_vocab')}")
    return config, tensors, vocab


# ---------------------------------------------------------------------------
# Drafting with heads: q over the full vocabulary, and dynamic trees.
# ---------------------------------------------------------------------------


def draft_distribution(logits: np.ndarray, vocab: DraftVocab, params: SamplingParams) -> np.ndarray:
    """[n, N] draft-vocabulary logits -> [n, n_vocab] q, filtered like the target, 0 outside the draft vocabulary."""
    return probabilities(vocab.full(logits), params)


def draft_argmax(logits: np.ndarray, vocab: DraftVocab) -> int:
    """The greedy draft token of one [N] row, as a full-vocabulary id (lowest id on ties)."""
    return int(vocab.ids[greedy(logits)])
