"""Medusa-1 heads: extra decoding heads on the target's last hidden state, forward and backward.

Cai et al., "Medusa: Simple LLM Inference Acceleration Framework with Multiple
Decoding Heads" (arXiv 2401.10774), section 2.1.1. The target's hidden state h_t
(after ln_f, at the position whose logits give token x_(t+1)) already carries a
lot about the tokens after x_(t+1). Head i (i = 0 .. n_heads-1) guesses token
x_(t+i+2) from h_t alone:

    r_i = h + SiLU(h @ W_i + b_i)        a ResBlock          [n, n_embd]
    logits_i = r_i @ wte.T               the target's own frozen, tied LM head

W_i starts at zero, so an untrained head is the plain LM head (it guesses that
x_(t+i+2) is whatever the target predicts for x_(t+1)), and training only has to
learn the correction. Medusa-1 trains the heads alone, the target frozen, with
the loss sum_i lambda_i CE_i, lambda_i = 0.8^(i+1) (the paper's lambda_k = 0.8^k
for head k = 1, 2, ...): later heads are less accurate and count less.

Drafting costs no extra target pass: the verification pass already computes the
hidden state at the last accepted position, and the heads read it.

This file holds the head's forward pass and, right beside it, its backward pass,
so one can be checked against the other (tests/test_heads.py does, by finite
differences).

Shape notation: n rows, n_embd the target's width, n_heads heads.
"""

from __future__ import annotations

import copy

import numpy as np

from ..interfaces import Proposal
from ..model.linear import Linear
from ..sampling import draw
from .heads import DraftVocab, draft_argmax, draft_distribution, head_cross_entropy, load_heads
from .stopping import ChainGate, ConfidenceStop
from .trees import dynamic_tree

F32 = np.float32
DECAY = 0.8  # lambda_i = DECAY^(i+1), Medusa-1's per-head loss weight


def param_shapes(n_heads: int, n_embd: int) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape (also what a head file must hold: heads.load_heads)."""
    return {
        "w": (n_heads, n_embd, n_embd),  # y = h @ w[i]
        "b": (n_heads, n_embd),
    }


def init_params(n_heads: int, n_embd: int) -> dict[str, np.ndarray]:
    """Medusa's initialisation: W = 0 and b = 0, so every head starts as the LM head."""
    return {name: np.zeros(shape, F32) for name, shape in param_shapes(n_heads, n_embd).items()}


def sigmoid(x: np.ndarray) -> np.ndarray:
    return F32(0.5) * (F32(1) + np.tanh(F32(0.5) * x))  # = 1 / (1 + e^-x), without overflow


def resblock(h: np.ndarray, w: np.ndarray, b: np.ndarray):
    """One head's ResBlock: r = h + SiLU(h @ w + b).  [n, n_embd] -> [n, n_embd]

    Returns (r, saved) where saved = (z, s) is what the backward pass needs.
    """
    z = h @ w + b  # [n, n_embd]
    s = sigmoid(z)
    return h + z * s, (z, s)  # SiLU(z) = z * sigmoid(z)


def resblock_backward(dr: np.ndarray, h: np.ndarray, w: np.ndarray, saved):
    """Gradients of the ResBlock given dL/dr: returns (dw, db, dh).

    SiLU'(z) = s + z s (1 - s), s = sigmoid(z)
    dz = dr * SiLU'(z);  dw = h.T @ dz;  db = sum_rows dz;  dh = dr + dz @ w.T
    """
    z, s = saved
    dz = dr * (s + z * s * (F32(1) - s))  # [n, n_embd]
    return h.T @ dz, dz.sum(axis=0), dr + dz @ w.T


def head_logits(params: dict[str, np.ndarray], h: np.ndarray, vocab: DraftVocab, heads=None) -> np.ndarray:
    """Every head's logits for hidden states h: [n, n_embd] -> [n_heads, n, N] (N: draft vocabulary).

    The heads' features are scored in one product with the LM head, so the
    (large) LM head matrix is read once for all heads, not once per head.
    """
    heads = range(params["w"].shape[0]) if heads is None else heads
    r = np.stack([resblock(h, params["w"][i], params["b"][i])[0] for i in heads])  # [n_heads, n, n_embd]
    return vocab.logits(r.reshape(-1, h.shape[1])).reshape(len(r), len(h), -1)


def loss_and_grads(params: dict[str, np.ndarray], hs: list[np.ndarray], targets: list[np.ndarray], vocab: DraftVocab):
    """Medusa-1's loss, sum_i lambda_i CE_i, and its gradients.

    hs[i]: [n_i, n_embd] the target hidden states head i reads; targets[i]:
    [n_i, N] what it should put on each token (n_i differs between heads: near
    the end of a sequence there is no token i+2 places ahead). Returns
    (loss, per-head CE list, grads dict like params).
    """
    grads = {name: np.zeros_like(a) for name, a in params.items()}
    total, per_head = 0.0, []
    for i, (h, p) in enumerate(zip(hs, targets)):
        weight = DECAY ** (i + 1)
        r, saved = resblock(h, params["w"][i], params["b"][i])
        ce, dr, _ = head_cross_entropy(r, p, vocab)  # dr: [n_i, n_embd]
        grads["w"][i], grads["b"][i], _ = resblock_backward(dr * F32(weight), h, params["w"][i], saved)
        total += weight * ce
        per_head.append(ce)
    return total, per_head, grads


