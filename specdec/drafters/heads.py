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

from pathlib import Path

import numpy as np

from ..checkpoints.fingerprint import FINGERPRINT, FINGERPRINT_SAMPLES, model_fingerprint  # noqa: F401 (re-exported)
from ..checkpoints.pairs import open_weights, read_record, show, tensors_problem, write_pair
from ..checkpoints.safetensors import CheckpointError, read_safetensors
from ..model.attention import softmax
from ..model.base import CausalLM
from ..model.llama import LlamaHParams
from ..model.restricted import DraftVocab
from ..sampling import SamplingParams, greedy, probabilities
from .specs import HEADS

F32 = np.float32


# ---------------------------------------------------------------------------
# The frozen (optionally restricted) LM head and the losses.
# ---------------------------------------------------------------------------


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


def target_distributions(features: np.ndarray, vocab: DraftVocab, target: CausalLM) -> np.ndarray:
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
# Head files: DIR/heads.json, naming DIR/heads-<sha256 prefix>.safetensors.
# ---------------------------------------------------------------------------

CONFIG_FILE = "heads.json"
WEIGHTS_STEM = "heads"  # heads.json names heads-<sha256 prefix>.safetensors (checkpoints/pairs.py)
MAX_HEADS = 64


class HeadFileError(ValueError):
    """A head folder that is missing, malformed, or made for another model."""


def save_heads(
    folder,
    kind: str,
    target: CausalLM,
    params: dict[str, np.ndarray],
    config: dict,
    vocab: DraftVocab,
    half: bool = False,
) -> Path:
    """Write trained heads: heads.json, naming the model they belong to, and the tensors it names,
    heads-<sha256 prefix>.safetensors. Returns the tensors' path. Refuses (ValueError) heads holding
    NaN or inf. The two files are replaced as one (checkpoints/pairs.py): a process killed while
    saving leaves the old pair or the new, never a mix. One writer per folder (python -m
    specdec.train holds a lock on its --out).
    half: store the weights as float16 (half the bytes; they are computed in float32 after
    loading), as the heads shipped inside specdec are. The vocabulary ids stay float32, where
    every id below 2^24 is exact (float16 is exact only to 2048).
    """
    folder = Path(folder).expanduser()
    bad = [name for name, a in params.items() if not np.isfinite(a).all()]
    if half and not bad:  # a weight beyond float16's range would be stored as inf
        bad = [name for name, a in params.items() if not np.isfinite(a.astype(np.float16)).all()]
    if bad:
        raise ValueError(f"the {kind} heads hold NaN or infinite values (tensor {bad[0]!r}); nothing was saved")
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
        "n_head": target.n_head,  # what training used (EAGLE's block splits attention by it)
        "layer_norm_epsilon": target.hparams.layer_norm_epsilon,
        "draft_vocab": len(vocab.ids),
        **llama_numbers(target),  # what a Llama block computes with (eagle.check_llama_config reads them back)
        **config,
    }
    dtype = {name: "F16" for name in params} if half else "F32"
    return write_pair(folder, CONFIG_FILE, WEIGHTS_STEM, tensors, meta, dtype)


def llama_numbers(target: CausalLM) -> dict:
    """A Llama target's numbers a head with a Llama block computes with (the target's own), {} for another."""
    h = target.hparams
    if not isinstance(h, LlamaHParams):
        return {}
    return {"n_kv_head": h.n_kv_head, "n_ff": h.n_ff, "rope_theta": h.rope_theta}


