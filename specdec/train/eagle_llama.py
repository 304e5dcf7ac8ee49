"""EAGLE heads with a Llama block, for Llama targets (SmolLM2): EAGLE's and EAGLE-3's, forward, backward, losses.

drafters/eagle.py drafts with a GPT-2 block for GPT-2 targets. A Llama target is
drafted better by a block of its own kind (RMSNorm, rotary positions, grouped-query
attention, SwiGLU: train/llama_grad.py), as EAGLE's own LLaMA heads are. Two variants:

EAGLE (Li et al., arXiv 2401.15077, section 4), config block "llama". The pair
(f_t, x_(t+1)) of the target's feature (after its final norm) and the next
token's embedding is fused and run through one block at rotary position t:

    u_t = fc [f_t ; wte[x_(t+1)]]                  [B, T, 2e] -> [B, T, e]
    y_t = LlamaBlock(u)_t                          causal: y_t sees u_0 .. u_t
    loss = SmoothL1(y_t, f_(t+1)) + 0.1 CE(y_t @ W.T, p_(t+1))   (W: the draft vocabulary's LM head rows)

EAGLE-3 (Li et al., arXiv 2503.01840, section 3), config block "eagle3".
(1) Features: a low, a middle and a high layer of the target (features.eagle3_layers)
fused into one vector, g_t = fuse [l_t ; m_t ; h_t]. (2) Token loss only: the output
no longer has to be a feature, so it passes a final RMSNorm of its own before the LM
head. (3) Training-time test: drafting feeds the head its OWN output y_t in place of
a feature for every token after the first, so training does too. Step 0 is
teacher-forced; step 1 runs the pairs (y_t, x_(t+2)) at positions t + 1, each one
attending, as it would while drafting, to the real pairs u_0 .. u_t and to itself,
never to the other step-1 pairs (EAGLE-3's mask: causal over step 0, the diagonal
over each later step):

    step 0:  u_t  = fc [g_t ; wte[x_(t+1)]]        y_t  = LlamaBlock(u)_t          -> x_(t+2)
    step 1:  u'_t = fc [y_t ; wte[x_(t+2)]]        y'_t = LlamaBlock(u ; u')_(T+t)  -> x_(t+3)
    loss = CE(rms_norm(y) @ W.T, p_(t+1)) + 0.8 CE(rms_norm(y') @ W.T, p_(t+2))

(later steps weigh less: they count only when the earlier draft was accepted). The
gradient flows through y into step 1's input, as it does in the paper.

The training-time test on its own (`--block llama --ttt`): EAGLE's head, scored by
EAGLE's loss at step 0 and again, weighted 0.8, at step 1 (unrolled_forward), whose
output stands for f_(t+2). The head file is EAGLE's: only its training differs, so
such a run may start (--init) from one trained without it.
Differences from the paper, and why: EAGLE-3's block reads [embedding ; feature]
(2e wide) in its attention projections; here fc first maps the pair to e, as
EAGLE's does, so drafting runs model/llama.py's own inference block unchanged
(llama_block). Step 1's keys of step 0 are recomputed in a second pass over
[u ; u'] (the same values: a third of the block's cost more, and one code path).

Both heads score the target's tied embedding restricted to the draft vocabulary
(FR-Spec; drafters/heads.DraftVocab), which is never stored in the head file.

Params (names in the head file; matrices [n_out, n_in] as model/llama.py stores them):
    fc [e, 2e];  blk.<name>: one Llama block (llama_grad.block_shapes, the target's shapes);
    eagle3 adds fuse [e, 3e] and norm [e].

Shape notation: B rows of T positions of the distillation batch (HeadBatch), P = T - 1
pairs per row, e = n_embd, N the draft vocabulary.
"""

from __future__ import annotations

import numpy as np

from ..drafters.eagle import head_shapes, llama_param_shapes
from ..drafters.eagle_grad import CE_WEIGHT
from ..drafters.heads import DraftVocab, cross_entropy, load_heads, smooth_l1
from ..model.llama import Llama, LlamaHParams
from . import llama_grad as lg
from .features import eagle3_layers, hidden_states

