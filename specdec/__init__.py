"""specdec: speculative decoding on GPT-2, in NumPy.

import specdec
target = specdec.load_model("355M")
draft = specdec.load_model("124M")
ids = target.tokenizer.encode("Alan Turing theorized that computers")
out = specdec.speculative_sample(target, draft, ids, n_tokens=40, K=4)
print(target.tokenizer.decode(out.tokens), out.acceptance_rate)
"""

from .autoregressive import autoregressive_sample
from .costmodel import AdaptiveK, CostModelK, FixedK
from .checkpoint import CheckpointError, DownloadError, load_folder, load_model
from .drafters import EarlyExitDrafter, ModelDrafter, NgramDrafter
from .interfaces import Drafter, KPolicy, Proposal
from .result import DecodeResult
from .gpt2 import GPT2, HParams, KVCache, random_weights
from .sampling import SamplingParams
from .speculative import speculative_sample
from .tokenizer import load_tokenizer

__all__ = [
    "autoregressive_sample",
    "speculative_sample",
    "DecodeResult",
    "SamplingParams",
    "AdaptiveK",
    "CostModelK",
    "FixedK",
    "Drafter",
    "KPolicy",
    "Proposal",
    "ModelDrafter",
    "NgramDrafter",
    "EarlyExitDrafter",
    "GPT2",
    "HParams",
    "KVCache",
    "CheckpointError",
    "DownloadError",
    "load_folder",
    "load_model",
    "load_tokenizer",
    "random_weights",
]
