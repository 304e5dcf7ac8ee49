"""Qwen2 (Qwen Team, arXiv 2407.10671): llama.py's block with biases on the q, k and v projections.

Read it next to llama.py. Qwen2 is built like a Llama (RMSNorm, rotary
embeddings, grouped-query attention, SwiGLU); what differs:

    Llama (SmolLM2)                        Qwen2
    q, k, v = x W_q, x W_k, x W_v          q, k, v = x W_q + b_q, x W_k + b_k, x W_v + b_v
                                           (the output projection and the MLP stay bias-free)
    rope theta 1e4 (SmolLM2: 1e5)          1e6
    RMSNorm eps 1e-5                       1e-6
    LM head tied (SmolLM2)                 tied in 0.5B and 1.5B; 7B and 72B ship an output matrix
    GGUF: llama.cpp permutes W_q's and     not permuted: llama.cpp rotates Qwen2's halves as
      W_k's rows (llama.rotate's NOTE)       Hugging Face does (its "NEOX" rotary type)

Qwen's first report (Bai et al., arXiv 2309.16609, section 2.2) gives the reason
for the biases: most layers drop theirs, the QKV projection keeps them to help the
model extrapolate to longer contexts. A bias is added before the rotation, so k's
bias is a learned offset that turns with the key's position.

Everything but the biases is a number the file gives (checkpoints/gguf.py reads
`qwen2.*` where a Llama's file says `llama.*`), so the math is llama.py's:
LlamaBlock.fuse stacks b_q | b_k | b_v like their matrices into attn_qkv's bias,
and the one fused product in llama.llama_block, `a @ block.attn_qkv`, adds
them. (The released configs' sliding-window attention is switched off,
use_sliding_window false, and llama.cpp does not implement it for Qwen2 either.)
"""

from __future__ import annotations

from .llama import Llama, LlamaHParams, LlamaWeights


class Qwen2(Llama):
    """A Qwen2 ready to run: llama.Llama's forward pass, over blocks whose attn_qkv has a bias [n_q + 2 n_kv]."""

    def __init__(self, hparams: LlamaHParams, weights: LlamaWeights, tokenizer=None, name: str = "qwen2"):
        assert all(block.attn_qkv.b is not None for block in weights.blocks), "Qwen2's q, k and v have biases"
        super().__init__(hparams, weights, tokenizer, name)

    def cast(self, convert) -> Qwen2:
        llama = super().cast(convert)  # convert keeps each Linear's bias
        return Qwen2(llama.hparams, llama.weights, llama.tokenizer, name=llama.name)