F32 = np.float32
BLK = "blk."  # the block's params are blk.attn_q, ...
STEP_WEIGHTS = (1.0, 0.8)  # EAGLE-3's two unrolled steps


def head_hparams(target) -> LlamaHParams:
    """The head's block has the target's shapes (one more of its blocks)."""
    if not isinstance(target, Llama):
        raise ValueError(
            f"a Llama-block EAGLE head needs a Llama target (SmolLM2, ...), not {target.name!r}: "
            "train a GPT-2 target's head with --block gpt2"
        )
    return target.hparams


def init_params(target, block: str, rng: np.random.Generator, std: float = 0.02) -> dict[str, np.ndarray]:
    """Matrices ~ N(0, std^2), RMSNorm gains 1 (llama_grad.init_tensors)."""
    return lg.init_tensors(llama_param_shapes(head_hparams(target), block), rng, std)


# ---------------------------------------------------------------------------
# The head: fc then one block, forward and backward.
# ---------------------------------------------------------------------------


def head_forward(params, g, emb, positions, mask, h: LlamaHParams):
    """[g ; emb] -> fc -> block: g, emb [B, P, e] -> (y [B, P, e], saved). mask [B, P, P] bool."""
    a = np.concatenate([g, emb], axis=-1)  # [B, P, 2e]
    u = a @ params["fc"].T  # [B, P, e]
    y, block_saved = lg.block_forward(params, u, positions, h, mask, BLK)
    return y, (a, block_saved)