# ---------------------------------------------------------------------------
# Drafting: the Drafter interface (interfaces.py).
# ---------------------------------------------------------------------------


class MedusaDrafter:
    """Drafts from trained Medusa heads: a chain (one token per head) or a tree.

    NOTE: the heads read the hidden state of the row that produced ids[-1] (the
    last accepted position of the verification pass, after ln_f), which
    `commit` keeps. Head i then guesses the token i+1 places after ids[-1].

    Chain: token i is head i's argmax (greedy) or a draw from head i's q. The
    heads do not see each other's tokens, so q_i is the distribution token i
    was drawn from whatever came before it, as the exact rule requires.
    Tree (nodes=...): every node at depth d takes its children from head d
    (Medusa's Cartesian product of per-head candidates), grown and pruned to
    the node budget by path confidence (trees.dynamic_tree, `width` children
    per expanded node): one head evaluation serves the whole tree.
    """

    def __init__(
        self, params: dict[str, np.ndarray], vocab: DraftVocab, width: int = 4, stop: ConfidenceStop | None = None
    ):
        self.params, self.vocab, self.width = params, vocab, width
        self.stop = stop  # a chain ends where the heads' confidence falls below the bar (stopping.py)
        self.n_heads = params["w"].shape[0]
        self.n_vocab = vocab.n_vocab
        self.n_ctx = None  # the heads add no context limit of their own
        self.calls = 0  # head evaluations (one per round, all heads at once)
        self.hidden = None  # [n_embd]: the target's hidden state at the row that produced ids[-1]
        # All heads' W side by side, one product for every head: [n_embd] -> [n_heads * n_embd].
        w, b = params["w"], params["b"]  # [n_heads, n_embd, n_embd], [n_heads, n_embd]
        self.fused = Linear.from_checkpoint(np.concatenate(list(w), axis=1), b.reshape(-1))

    def logits(self, depth: int) -> np.ndarray:
        """The first `depth` heads' logits after the kept hidden state: [depth, N].

        The same math as head_logits, arranged for one row: every head's W in one
        product, then every head's features through the LM head in one more.
        """
        h = self.hidden[None]  # [1, n_embd]
        z = (h @ self.fused).reshape(self.n_heads, -1)[:depth]  # [depth, n_embd]
        r = h + z * sigmoid(z)  # the ResBlocks: h + SiLU(h W_i + b_i)
        return self.vocab.logits(r)  # [depth, N]

    @classmethod
    def load(cls, folder, target, **options) -> "MedusaDrafter":
        _, params, vocab = load_heads(folder, "medusa", target, param_shapes)
        return cls(params, vocab, **options)

    def fresh(self) -> MedusaDrafter:
        """A drafter for another sequence: these heads' weights, shared (drafting only reads them), and its
        own per-sequence state (the kept hidden state, the call count). A batch gives each row one."""
        twin = copy.copy(self)  # params, vocab and the fused W: the same arrays
        twin.hidden, twin.calls = None, 0
        return twin

    def begin(self, target, cache, prompt) -> None:
        self.hidden = None

    def commit(self, ids, features) -> None:
        if len(features):  # (no new rows: nothing changed)
            self.hidden = np.asarray(features[-1], dtype=F32)  # the row whose logits gave ids[-1]

    def _chain(self, logits, params, rng) -> Proposal:
        """Head i's argmax, or a draw from head i's q, for each head; `stop` may end the chain sooner."""
        q = None if params.greedy else draft_distribution(logits, self.vocab, params)  # [depth, n_vocab]
        tokens, gate = [], ChainGate(self.stop)
        for i, row in enumerate(logits):
            q_i = None if q is None else q[i]
            if not gate.opens(row, q_i):
                break  # decided from q, before drawing (stopping.py)
            tokens.append(draft_argmax(row, self.vocab) if q_i is None else draw(q_i, rng))
            gate.drew(tokens[-1], q_i)
        return Proposal.chain(tokens, None if q is None else q[: len(tokens)])

    def propose(self, ids, k, params, rng, nodes=None):
        depth = min(k, self.n_heads)
        if self.hidden is None or depth < 1:  # a one-token prompt: no hidden state until the first pass
            return Proposal.chain([])
        self.calls += 1
        logits = self.logits(depth)  # [depth, N]
        if nodes is None:
            return self._chain(logits, params, rng)

        rows = self.vocab.full(logits)  # [depth, n_vocab], -inf outside the draft vocabulary

        def step(tokens, parents):  # row 0: head 0 (after the root); after a node at depth d: head d+1
            level = [0]
            for parent in parents:
                level.append(level[parent + 1] + 1)
            return rows[np.minimum(level, depth - 1)]  # nodes at the last depth are never expanded

        tokens, parents, q = dynamic_tree(step, depth, nodes, self.width, params, rng)
        return Proposal(tokens, parents, q)