def load_heads(folder, kind: str, target: CausalLM, param_shapes) -> tuple[dict, dict[str, np.ndarray], DraftVocab]:
    """Read heads written by save_heads, check every part, and check they were trained for this target.

    param_shapes(n_heads, n_embd): the tensors this kind of head holds, {name: shape} (medusa.param_shapes,
    eagle.param_shapes: each kind's module passes its own, so this module needs neither).

    Returns (config, params, vocab). Refuses with a HeadFileError of one line, naming
    the file and saying what to do: a folder without heads; heads.json that is not a
    JSON object of the expected fields (each of the right type, and those training
    took from the target equal to the target's); a weights file that is missing, is
    not the one heads.json names (sha256), or is not safetensors; a tensor missing,
    extra, of the wrong shape or not finite; draft vocabulary ids that are not
    distinct whole numbers in range; and heads made for another model.
    NOTE: values from the file are shown with repr() (escaped), never raw.
    """
    folder = Path(folder).expanduser()
    config_path = folder / CONFIG_FILE
    retrain = f"train heads with: python -m specdec.train {kind} --model MODEL --tokens N --out {folder}"
    config = read_record(config_path, f"{folder}: no trained heads here (no {CONFIG_FILE}); {retrain}", HeadFileError)

    def bad(what: str):
        return HeadFileError(f"{config_path}: {what}; {retrain}")

    if "kind" not in config:
        raise bad("no 'kind' field: not a heads.json written by python -m specdec.train")
    have = config["kind"]
    if have != kind:
        if isinstance(have, str) and have in HEADS:
            raise HeadFileError(f"{folder} holds {have} heads, not {kind!r}: use '{have}:{folder}'")
        raise bad(f"'kind' is {show(have)}, expected one of {', '.join(map(repr, HEADS))}")
    model = show(config.get("model"))
    for field, want in (
        ("n_embd", target.n_embd),
        ("n_vocab", target.n_vocab),
        ("n_head", target.n_head),
        ("layer_norm_epsilon", target.hparams.layer_norm_epsilon),
    ):
        if field not in config:
            raise bad(f"{field!r} is missing")
        if type(config[field]) is not type(want) or config[field] != want:  # (NOTE: JSON's true is no int here)
            raise HeadFileError(
                f"{config_path}: these heads were trained for {model} with {field}={show(config[field])}, but the "
                f"target {target.name!r} has {field}={want}; train heads for this model"
            )
    n_heads = _whole(config, "n_heads", 1, MAX_HEADS, bad)
    draft_vocab = _whole(config, "draft_vocab", 1, target.n_vocab, bad)
    fingerprint = config.get("model_fingerprint")
    if not isinstance(fingerprint, str):
        raise bad(f"'model_fingerprint' is {show(fingerprint)}, not a string")
    if not fingerprint.startswith(f"{FINGERPRINT}-"):
        raise bad("its model fingerprint is of an older kind (these heads were saved by an older specdec)")
    if fingerprint != model_fingerprint(target):
        raise HeadFileError(
            f"{config_path}: these heads were trained for {model}, whose weights differ from the target "
            f"{target.name!r} (same shape, other weights); train heads for this model"
        )
    try:
        weights_path, file = open_weights(folder, config, WEIGHTS_STEM)
    except ValueError as e:
        raise bad(str(e)) from e
    try:
        with file:  # the file whose sha256 was checked is the file read
            tensors = {k: np.array(v) for k, v in read_safetensors(weights_path, file).items()}  # writable copies
    except CheckpointError as e:  # (its message advises a download: not what heads need)
        raise HeadFileError(f"{weights_path}: not a readable safetensors file; {retrain}") from e

    shapes = param_shapes(n_heads, target.n_embd)
    if draft_vocab < target.n_vocab:
        shapes["vocab_ids"] = (draft_vocab,)
    problem = tensors_problem(tensors, shapes, f"{CONFIG_FILE} and the target imply")
    if problem:
        raise HeadFileError(f"{weights_path}: {problem}; {retrain}")
    ids = tensors.pop("vocab_ids", None)
    if ids is not None:
        whole = ids == np.round(ids)
        if not (whole.all() and ids.min() >= 0 and ids.max() < target.n_vocab and len(np.unique(ids)) == len(ids)):
            raise HeadFileError(
                f"{weights_path}: vocab_ids must be distinct whole numbers in 0..{target.n_vocab - 1}; {retrain}"
            )
        ids = ids.astype(np.int64)
    return config, tensors, DraftVocab.of(target, ids)


def _whole(config: dict, field: str, low: int, high: int, bad) -> int:
    value = config.get(field)
    if type(value) is not int or not low <= value <= high:
        raise bad(f"{field!r} must be a whole number in {low}..{high}, got {show(value)}")
    return value


# ---------------------------------------------------------------------------
# Drafting with heads: q over the full vocabulary, and dynamic trees.
# ---------------------------------------------------------------------------


def draft_distribution(logits: np.ndarray, vocab: DraftVocab, params: SamplingParams) -> np.ndarray:
    """[n, N] draft-vocabulary logits -> [n, n_vocab] q, filtered like the target, 0 outside the draft vocabulary."""
    return probabilities(vocab.full(logits), params)


def draft_argmax(logits: np.ndarray, vocab: DraftVocab) -> int:
    """The greedy draft token of one [N] row, as a full-vocabulary id (lowest id on ties)."""
    return int(vocab.ids[greedy(logits)])