def head_backward(dy, params, saved, h: LlamaHParams, grads=None):
    """dL/dy -> (dL/dg [B, P, e], grads); the embeddings are frozen data."""
    a, block_saved = saved
    du, grads = lg.block_backward(dy, params, block_saved, h, grads, BLK)
    da, dfc = lg.matmul_backward(du, a, params["fc"])
    grads["fc"] = grads["fc"] + dfc if "fc" in grads else dfc
    return da[..., : a.shape[-1] // 2], grads


# ---------------------------------------------------------------------------
# Batches: pairs from a HeadBatch (rows.py), and which label rows they learn.
# ---------------------------------------------------------------------------


def pair_rows(batch, shift: int) -> tuple[np.ndarray, np.ndarray]:
    """Pairs j whose token x_(j+1+shift) has labels: (where [B, P] bool, which of the batch's label rows [n_labels] bool).

    A pair j (0 <= j < P) predicts, shift steps on, token x_(j+1+shift), whose labels are the p row
    of label position j + shift; p rows run row-major over batch.label_mask, and so do the pairs
    selected by `where`, so batch.p[rows] lines up with y[where].
    """
    B, T = batch.label_mask.shape
    where = np.zeros((B, T - 1), bool)
    where[:, : T - shift] = batch.label_mask[:, shift:]
    keep = batch.label_mask.copy()
    keep[:, :shift] = False  # labels with no pair shift steps before them
    return where, keep[batch.label_mask]


def pairs(target, batch, layers_used: int):
    """The teacher-forced pairs of a batch: (g [B, P, k*e], emb [B, P, e], positions [B, P], mask [B, P, P]).

    g fuses the first layers_used hidden states of batch.states by concatenation (EAGLE: 1, EAGLE-3: 3).
    Pair j exists for j < length - 1 (the state at j and the token j + 1 are real).
    """
    B, T = batch.tokens.shape
    g = np.concatenate(list(batch.states[:layers_used, :, : T - 1]), axis=-1)  # [B, P, layers_used * e]
    emb = target.weights.wte[batch.tokens[:, 1:]]  # [B, P, e]: x_(j+1)
    positions = np.broadcast_to(np.arange(T - 1), (B, T - 1))
    return g, emb, positions, lg.causal_mask(np.asarray(batch.lengths) - 1, T - 1)


# ---------------------------------------------------------------------------
# EAGLE: feature regression + token loss.
# ---------------------------------------------------------------------------


def eagle_loss_and_grads(params, target, vocab: DraftVocab, batch, ttt: bool = False):
    """EAGLE's loss on a batch (section 4.2: SmoothL1 on features + 0.1 CE on tokens) and its gradients.

    The feature loss is read at every pair whose next feature exists (prompt positions too: the
    features there are the target's as much as in a reply), the token loss at labelled pairs.
    ttt: add EAGLE-3's training-time test (unrolled_forward): step 1, reading the head's own
    outputs, is scored by the same loss, weighted STEP_WEIGHTS[1].
    Returns (loss, {"feat", "ce"} (and "feat1", "ce1" with ttt), grads).
    """
    h = head_hparams(target)
    f, emb, positions, mask = pairs(target, batch, 1)
    if not ttt:
        y, saved = head_forward(params, f, emb, positions, mask, h)  # [B, P, e]
        loss, parts, dy = eagle_step_loss(y, batch, vocab, 0)
        return loss, parts, head_backward(dy, params, saved, h)[1]
    y, y1, saved0, saved1 = unrolled_forward(params, f, emb, positions, mask, h)
    loss0, parts0, dy0 = eagle_step_loss(y, batch, vocab, 0)
    loss1, parts1, dy1 = eagle_step_loss(y1, batch, vocab, 1)
    weight = y.dtype.type(STEP_WEIGHTS[1])
    _, grads = unrolled_backward(dy0, weight * dy1, params, saved0, saved1, h)
    return loss0 + STEP_WEIGHTS[1] * loss1, {**parts0, "feat1": parts1["feat"], "ce1": parts1["ce"]}, grads


def eagle_step_loss(y, batch, vocab: DraftVocab, step: int):
    """EAGLE's loss of one unrolled step's outputs y [B, P, e]: (loss, {"feat", "ce"}, dL/dy).

    At step s, pair j's output stands for the feature f_(j+1+s) and predicts token x_(j+2+s) (step 0:
    teacher-forced; step 1: the pair (y_j, x_(j+2)) at position j + 1, as drafting's second token).
    """
    P, s = y.shape[1], 1 + step
    has_next = np.arange(P)[None, :] + s <= np.asarray(batch.lengths)[:, None] - 2  # f_(j+s) is a real state
    want = np.zeros_like(y)
    want[:, : P + 1 - s] = batch.states[0][:, s:]  # f_(j+s): what chose x_(j+s+1)
    dy = np.zeros_like(y)
    l_feat = 0.0
    if has_next.any():
        l_feat, dy_feat = smooth_l1(y[has_next], want[has_next])
        dy[has_next] += dy_feat
    where, rows = pair_rows(batch, s)
    ce = 0.0
    if where.any():
        ce, dlogits = cross_entropy(vocab.logits(y[where]), batch.p[rows])
        dy[where] += y.dtype.type(CE_WEIGHT) * (dlogits @ vocab.w)  # the frozen LM head: dr = dlogits W
    return l_feat + CE_WEIGHT * ce, {"feat": l_feat, "ce": ce}, dy


def eagle_logits(params, target, vocab: DraftVocab, batch) -> tuple[np.ndarray, np.ndarray]:
    """Teacher-forced logits [n, N] of the labelled pairs, and which label rows they are ([n_labels] bool)."""
    f, emb, positions, mask = pairs(target, batch, 1)
    y, _ = head_forward(params, f, emb, positions, mask, head_hparams(target))
    where, rows = pair_rows(batch, 1)
    return vocab.logits(y[where]), rows


# ---------------------------------------------------------------------------
# EAGLE-3: fused features, token loss only, and the training-time test.
# ---------------------------------------------------------------------------


def ttt_mask(mask: np.ndarray) -> np.ndarray:
    """[B, P, P] causal mask of step 0 -> [B, 2P, 2P] for the pass over [u ; u'] (EAGLE-3's training-time test).

    Step 0's queries see step 0 as before; step 1's query t sees step 0's keys 0 .. t (the real
    pairs drafting would have committed) and its own key, nothing else:
        [[causal, 0],
         [causal, I]]
    """
    B, P, _ = mask.shape
    out = np.zeros((B, 2 * P, 2 * P), bool)
    out[:, :P, :P] = out[:, P:, :P] = mask
    out[:, P:, P:] = np.eye(P, dtype=bool)
    return out


def rms_logits(params, y, vocab: DraftVocab, eps: float):
    """EAGLE-3's output: its own final RMSNorm, then the LM head.  [n, e] -> ([n, N], saved)."""
    r, saved = lg.rms_norm(y, params["norm"], eps)
    return vocab.logits(r), saved


def unrolled_forward(params, g, emb, positions, mask, h: LlamaHParams):
    """The training-time test's two steps over pairs (g_j, emb_j): (y, y1 [B, P, e] each, saved0, saved1).

    Step 0 is teacher-forced; step 1's pair j is (y_j, x_(j+2)) at position j + 1 (the last pair's
    token is padding: never read), in a second pass over [u ; u'] under ttt_mask.
    """
    P = g.shape[1]
    y, saved0 = head_forward(params, g, emb, positions, mask, h)
    emb1 = np.concatenate([emb[:, 1:], emb[:, -1:]], axis=1)  # [B, P, e]
    both, saved1 = head_forward(
        params,
        np.concatenate([g, y], axis=1),
        np.concatenate([emb, emb1], axis=1),
        np.concatenate([positions, positions + 1], axis=1),
        ttt_mask(mask),
        h,
    )
    return y, both[:, P:], saved0, saved1


def unrolled_backward(dy0, dy1, params, saved0, saved1, h: LlamaHParams):
    """dL/dy, dL/dy1 -> (dL/dg [B, P, e], grads) through both steps."""
    P = dy0.shape[1]
    # Step 1's pass read [u ; u']: only its second half is scored; its input's feature half is [g ; y].
    dg1, grads = head_backward(np.concatenate([np.zeros_like(dy0), dy1], axis=1), params, saved1, h)
    dg0, grads = head_backward(dy0 + dg1[:, P:], params, saved0, h, grads)  # y feeds step 1: its gradient joins
    return dg0 + dg1[:, :P], grads


def eagle3_forward(params, target, batch):
    """Both steps: (y [B, P, e], y1 [B, P, e] step 1's outputs, saved)."""
    feats, emb, positions, mask = pairs(target, batch, 3)
    y, y1, saved0, saved1 = unrolled_forward(
        params, feats @ params["fuse"].T, emb, positions, mask, head_hparams(target)
    )
    return y, y1, (feats, saved0, saved1)


def eagle3_loss_and_grads(params, target, vocab: DraftVocab, batch):
    """EAGLE-3's loss (token CE of both unrolled steps) and its gradients: (loss, {"ce0", "ce1"}, grads)."""
    h = head_hparams(target)
    y, y1, (feats, saved0, saved1) = eagle3_forward(params, target, batch)
    losses, dys, grad_norm = {}, [], np.zeros_like(params["norm"])
    for step, out in enumerate((y, y1)):
        where, rows = pair_rows(batch, 1 + step)
        logits, norm_saved = rms_logits(params, out[where], vocab, h.rms_eps)
        ce, dlogits = cross_entropy(logits, batch.p[rows])
        weight = out.dtype.type(STEP_WEIGHTS[step])
        dr, dg = lg.rms_norm_backward(weight * (dlogits @ vocab.w), params["norm"], norm_saved)
        grad_norm += dg
        dy = np.zeros_like(out)
        dy[where] = dr
        dys.append(dy)
        losses[f"ce{step}"] = ce
    d_fused, grads = unrolled_backward(dys[0], dys[1], params, saved0, saved1, h)
    grads["fuse"] = lg.matmul_backward(d_fused, feats, params["fuse"])[1]
    grads["norm"] = grad_norm
    return sum(w * losses[f"ce{i}"] for i, w in enumerate(STEP_WEIGHTS)), losses, grads


def eagle3_logits(params, target, vocab: DraftVocab, batch) -> tuple[np.ndarray, np.ndarray]:
    """Step 0's teacher-forced logits [n, N] (what drafting's first token reads), and which label rows they are."""
    h = head_hparams(target)
    feats, emb, positions, mask = pairs(target, batch, 3)
    y, _ = head_forward(params, feats @ params["fuse"].T, emb, positions, mask, h)
    where, rows = pair_rows(batch, 1)
    return rms_logits(params, y[where], vocab, h.rms_eps)[0], rows


def two_step_logits(params, target, block: str, vocab: DraftVocab, batch) -> tuple[tuple, tuple]:
    """Drafting's first two tokens from one unrolled pass (unrolled_forward): ((z0, rows0), (z1, rows1)).

    z0 [n, N] are step 0's teacher-forced logits, as eagle_logits (or eagle3_logits) gives them; z1 are
    step 1's, read from the head's own first output, whether or not it was trained to. rows0 and rows1
    ([n_labels] bool) say which of the batch's label rows each scores.
    """
    h = head_hparams(target)
    g, emb, positions, mask = pairs(target, batch, 3 if block == "eagle3" else 1)
    if block == "eagle3":
        g = g @ params["fuse"].T
    y0, y1, _, _ = unrolled_forward(params, g, emb, positions, mask, h)
    out = []
    for y, shift in ((y0, 1), (y1, 2)):
        where, rows = pair_rows(batch, shift)
        z = rms_logits(params, y[where], vocab, h.rms_eps)[0] if block == "eagle3" else vocab.logits(y[where])
        out.append((z, rows))
    return out[0], out[1]


# ---------------------------------------------------------------------------
# EAGLE-3 started from a trained EAGLE head (--init-head).
# ---------------------------------------------------------------------------

RIDGE = 1e-3  # fuse's fit: the ridge, relative to each input dimension's mean square
FIT_ROWS = 64  # training rows whose every position fits fuse (tens of thousands of positions for 3e weights a column)


def fit_fuse(fused: np.ndarray, final: np.ndarray, ridge: float = RIDGE) -> tuple[np.ndarray, float]:
    """The linear map that best predicts the final feature from the three fused layers: (fuse [e, 3e], R^2).

    fused [n, 3e] (low, mid, high layers), final [n, e] (after the final norm), the same n positions.
    Least squares with a small ridge, each input dimension's relative to its own mean square (the
    layers' outlier dimensions are tens of times the others, and make X^T X ill-conditioned):
        fuse^T = (X^T X + ridge * diag(X^T X))^-1 X^T F,   in float64.
    R^2 = 1 - |X fuse^T - F|^2 / |F - mean F|^2, over the same positions.
    """
    x, f = fused.astype(np.float64), final.astype(np.float64)
    gram = x.T @ x
    gram[np.diag_indices_from(gram)] *= 1.0 + ridge
    w = np.linalg.solve(gram, x.T @ f)  # [3e, e]
    r2 = 1.0 - float(((x @ w - f) ** 2).sum() / ((f - f.mean(0)) ** 2).sum())
    return np.ascontiguousarray(w.T, F32), r2


def eagle3_from_eagle(eagle: dict[str, np.ndarray], fused: np.ndarray, final: np.ndarray) -> tuple[dict, float]:
    """EAGLE-3 parameters that start where a trained EAGLE head (block "llama") stands: (params, fuse's R^2).

    fc and the block are the EAGLE head's. fuse maps the three layers to the final feature the
    EAGLE head was trained to read (fit_fuse), so step 0 reads nearly what it read. EAGLE's output
    y was trained to be a final feature, scored by the LM head as it is; EAGLE-3 scores
    rms_norm(y) * norm instead, so norm's gain is the final features' median RMS: the logits of a
    y of typical size are unchanged. The training-time test feeds y back as EAGLE's --ttt did.
    """
    fuse, r2 = fit_fuse(fused, final)
    rms = np.sqrt(np.mean(final.astype(np.float64) ** 2, axis=-1))
    params = {name: np.array(w, F32) for name, w in eagle.items()}
    params["fuse"] = fuse
    params["norm"] = np.full(final.shape[-1], np.median(rms), F32)
    return params, r2


# ---------------------------------------------------------------------------
# The two as the trainer's head kinds (heads_train.HeadKind).
# ---------------------------------------------------------------------------


class LlamaEagleKind:
    """`python -m specdec.train eagle --block llama|eagle3 --data DIR ...`: a Llama-block EAGLE head.

    The file's kind is "eagle" (drafted by drafters/eagle.py, `--draft eagle:DIR`); its config's
    "block" says which head, "layers" which of the target's hidden states it reads.
    """

    name = "eagle"

    def __init__(self, block: str, ttt: bool = False):
        assert block in ("llama", "eagle3"), block
        assert not (ttt and block == "eagle3"), "EAGLE-3 always trains on its own drafts"
        self.block = block
        self.ttt = ttt  # the Llama block with EAGLE-3's training-time test (--ttt): a training choice, not the file's

    def layers(self, target) -> list[int]:
        """features.py numbering: EAGLE the last state (after the final norm), EAGLE-3 a low, middle and high one."""
        n = target.hparams.n_layer
        if self.block == "llama":
            return [n]
        return [min(max(layer, 0), n) for layer in eagle3_layers(n)[:3]]  # (a model of under 5 layers repeats some)

    def config(self, target, options: dict) -> dict:
        h = head_hparams(target)
        return {
            "n_heads": 1,
            "block": self.block,
            "layers": self.layers(target),
            "n_kv_head": h.n_kv_head,
            "n_ff": h.n_ff,
            "rope_theta": h.rope_theta,
        }

    def param_shapes(self, target, config: dict) -> dict[str, tuple[int, ...]]:
        return llama_param_shapes(head_hparams(target), self.block)

    def init_params(self, target, config: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return init_params(target, self.block, rng)

    def loss_and_grads(self, params, target, config, vocab, batch):
        if self.block == "eagle3":
            return eagle3_loss_and_grads(params, target, vocab, batch)
        return eagle_loss_and_grads(params, target, vocab, batch, ttt=self.ttt)

    def logits(self, params, target, config, vocab, batch):
        return (eagle3_logits if self.block == "eagle3" else eagle_logits)(params, target, vocab, batch)

    def two_logits(self, params, target, config, vocab, batch):
        return two_step_logits(params, target, self.block, vocab, batch)

    def read_init_head(self, folder, target) -> tuple[dict, dict[str, np.ndarray]]:
        """--init-head: (config, weights) of a trained EAGLE head with a Llama block, read by the checked loader."""
        if self.block != "eagle3":
            raise ValueError(
                "--init-head starts an EAGLE-3 head from a trained EAGLE head: give --block eagle3 (to "
                "go on training a head of the same kind, use --init with its run's folder)"
            )
        config, params, _ = load_heads(folder, "eagle", target, head_shapes(folder, target))
        if config.get("block") != "llama":
            raise ValueError(
                f"--init-head {folder}: its block is {config.get('block')!r}; EAGLE-3 starts from "
                f"an EAGLE head with a Llama block (--block llama), such as the shipped one ('eagle')"
            )
        return config, params

    def start_from_head(self, eagle: dict, target, data, rows: list[int], states: dict) -> tuple[dict, float, int]:
        """EAGLE-3's starting weights from an EAGLE head (eagle3_from_eagle), fuse fitted on the first FIT_ROWS
        training rows: (params, fuse's R^2, positions fitted). Those rows' final features are computed here."""
        fit = rows[:FIT_ROWS]
        final = dict(hidden_states(target, data, [target.hparams.n_layer], fit))
        fused = np.concatenate([np.concatenate(list(states[r]), axis=-1) for r in fit])  # [n, 3e]
        wanted = np.concatenate([final[r][0] for r in fit])  # [n, e]
        params, r2 = eagle3_from_eagle(eagle, fused, wanted)
        return params, r2, len(wanted)
