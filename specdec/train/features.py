"""The target's hidden states for distillation data, recomputed instead of stored.

A head reads the target's hidden states: EAGLE the last layer's (after the final
norm, what the LM head reads), EAGLE-3 (Li et al., arXiv 2503.01840, section 3)
a low, a middle and a high layer's, fused. Storing them costs n_embd values per
token per layer (SmolLM2-135M: 576 x 2 bytes = 1.2 kB in float16, 230 MB per
layer for 200,000 tokens); recomputing them is one teacher-forced pass over
prompt + reply, every token of a row in one matrix product per layer, many
times cheaper per token than the decoding that wrote the reply. So the shards
(shards.py) keep tokens and top-k labels, and this file gives the features.

Layer numbering as Hugging Face's `output_hidden_states`: state 0 is the token
embeddings (plus GPT-2's position embeddings), state l the residual stream after
l blocks, and state n_layer the last block's output AFTER the final norm.
"""

from __future__ import annotations

import numpy as np

from ..model import gpt2, llama
from ..model.base import pack

F32 = np.float32


def eagle3_layers(n_layer: int) -> list[int]:
    """EAGLE-3's low, middle and high layers (its reference code reads states 2, n/2 and n-3), then the final one."""
    return [2, n_layer // 2, n_layer - 3, n_layer]


def layer_states(model, rows: list, layers: list[int]) -> list[np.ndarray]:
    """Hidden states of `layers` at every position of each row: one [len(layers), n_seq_b, n_embd] per row.

    rows: token id sequences (a prompt followed by its reply), run teacher-forced
    as one ragged batch (fresh caches; the rows attend only to themselves).
    """
    h = model.hparams
    if any(not 0 <= layer <= h.n_layer for layer in layers) or not layers:
        raise ValueError(f"layers must be in 0..{h.n_layer} (0: embeddings, {h.n_layer}: after the final norm)")
    caches = [model.new_cache(len(row)) for row in rows]
    flat, positions, packed = pack(h, [np.asarray(r) for r in rows], caches, None)
    w = model.weights
    if isinstance(model, llama.Llama):
        cos, sin = llama.rope_tables(positions, h.d_head, h.rope_theta, model.dtype)
        x = w.wte[flat]  # [n_tok, n_embd]

        def block(x, layer):
            return llama.llama_block(x, w.blocks[layer], h, packed, layer, cos, sin)

        def norm(x):
            return llama.rms_norm(x, w.norm_f, h.rms_eps)
    elif isinstance(model, gpt2.GPT2):
        x = w.wte[flat] + w.wpe[positions]  # [n_tok, n_embd]

        def block(x, layer):
            return gpt2.packed_block(x, w.blocks[layer], h, packed, layer)

        def norm(x):
            return gpt2.layer_norm(x, w.ln_f_weight, w.ln_f_bias, h.layer_norm_epsilon)
    else:
        raise ValueError(f"hidden states are computed for GPT-2 and Llama models, not {type(model).__name__}")
    states = {0: x}
    for layer in range(max(layers)):
        x = block(x, layer)  # [n_tok, n_embd]
        states[layer + 1] = norm(x) if layer + 1 == h.n_layer else x
    stacked = np.stack([states[layer] for layer in layers])  # [len(layers), n_tok, n_embd]
    return [stacked[:, row.start : row.stop] for row in packed]


def hidden_states(model, data, layers: list[int], rows: range | list[int] | None = None, batch: int = 8):
    """layer_states for rows of a DistillData (load_distill_data), `batch` rows per pass.

    Yields (row index, [len(layers), n_prompt + n_reply - 1, n_embd] float32): the
    states at every position but the reply's last token, so that position t's state
    is the one that predicted token t + 1 (reply position j sits at n_prompt - 1 + j).
    """
    rows = range(len(data.replies)) if rows is None else rows
    rows = list(rows)
    for start in range(0, len(rows), batch):
        chunk = rows[start : start + batch]
        texts = [np.concatenate([data.prompts[r], data.replies[r][:-1]]) for r in chunk]
        for r, states in zip(chunk, layer_states(model, texts, layers)):
            yield r, states
