"""The distillation rows as a head's training sees them: the held-out split, the labels, the batches,
and the held-out accuracy that every run reports (heads_train.py is the run itself).

- held_out_rows: a request's rows are all held out or all trained on, by its text's sha256.
- soft_targets: the shards' top-k of the target's distribution, restricted to the draft vocabulary.
- make_batch / row_batches: whole rows, right-padded, grouped by length (HeadBatch).
- held_out_accuracy: teacher-forced top-1 and top-5 by reply position, and for heads that draft from
  their own outputs, the second draft token's top-1.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ..drafters.heads import DraftVocab
from .shards import DistillData

F32 = np.float32


# ---------------------------------------------------------------------------
# The held-out split, labels and batches (heads_train.py's steps 1, 4 and 5).
# ---------------------------------------------------------------------------


def held_out_rows(data: DistillData, frac: float) -> np.ndarray:
    """[n_rows] bool: True for the rows held out. A row is held out when its request's text hashes into
    the first `frac` of the range, so every row answering one request falls on the same side."""
    cut = int(frac * 2**32)
    return np.array([int.from_bytes(hashlib.sha256(t.encode()).digest()[:4], "big") < cut for t in data.request_text])


def row_tokens(data: DistillData, r: int) -> np.ndarray:
    """Row r's whole sequence: its chat prompt, then its reply. [n_prompt + n_reply] int64."""
    return np.concatenate([data.prompts[r], data.replies[r]]).astype(np.int64)


def soft_targets(top_ids: np.ndarray, top_probs: np.ndarray, vocab: DraftVocab) -> np.ndarray:
    """The stored top-k of the target's distribution -> [n, N] targets on the draft vocabulary.

    top_ids, top_probs: [n, k]. The k probabilities are renormalised to sum to 1
    (they are the target's k most likely tokens; the rest of its mass, typically a
    few percent, is unknown), then restricted: mass on tokens outside the draft
    vocabulary is dropped, so a row may sum to less than 1, which is the mass a
    restricted head must give up (heads.cross_entropy handles such rows).
    """
    p = top_probs / np.maximum(top_probs.sum(axis=-1, keepdims=True), 1e-30)  # [n, k]
    where = np.searchsorted(vocab.ids, top_ids)  # [n, k] the slot each id would take in the sorted vocabulary
    where = np.minimum(where, len(vocab.ids) - 1)
    inside = vocab.ids[where] == top_ids  # [n, k]
    out = np.zeros((len(top_ids), len(vocab.ids)), F32)
    rows = np.repeat(np.arange(len(top_ids)), top_ids.shape[1]).reshape(top_ids.shape)
    np.add.at(out, (rows[inside], where[inside]), p[inside].astype(F32))
    return out


@dataclass
class HeadBatch:
    """A batch of whole rows, right-padded (see the trainer's interface notes in heads_train.HeadKind)."""

    tokens: np.ndarray  # [B, T] int64 token ids (prompt then reply, padded with 0)
    states: np.ndarray  # [n_layers, B, T, e] float32: states[:, b, t] the hidden state at position t (0 past the row)
    lengths: np.ndarray  # [B] each row's length
    label_mask: np.ndarray  # [B, T] bool: position t has a label (token t + 1 is a reply token)
    p: np.ndarray  # [n_labels, N] float32 the target's distribution of token t + 1 (row-major over label_mask)
    next_ids: np.ndarray  # [n_labels] int64 the token t + 1 actually written
    reply_pos: np.ndarray  # [n_labels] int64 which reply token t + 1 is (0: the reply's first)

    @property
    def n_labels(self) -> int:
        return len(self.next_ids)


