"""Distilling a small draft model for a chat model: `python -m specdec.train draft ...`.

    python -m specdec.train draft --target smollm2-135m --data distill-data \
        --out specdec/checkpoints/weights/smollm2-draft

The draft is the papers' kind (Leviathan et al., arXiv 2211.17192): a separate,
small Llama with the target's tokenizer and its own KV cache, drafting K tokens
one at a time. What this file adds over a plain language model:

1. Its start: the target itself, cut down. The draft's width is the target's
   (576 for SmolLM2-135M), so it reads the target's token embedding and scores
   tokens with it (tied, frozen, not stored: checkpoints/draft.py), and its
   blocks start as copies of the target blocks `--layers` names (default: layer
   0 alone; docs/draft-model.md says why), the final RMSNorm as the target's. A narrower MLP (`--n-ff`) keeps the units
   with the largest weight norms (gate row x up row x down column).
2. Its data: the target's own replies to chat requests (train/distill.py), with
   the target's top-8 probabilities at every reply position. DistillSpec (Zhou et
   al., arXiv 2310.08461) shows a draft gains acceptance when distilled on data
   the models actually produce when decoding, against the target's full
   distribution rather than one sampled token: these replies are that (sampled
   and greedy rows, the two ways a drafter is used).
3. Its loss, a divergence between the target's p and the draft's q at each
   reply position, over the draft vocabulary (FR-Spec top-N, Zhao et al., arXiv
   2502.14856), with p the stored top-8 renormalised:
   - "fkl" (default): forward KL(p || q) = cross-entropy minus p's entropy (a
     constant). Mode-covering: q puts mass wherever p does, which is what
     acceptance at T=1 needs (a token q never proposes is never accepted), and
     its argmax follows p's, which is what greedy acceptance needs. Smooth, with
     the well-scaled gradient q - p. DistillSpec's own comparison finds no
     divergence best everywhere; FKL is the robust choice for both temperatures.
   - "tvd": total variation 1/2 sum |p - q|, which IS the rejection probability
     of one speculative step (Leviathan et al., Corollary 3.6: alpha = 1 - TVD),
     so it optimises acceptance directly; its gradient is a sign, weaker far
     from the optimum. Offered to fine-tune a draft FKL has trained.
4. Its held-out figure: teacher-forced top-1 agreement with the token the target
   wrote, by reply position, on rows whose REQUEST never appears in training
   (rows.held_out_rows: the split is by the request's text).

The block's forward and backward are train/llama_grad.py's (one copy of the
Llama block's training math, shared with EAGLE's Llama head); this file adds
the embedding lookup (frozen), the final norm, the frozen LM head and the loss.

Shape notation: B rows, T positions (right-padded), e = n_embd, n labelled
positions, N the draft vocabulary.
"""

from __future__ import annotations

import numpy as np

from ..checkpoints import draft as checkpoints_draft
from ..checkpoints.draft import param_shapes
from ..model.base import CausalLM
from ..model.llama import LlamaBlock, LlamaHParams
from ..model.restricted import DraftVocab
from . import llama_grad

F32 = np.float32
LOSSES = ("fkl", "tvd")


# ---------------------------------------------------------------------------
# 1. The draft's shape and its start from the target.
# ---------------------------------------------------------------------------


def draft_shape(target: CausalLM, layers: list[int], n_ff: int | None) -> dict:
    """The draft's hyperparameters (checkpoints/draft.py SHAPE_FIELDS) and where its blocks start."""
    h = target.hparams
    if not layers or any(not 0 <= layer < h.n_layer for layer in layers):
        raise ValueError(f"--layers must name target layers in 0..{h.n_layer - 1}, got {layers}")
    n_ff = h.n_ff if n_ff is None else n_ff
    if not 1 <= n_ff <= h.n_ff:
        raise ValueError(f"--n-ff must be in 1..{h.n_ff} (the target's MLP width), got {n_ff}")
    return {
        "n_layer": len(layers),
        "n_head": h.n_head,
        "n_kv_head": h.n_kv_head,
        "n_ff": n_ff,
        "init_layers": list(layers),
    }


