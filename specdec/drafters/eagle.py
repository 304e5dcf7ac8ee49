"""EAGLE: a one-block draft that extrapolates the target's features; the drafter and its head files.

Li et al., "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty"
(arXiv 2401.15077), section 4. Drafting happens at the level of features (the
target's final hidden state after ln_f, what its LM head reads), not tokens.
The draft reads the feature sequence f_0, f_1, ... paired with the token that
each one produced, shifted by one, because a feature alone is uncertain about
which token was actually sampled from it:

    u_j = fc([f_j ; wte[x_(j+1)]])            [n, 2*n_embd] -> [n, n_embd]
    y_j = GPT2Block(u)_j                      one block, causal attention: y_j sees u_0 .. u_j
    y_j ~ f_(j+1)                             the predicted next feature
    logits_j = y_j @ wte.T                    the target's own frozen LM head -> x_(j+2)

Drafting runs this autoregressively: the drafted token and the predicted
feature are paired and fed back, with the block's own KV cache. Training is
teacher-forced on the target's true features (eagle_grad.py: the block's
backward and EAGLE's loss).

The block is GPT-2's own (pre-LayerNorm, causal multi-head attention, GELU
MLP), weights named as in a GPT-2 checkpoint, so drafting reuses
gpt2.transformer_block with a one-layer KV cache.

Differences from the paper, and why: the block is GPT-2's (the target's
architecture) instead of LLaMA's, so it has no rotary positions and no position
embedding of its own: position reaches it through the features and the causal
mask. The paper's uniform noise on training features (its "feature
uncertainty" augmentation) is left out.

For a Llama target a head may have a Llama block instead (its file's config
"block": "llama", or "eagle3" for EAGLE-3's variant), trained in
train/eagle_llama.py; LlamaEagleModel below drafts with it through
model/llama.py's own inference block, and EagleDrafter drafts with either.

Shape notation: B sequences of T positions, n_embd (e) the target's width,
n_head heads of d_head, n = B*T rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import safe_io
from ..checkpoints.pairs import show
from ..interfaces import Proposal
from ..model.attention import KVCache
from ..model.gpt2 import Block, HParams, transformer_block
from ..model.linear import Linear
from ..model.llama import LlamaBlock, LlamaHParams, llama_block, rms_norm, rope_tables
from ..model.base import Row
from ..sampling import draw
from .heads import (
    CONFIG_FILE,
    DraftVocab,
    HeadFileError,
    draft_argmax,
    draft_distribution,
    load_heads,
)
from .stopping import ChainGate, ConfidenceStop
from .trees import dynamic_tree

F32 = np.float32
# The block a head file's config names: "gpt2" (this file's, the default of files without the field), or a
# Llama block for Llama targets, EAGLE's ("llama") or EAGLE-3's ("eagle3"), trained in train/eagle_llama.py.
BLOCKS = ("gpt2", "llama", "eagle3")

LINEARS = {  # name: (n_in, n_out) in units of n_embd
    "fc": (2, 1),
    "attn.c_attn": (1, 3),
    "attn.c_proj": (1, 1),
    "mlp.c_fc": (1, 4),
    "mlp.c_proj": (4, 1),
}


def param_shapes(n_heads: int, n_embd: int) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape (also what a head file must hold: heads.load_heads).
    n_heads: 1, EAGLE's one draft model (the argument is there to match medusa.param_shapes)."""
    shapes = {}
    for name, (a, b) in LINEARS.items():
        shapes[name + ".weight"] = (a * n_embd, b * n_embd)  # [n_in, n_out]
        shapes[name + ".bias"] = (b * n_embd,)
    for ln in ("ln_1", "ln_2"):
        shapes[ln + ".weight"] = shapes[ln + ".bias"] = (n_embd,)
    return shapes


def llama_param_shapes(h: LlamaHParams, block: str) -> dict[str, tuple[int, ...]]:
    """A Llama-block head's tensors (train/eagle_llama.py): fc [e, 2e] ([n_out, n_in]), one block of the
    target's shapes as blk.<GGUF name>, and for EAGLE-3 fuse [e, 3e] (low, mid, high layers) and norm [e]."""
    e = h.n_embd
    shapes = {"fc": (e, 2 * e), **{"blk." + name: shape for name, shape in LlamaBlock.checkpoint_shapes(h).items()}}
    if block == "eagle3":
        shapes.update(fuse=(e, 3 * e), norm=(e,))
    return shapes


# ---------------------------------------------------------------------------
# Drafting: the same block through gpt2.transformer_block, with its own KV cache.
# ---------------------------------------------------------------------------