def make_batch(data: DistillData, rows: list[int], states: dict, vocab: DraftVocab) -> HeadBatch:
    """Rows -> one HeadBatch (right-padded to the longest)."""
    seqs = [row_tokens(data, r) for r in rows]
    lengths = np.array([len(s) for s in seqs])
    B, T = len(rows), int(lengths.max())
    n_layers, _, e = states[rows[0]].shape
    tokens = np.zeros((B, T), np.int64)
    st = np.zeros((n_layers, B, T, e), F32)
    mask = np.zeros((B, T), bool)
    ids, probs = [], []
    for b, (r, s) in enumerate(zip(rows, seqs)):
        tokens[b, : len(s)] = s
        st[:, b, : len(s) - 1] = states[r]
        n_prompt = len(data.prompts[r])
        mask[b, n_prompt - 1 : len(s) - 1] = True  # positions whose next token is a reply token
        ids.append(data.top_ids[r])
        probs.append(data.top_probs[r])
    p = soft_targets(np.concatenate(ids), np.concatenate(probs), vocab)
    next_ids = np.concatenate([data.replies[r] for r in rows]).astype(np.int64)
    reply_pos = np.concatenate([np.arange(len(data.replies[r])) for r in rows])
    return HeadBatch(tokens, st, lengths, mask, p, next_ids, reply_pos)


def row_batches(
    data: DistillData, rows: list[int], max_tokens: int, rng: np.random.Generator | None
) -> list[list[int]]:
    """Rows grouped into batches of similar length, each at most max_tokens positions padded
    (a row longer than that is a batch alone); the batches in random order when rng is given."""
    order = sorted(rows, key=lambda r: (len(data.prompts[r]) + len(data.replies[r]), r))
    if rng is not None:  # shuffle within runs of similar length, so batches differ between epochs
        order = [order[i] for i in np.argsort(np.arange(len(order)) // 32 + rng.random(len(order)), kind="stable")]
    batches, current, longest = [], [], 0
    for r in order:
        n = len(data.prompts[r]) + len(data.replies[r])
        if current and max(longest, n) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(r)
        longest = max(longest, n)
    if current:
        batches.append(current)
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


# ---------------------------------------------------------------------------
# Held-out accuracy (heads_train.py's step 6).
# ---------------------------------------------------------------------------


def held_out_accuracy(kind, params, target, config, vocab, data, rows, states, max_tokens) -> dict:
    """Teacher-forced top-1 and top-5 over every labelled position of the rows, and top-1 by reply position
    bucket (0-15, 16-63, 64+): {"top1", "top5", "positions", "top1_by_position"}. For a head that drafts
    from its own outputs (a Llama block: its kind has two_logits), also "top1_second": top-1 of drafting's
    second token, read from the head's own first output; both tokens then come from one unrolled pass.
    kind: a heads_train.HeadKind."""
    hits1 = hits5 = n = 0
    second = [0, 0] if hasattr(kind, "two_logits") else None
    buckets = {"0-15": [0, 0], "16-63": [0, 0], "64+": [0, 0]}
    for group in row_batches(data, rows, max_tokens, None):
        batch = make_batch(data, group, states, vocab)
        if second is None:
            z, rows_used = kind.logits(params, target, config, vocab, batch)
        else:
            (z, rows_used), (z2, rows2) = kind.two_logits(params, target, config, vocab, batch)
            second[0] += int((vocab.ids[z2.argmax(axis=-1)] == batch.next_ids[rows2]).sum())
            second[1] += len(z2)
        truth, j = batch.next_ids[rows_used], batch.reply_pos[rows_used]
        top5 = (
            vocab.ids[np.argpartition(-z, 4, axis=-1)[:, :5]]
            if z.shape[1] > 5
            else vocab.ids[None, :].repeat(len(z), 0)
        )
        top1 = vocab.ids[z.argmax(axis=-1)]
        hit = top1 == truth
        hits1 += int(hit.sum())
        hits5 += int((top5 == truth[:, None]).any(axis=1).sum())
        n += len(truth)
        for name, (lo, hi) in (("0-15", (0, 16)), ("16-63", (16, 64)), ("64+", (64, 1 << 30))):
            sel = (j >= lo) & (j < hi)
            buckets[name][0] += int(hit[sel].sum())
            buckets[name][1] += int(sel.sum())
    out = {
        "top1": hits1 / max(n, 1),
        "top5": hits5 / max(n, 1),
        "positions": n,
        "top1_by_position": {k: (h / m if m else None) for k, (h, m) in buckets.items()},
    }
    if second is not None:
        out["top1_second"] = second[0] / max(second[1], 1)
    return out