def init_params(target: CausalLM, shape: dict) -> dict[str, np.ndarray]:
    """The draft's tensors (checkpoints/draft.param_shapes names), copied from the target: block i from
    target layer shape["init_layers"][i], MLP cut to the n_ff units of largest weight norm; output_norm
    the target's. float32 copies (the target's weights are never changed)."""
    params = {}
    for i, layer in enumerate(shape["init_layers"]):
        block: LlamaBlock = target.weights.blocks[layer]
        tensors = {
            name: np.array(t.w_t if hasattr(t, "w_t") else t, dtype=F32)
            for name, t in block.checkpoint_tensors().items()
        }
        keep = mlp_units(tensors["ffn_gate"], tensors["ffn_up"], tensors["ffn_down"], shape["n_ff"])
        tensors["ffn_gate"], tensors["ffn_up"] = tensors["ffn_gate"][keep], tensors["ffn_up"][keep]
        tensors["ffn_down"] = np.ascontiguousarray(tensors["ffn_down"][:, keep])
        params.update({f"blk.{i}.{name}": t for name, t in tensors.items()})
    params["output_norm"] = np.array(target.weights.norm_f, dtype=F32)
    shapes = param_shapes(n_embd=target.n_embd, **{k: shape[k] for k in ("n_layer", "n_head", "n_kv_head", "n_ff")})
    assert {k: v.shape for k, v in params.items()} == shapes, "init_params and param_shapes disagree"
    return params


def mlp_units(gate: np.ndarray, up: np.ndarray, down: np.ndarray, n_ff: int) -> np.ndarray:
    """The n_ff SwiGLU units to keep, in their original order: those whose gate row, up row and down column
    have the largest product of norms (a unit's output is down[:, j] * silu(gate_j . x) * (up_j . x)).

    gate, up: [n_ff_full, e]; down: [e, n_ff_full].
    """
    score = np.linalg.norm(gate, axis=1) * np.linalg.norm(up, axis=1) * np.linalg.norm(down, axis=0)  # [n_ff_full]
    return np.sort(np.argsort(-score, kind="stable")[:n_ff])


# ---------------------------------------------------------------------------
# 3. The divergences, each with its gradient in the logits.
# ---------------------------------------------------------------------------


def divergence(logits: np.ndarray, p: np.ndarray, kind: str) -> tuple[float, np.ndarray]:
    """Mean over rows of D(p || q), q = softmax(logits), and dD/dlogits.

    logits: [n, N] the draft's, over the draft vocabulary; p: [n, N] the target's
    stored top-8 renormalised, restricted to the draft vocabulary (a row may sum to
    less than 1: mass on tokens the draft cannot propose).
        fkl: sum_j p_j (log p_j - log q_j)      dD/dz = q sum(p) - p
        tvd: 1/2 sum_j |p_j - q_j| + 1/2 (1 - sum p)   (the mass outside counts in full)
             dD/dz_k = 1/2 q_k (s_k - sum_j s_j q_j),  s = sign(q - p)
    """
    n = logits.shape[0]
    z = logits - logits.max(axis=-1, keepdims=True)  # [n, N]
    e = np.exp(z)
    total = e.sum(axis=-1, keepdims=True)  # [n, 1]
    q = e / total  # [n, N]
    if kind == "fkl":
        # NOTE: p has at most 8 non-zero entries per row (the stored top-8): sum over those only.
        rows, cols = np.nonzero(p)
        p_nz = p[rows, cols]
        log_q_nz = z[rows, cols] - np.log(total[rows, 0])  # log q at p's support
        loss = (p_nz * (np.log(p_nz) - log_q_nz)).sum() / n
        grad = (q * p.sum(axis=-1, keepdims=True) - p) / n  # [n, N]
    elif kind == "tvd":
        loss = 0.5 * (np.abs(p - q).sum() + (1 - p.sum(axis=-1)).sum()) / n
        s = np.sign(q - p)  # [n, N]
        grad = 0.5 * q * (s - (s * q).sum(axis=-1, keepdims=True)) / n
    else:
        raise ValueError(f"--loss must be one of {', '.join(LOSSES)}, got {kind!r}")
    return float(loss), grad.astype(logits.dtype, copy=False)


# ---------------------------------------------------------------------------
# 2, 3. The draft as a kind of the trainer (heads_train.HeadKind): forward, loss, backward.
# ---------------------------------------------------------------------------


def draft_hparams(target: CausalLM, config: dict) -> LlamaHParams:
    """The draft's LlamaHParams (its depth, heads, MLP width; the target's width and positions)."""
    return checkpoints_draft.draft_hparams(target, config)