class EagleModel:
    """Trained EAGLE weights ready to draft: fc, a GPT-2 Block, and a one-layer KV cache per run."""

    def __init__(self, params: dict[str, np.ndarray], n_embd: int, n_head: int, n_ctx: int, eps: float):
        self.hparams = HParams(n_vocab=1, n_ctx=n_ctx, n_embd=n_embd, n_head=n_head, n_layer=1, layer_norm_epsilon=eps)
        self.fc = Linear.from_checkpoint(params["fc.weight"], params["fc.bias"])

        def lin(name):
            return Linear.from_checkpoint(params[name + ".weight"], params[name + ".bias"])

        self.block = Block(
            ln_1_weight=params["ln_1.weight"],
            ln_1_bias=params["ln_1.bias"],
            attn_c_attn=lin("attn.c_attn"),
            attn_c_proj=lin("attn.c_proj"),
            ln_2_weight=params["ln_2.weight"],
            ln_2_bias=params["ln_2.bias"],
            mlp_c_fc=lin("mlp.c_fc"),
            mlp_c_proj=lin("mlp.c_proj"),
        )

    def new_cache(self) -> KVCache:
        return KVCache(self.hparams)

    def read(self, features: np.ndarray) -> np.ndarray:
        """The target's features as the head reads them: as they are."""
        return features

    def out(self, y: np.ndarray) -> np.ndarray:
        """What the LM head reads of an output: the output itself (it predicts a feature after ln_f)."""
        return y

    def step(self, f, emb, cache: KVCache, seen=None, positions=None) -> np.ndarray:
        """Append n pairs (f_j, emb of x_(j+1)) to the cache; return their predicted next features.

        f, emb: [n, n_embd] -> [n, n_embd]. seen: [n, n_past + n] bool, which
        positions each new pair may attend to (a tree's ancestors); None is a
        chain after the whole cache. positions: unused (GPT-2's block has no
        positions of its own; LlamaEagleModel's rotary block reads them).
        """
        n, n_past = len(f), cache.length
        u = np.concatenate([f, emb], axis=-1) @ self.fc  # [n, 2e] -> [n, e]
        cache.reserve(n_past + n)
        y = transformer_block(u, self.block, self.hparams, cache, 0, attention_bias(seen, n, n_past))
        cache.length = n_past + n
        return y


def attention_bias(seen: np.ndarray | None, n: int, n_past: int) -> np.ndarray | None:
    """[n, n_past + n] bool of what each new pair may see (None: a chain) -> 0 / -inf bias, None for one pair."""
    if seen is None and n > 1:
        seen = np.concatenate([np.ones((n, n_past), dtype=bool), np.tri(n, dtype=bool)], axis=1)
    return None if seen is None else np.where(seen, F32(0), F32(-np.inf))


class LlamaEagleModel:
    """A trained Llama-block head (train/eagle_llama.py) ready to draft: fc, model.llama's own block, a KV cache.

    block "llama" (EAGLE): reads the target's final feature, its output is a feature for the LM head.
    block "eagle3": reads three of the target's layers fused by `fuse`, and its output passes its own
    RMSNorm before the LM head; drafting feeds its outputs back, as it was trained to (training-time test).
    """

    def __init__(self, params: dict[str, np.ndarray], hparams: LlamaHParams, block: str, n_ctx: int):
        self.hparams = LlamaHParams(**{**vars(hparams), "n_layer": 1, "n_ctx": n_ctx})
        self.fc = Linear(np.ascontiguousarray(params["fc"], F32), None)  # [e, 2e]: Linear's [n_out, n_in]
        self.block = LlamaBlock.fuse(
            **{name: np.ascontiguousarray(params["blk." + name], F32) for name in LlamaBlock.CHECKPOINT_NAMES}
        )
        self.fuse = Linear(np.ascontiguousarray(params["fuse"], F32), None) if block == "eagle3" else None
        self.norm = params.get("norm")

    def new_cache(self) -> KVCache:
        return KVCache(self.hparams)

    def read(self, features: np.ndarray) -> np.ndarray:
        """[n, e] final features (EAGLE), or [n, 3e] low, mid, high layers fused to [n, e] (EAGLE-3)."""
        return features if self.fuse is None else features @ self.fuse

    def out(self, y: np.ndarray) -> np.ndarray:
        return y if self.norm is None else rms_norm(y, self.norm, self.hparams.rms_eps)

    def step(self, f, emb, cache: KVCache, seen=None, positions=None) -> np.ndarray:
        """As EagleModel.step; positions [n]: each pair's rotary position (None: the next cache slots, a chain)."""
        n, n_past = len(f), cache.length
        h = self.hparams
        u = np.concatenate([f, emb], axis=-1) @ self.fc  # [n, 2e] -> [n, e]
        cache.reserve(n_past + n)
        positions = n_past + np.arange(n) if positions is None else np.asarray(positions)
        cos, sin = rope_tables(positions, h.d_head, h.rope_theta)  # [n, d_head] each
        y = llama_block(u, self.block, h, [Row(0, n, cache, n_past, attention_bias(seen, n, n_past))], 0, cos, sin)
        cache.length = n_past + n
        return y


