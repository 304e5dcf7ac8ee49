"""GPT-2's released shapes, and models of any shape with random weights (no download).

For experiments and timings that need no trained weights: the cost of a forward
pass depends only on the shapes, so `random_model("355M")` times like GPT-2 355M.
"""

from __future__ import annotations

from .gpt2 import GPT2, HParams, random_weights

# config.json of openai-community/gpt2, -medium, -large, -xl.
GPT2_SHAPES = {
    "124M": HParams(n_vocab=50257, n_ctx=1024, n_embd=768, n_head=12, n_layer=12),
    "355M": HParams(n_vocab=50257, n_ctx=1024, n_embd=1024, n_head=16, n_layer=24),
    "774M": HParams(n_vocab=50257, n_ctx=1024, n_embd=1280, n_head=20, n_layer=36),
    "1558M": HParams(n_vocab=50257, n_ctx=1024, n_embd=1600, n_head=25, n_layer=48),
}


def random_model(shape: str | HParams | None = None, seed: int = 0, scale: float = 0.02, **hparams) -> GPT2:
    """A GPT2 with random weights: a released shape by name, an HParams, or keyword hyperparameters.

        random_model("124M")                                           # GPT-2 124M's shapes, 0.5 GB
        random_model(n_layer=2, n_embd=64, n_head=4, n_vocab=100, n_ctx=128, scale=0.3)   # a toy

    A larger `scale` gives peakier distributions (more interesting toys). Keyword
    hyperparameters override the named shape's, e.g. random_model("124M", n_layer=2).
    """
    if isinstance(shape, str):
        if shape not in GPT2_SHAPES:
            raise ValueError(f"unknown shape {shape!r}: use one of {', '.join(GPT2_SHAPES)}, an HParams, or keywords")
        shape = GPT2_SHAPES[shape]
    if shape is None and not hparams:
        raise ValueError("random_model needs a shape: a name such as '124M', an HParams, or n_layer=..., n_embd=...")
    h = HParams(**{**(vars(shape) if shape is not None else {}), **hparams})
    return GPT2(h, random_weights(h, seed=seed, scale=scale), name=f"random-{h.n_layer}x{h.n_embd}")