def forward(
    params: dict[str, np.ndarray], wte: np.ndarray, tokens: np.ndarray, lengths: np.ndarray, h: LlamaHParams
) -> tuple[np.ndarray, list]:
    """Teacher-forced: token ids [B, T] (right-padded) -> the final hidden states [B, T, e] the LM head reads,
    and what backward needs. wte [n_vocab, e] is the target's embedding (frozen)."""
    B, T = tokens.shape
    x = wte[tokens]  # [B, T, e]
    positions = np.broadcast_to(np.arange(T), (B, T))  # every row starts at position 0
    mask = llama_grad.causal_mask(lengths, T)  # [B, T, T]
    saved = []
    for i in range(h.n_layer):
        x, s = llama_grad.block_forward(params, x, positions, h, mask, prefix=f"blk.{i}.")
        saved.append(s)
    y, norm = llama_grad.rms_norm(x, params["output_norm"], h.rms_eps)  # [B, T, e]
    return y, [*saved, norm]


def backward(dy: np.ndarray, params: dict[str, np.ndarray], saved: list, h: LlamaHParams) -> dict[str, np.ndarray]:
    """dL/d(final hidden states) [B, T, e] -> every parameter's gradient (the embedding is frozen: no gradient)."""
    *blocks, norm = saved
    dx, d_norm = llama_grad.rms_norm_backward(dy, params["output_norm"], norm)
    grads = {"output_norm": d_norm}
    for i in reversed(range(h.n_layer)):
        dx, grads = llama_grad.block_backward(dx, params, blocks[i], h, grads, prefix=f"blk.{i}.")
    return grads


def head_logits(y: np.ndarray, vocab: DraftVocab) -> np.ndarray:
    """[n, e] final hidden states -> [n, N] logits over the draft vocabulary (the tied, frozen LM head rows)."""
    return vocab.logits(y) if y.dtype == vocab.w.dtype else y @ vocab.w.T.astype(y.dtype)


def loss_and_grads(params, wte, vocab: DraftVocab, batch, h: LlamaHParams, loss: str) -> tuple[float, dict]:
    """The divergence of the draft's q from the target's p at every reply position of the batch, and the
    gradient of every parameter. batch: a rows.HeadBatch (p rows in label_mask order)."""
    y, saved = forward(params, wte, batch.tokens, batch.lengths, h)
    logits = head_logits(y[batch.label_mask], vocab)  # [n, N]: position t predicts token t + 1
    value, dlogits = divergence(logits, batch.p.astype(y.dtype, copy=False), loss)
    dy = np.zeros_like(y)
    dy[batch.label_mask] = dlogits @ vocab.w.astype(y.dtype)  # logits = y W.T  =>  dy = dlogits W
    return value, backward(dy, params, saved, h)


class DraftKind:
    """The distilled draft model as the trainer sees it (heads_train.HeadKind): it reads no target states,
    only tokens, and is saved as the shipped draft's file (checkpoints/draft.py), not as a head."""

    name = "draft"

    def layers(self, target):
        return []  # a separate model: it reads the text, not the target's hidden states

    def config(self, target, options):
        layers = options.get("layers") or [0]
        return {**draft_shape(target, layers, options.get("n_ff")), "loss": options.get("loss") or "fkl"}

    def param_shapes(self, target, config):
        return param_shapes(n_embd=target.n_embd, **{k: config[k] for k in checkpoints_draft.SHAPE_FIELDS})

    def init_params(self, target, config, rng):
        return init_params(target, config)  # the target's own blocks: no randomness

    def loss_and_grads(self, params, target, config, vocab, batch):
        value, grads = loss_and_grads(
            params, target.weights.wte, vocab, batch, draft_hparams(target, config), config["loss"]
        )
        return value, {config["loss"]: value}, grads

    def logits(self, params, target, config, vocab, batch):
        y, _ = forward(params, target.weights.wte, batch.tokens, batch.lengths, draft_hparams(target, config))
        return head_logits(y[batch.label_mask], vocab), np.ones(batch.n_labels, bool)

    def save(self, out, target, params, card, vocab):
        """The draft's own file; card: the trainer's card, which holds config() (the shape) too."""
        return checkpoints_draft.save_draft(out, target, card, params, vocab.ids if vocab.restricted else None, card)