def head_block(folder) -> str:
    """The block an EAGLE head file names (its config's "block"; "gpt2" when absent), checked."""
    path = Path(folder).expanduser() / CONFIG_FILE
    try:
        block = safe_io.read_json(path).get("block", "gpt2")
    except (OSError, ValueError):
        return "gpt2"  # load_heads reports the missing or malformed file
    if block not in BLOCKS:
        raise HeadFileError(
            f"{path}: 'block' is {show(block)}, expected one of {', '.join(map(repr, BLOCKS))}; "
            f"train heads with: python -m specdec.train eagle --model MODEL --out {folder}"
        )
    return block


def head_shapes(folder, target):
    """What heads.load_heads checks an EAGLE head file's tensors against, by the block the file names."""
    block = head_block(folder)
    if block == "gpt2":
        return param_shapes
    if not isinstance(target.hparams, LlamaHParams):
        raise HeadFileError(
            f"{folder}: these EAGLE heads have a Llama block ({block!r}) and draft only for a Llama "
            f"target, not {target.name!r}"
        )
    return lambda n_heads, n_embd: llama_param_shapes(target.hparams, block)


def check_llama_config(folder, config: dict, target) -> None:
    """HeadFileError unless the numbers a Llama-block head's heads.json records are the target's: its block
    computes with the target's own heads, MLP width and rotary base (LlamaEagleModel), so a file that says
    otherwise (a NaN rope_theta, another head count) was not trained for this target, or was edited.
    "layers": the target layers it reads, 3 for EAGLE-3 (low, mid, high), the last one for EAGLE (which
    files saved without it read too)."""
    path, h = Path(folder) / CONFIG_FILE, target.hparams
    for field, want in (("n_kv_head", h.n_kv_head), ("n_ff", h.n_ff), ("rope_theta", h.rope_theta)):
        have = config.get(field)
        number = type(have) is int or (type(have) is float and field == "rope_theta")  # (NaN equals nothing)
        if not (number and have == want):
            raise HeadFileError(
                f"{path}: {field!r} is {show(have)}, but the target {target.name!r} has {field}={want} and the "
                "head's block computes with it; train heads for this model"
            )
    layers, count = config.get("layers", [target.n_layer]), 3 if config["block"] == "eagle3" else 1
    in_range = isinstance(layers, list) and all(type(x) is int and 0 <= x <= target.n_layer for x in layers)
    if not (in_range and len(layers) == count):
        raise HeadFileError(
            f"{path}: 'layers' must list the {count} target layer{'' if count == 1 else 's'} (0..{target.n_layer}) the head reads, "
            f"got {show(layers)}"
        )


class EagleDrafter:
    """Drafts with a trained EAGLE model: a chain, or an EAGLE-2 dynamic tree.

    Its KV cache holds one entry per pair (f_t, x_(t+1)) of the committed text:
    entry t pairs the target's feature at position t with the token after it.
    NOTE: after every target pass `commit` feeds the pairs of EVERY newly
    accepted position (the target's true features replace the draft's own
    guesses, which are rolled back), and keeps the last output: the predicted
    feature after ids[-1], whose logits give the first draft token.
    Chain: draft token i+1 comes from the block's output on (predicted feature,
    draft token i), one pair per step. Tree (nodes=...): EAGLE-2's dynamic
    tree (trees.dynamic_tree), each new layer fed in one block pass with a tree mask.
    """

    def __init__(
        self,
        model,
        vocab: DraftVocab,
        wte: np.ndarray,
        width: int = 4,
        hidden_layers: list | None = None,
        stop: ConfidenceStop | None = None,
    ):
        self.model, self.vocab, self.wte, self.width = model, vocab, wte, width
        self.stop = stop  # a chain ends where the head's confidence falls below the bar (stopping.py)
        # The target's states commit() is given (interfaces.features_asked): None, the final one (EAGLE);
        # EAGLE-3's three layers, side by side, which its model fuses (LlamaEagleModel.read).
        self.hidden_layers = hidden_layers
        self.n_vocab = vocab.n_vocab
        self.n_ctx = model.hparams.n_ctx
        self.calls = 0  # block passes
        self.cache = model.new_cache()
        self.root = None  # [n_embd] the predicted feature after ids[-1]

    @classmethod
    def load(cls, folder, target, **options) -> "EagleDrafter":
        config, params, vocab = load_heads(folder, "eagle", target, head_shapes(folder, target))
        if config.get("block", "gpt2") == "gpt2":
            model = EagleModel(params, target.n_embd, config["n_head"], target.n_ctx, config["layer_norm_epsilon"])
            return cls(model, vocab, target.weights.wte, **options)
        check_llama_config(folder, config, target)
        model = LlamaEagleModel(params, target.hparams, config["block"], target.n_ctx)
        if config["block"] == "llama":
            return cls(model, vocab, target.weights.wte, **options)
        return cls(model, vocab, target.weights.wte, hidden_layers=config["layers"], **options)

    def fresh(self) -> EagleDrafter:
        """A drafter for another sequence: this head's model, vocabulary and LM head, shared (drafting only
        reads them), with its own KV cache and predicted feature. A batch gives each row one."""
        return EagleDrafter(self.model, self.vocab, self.wte, self.width, self.hidden_layers, self.stop)

    def begin(self, target, cache, prompt) -> None:
        self.cache.rollback(0)
        self.root = None

    def commit(self, ids, features) -> None:
        m = len(features)
        start = len(ids) - 1 - m  # the first position just written into the target's cache
        self.cache.rollback(start)  # drop the draft's guesses beyond the committed pairs
        if m == 0:
            return
        self.calls += 1
        f = self.model.read(np.asarray(features, F32))  # [m, n_embd]
        y = self.model.step(f, self.wte[ids[start + 1 : start + 1 + m]], self.cache)
        self.root = y[-1]

    def propose(self, ids, k, params, rng, nodes=None):
        if self.root is None or k < 1:  # a one-token prompt: no features until the first pass
            return Proposal.chain([])
        if nodes is not None:
            return self._tree(k, nodes, params, rng)
        y, tokens, q_rows, gate = self.root, [], [], ChainGate(self.stop)
        for i in range(k):
            logits = self.vocab.logits(self.model.out(y[None]))  # [1, N]
            q = None if params.greedy else draft_distribution(logits, self.vocab, params)[0]  # [n_vocab]
            if not gate.opens(logits[0], q):
                break  # decided from q, before drawing (stopping.py)
            tokens.append(draft_argmax(logits[0], self.vocab) if q is None else draw(q, rng))
            gate.drew(tokens[-1], q)
            if q is not None:
                q_rows.append(q)
            if i + 1 < k:  # feed (predicted feature, drafted token); its output predicts the next one
                self.calls += 1
                y = self.model.step(y[None], self.wte[tokens[-1]][None], self.cache)[0]
        return Proposal.chain(tokens, np.stack(q_rows) if q_rows else None)

    def _tree(self, k, nodes, params, rng):
        committed = self.cache.length
        out, slot, rows = [], [], [self.vocab.full(self.vocab.logits(self.model.out(self.root[None])))[0]]

        def step(tokens, parents):  # feed the nodes added since the last call, as one layer
            new = range(len(out), len(tokens))
            if len(new):
                n = len(new)
                seen = np.zeros((n, self.cache.length + n), dtype=bool)  # [n, n_past + n]
                seen[:, :committed] = True  # the committed text
                depth = np.zeros(n, np.int64)
                for row, node in enumerate(new):
                    seen[row, self.cache.length + row] = True  # itself
                    a = parents[node]
                    while a >= 0:  # its ancestors, fed in earlier layers
                        seen[row, committed + slot[a]] = True
                        a, depth[row] = parents[a], depth[row] + 1
                slot.extend(range(self.cache.length - committed, self.cache.length - committed + n))
                f = np.stack([out[parents[i]] if parents[i] >= 0 else self.root for i in new])  # what drew each
                self.calls += 1
                # NOTE: a node's position is committed + its depth (as a chain's i-th draft's), not its slot
                y = self.model.step(f, self.wte[[tokens[i] for i in new]], self.cache, seen, committed + depth)
                out.extend(y)  # [n, n_embd]
                rows.extend(self.vocab.full(self.vocab.logits(self.model.out(y))))
            return np.stack(rows)  # [len(tokens) + 1, n_vocab]

        tokens, parents, q = dynamic_tree(step, k, nodes, self.width, params, rng)
        return Proposal(tokens, parents, q)
