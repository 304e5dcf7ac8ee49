"""specdec: speculative decoding on GPT-2 and Llama (SmolLM2), in NumPy.

    import specdec
    target = specdec.load_model("355M")
    draft = specdec.load_model("124M")
    out = specdec.speculative_sample(target, draft, "Alan Turing theorized that computers", n_tokens=40, K=4)
    print(target.tokenizer.decode(out.tokens), out.alpha, out.tau)   # alpha: accepted / judged drafts; tau: tokens per round

Several prompts at once: specdec.speculative_sample_batch(target, draft, prompts, 40, K=4) returns one
DecodeResult per prompt (verification="block" judges each chain jointly, Sun et al. 2025).
No download needed for experiments: specdec.random_model("124M") has GPT-2 124M's shapes.

What is here: both model classes (GPT2, Llama) and the `CausalLM` protocol they share, `load_model`,
the samplers and their results, the drafters and the interfaces they implement, the K policies and the
cost model. Tooling lives in its own modules: the race that times both decoders and explains the result
(`from specdec.race import race, RaceReport`; what `python -m specdec` prints) and the benchmark
(`python -m specdec.bench`).
"""

# First, before anything here imports NumPy: how long OpenBLAS's idle threads spin (model/fast/spin.py).
from .model.fast import OPENBLAS_SPIN, set_kernels  # isort: skip (it must come first)

from .autoregressive import autoregressive_sample
from .batch import autoregressive_sample_batch, speculative_sample_batch
from .checkpoints.download import DownloadError
from .checkpoints.load import load_folder, load_model
from .checkpoints.safetensors import CheckpointError
from .costmodel import AdaptiveK, CostModelK, FixedK, best_k, expected_tokens_per_round, predicted_speedup
from .drafters import EarlyExitDrafter, LookupFirst, ModelDrafter, NgramDrafter, SuffixDrafter
from .drafters.stopping import ConfidenceStop
from .interfaces import Drafter, KPolicy, Proposal
from .model.base import CausalLM
from .model.attention import KVCache
from .model.gpt2 import GPT2, HParams, random_weights
from .model.llama import Llama, LlamaHParams
from .model.shapes import GPT2_SHAPES, random_model
from .model.tokenizer import load_tokenizer
from .result import DecodeResult
from .sampling import SamplingParams, draw, greedy, probabilities
from .speculative import speculative_sample
from .timing import Costs, measure_costs

__version__ = "0.2.0"

__all__ = [
    # decoding
    "autoregressive_sample",
    "speculative_sample",
    "autoregressive_sample_batch",
    "speculative_sample_batch",
    "DecodeResult",
    "SamplingParams",
    "probabilities",
    "draw",
    "greedy",
    # drafters and K policies
    "Drafter",
    "Proposal",
    "ModelDrafter",
    "NgramDrafter",
    "EarlyExitDrafter",
    "LookupFirst",
    "SuffixDrafter",
    "ConfidenceStop",
    "KPolicy",
    "FixedK",
    "AdaptiveK",
    "CostModelK",
    # timing and the cost model
    "measure_costs",
    "Costs",
    "expected_tokens_per_round",
    "predicted_speedup",
    "best_k",
    # models
    "CausalLM",
    "GPT2",
    "HParams",
    "Llama",
    "LlamaHParams",
    "KVCache",
    "GPT2_SHAPES",
    "random_model",
    "random_weights",
    "load_model",
    "load_folder",
    "load_tokenizer",
    "CheckpointError",
    "DownloadError",
    # the machine
    "OPENBLAS_SPIN",
    "set_kernels",
]


# The race is tooling (specdec/race.py): `specdec.race(...)` and `specdec.RaceReport` still work, with a
# DeprecationWarning, for code written when they were exported here.
_MOVED_TO_RACE = ("race", "RaceReport")


def __getattr__(name: str):
    """PEP 562: called only for a name this module does not have."""
    if name not in _MOVED_TO_RACE:
        raise AttributeError(f"module 'specdec' has no attribute {name!r}")
    import importlib
    import warnings

    module = importlib.import_module(".race", __name__)
    warnings.warn(
        f"specdec.{name} moved to its own module: from specdec.race import {name}", DeprecationWarning, stacklevel=2
    )
    # NOTE: importing the submodule bound specdec.race to the module; the function takes the name back, as
    # `from .race import race` here used to, so that later calls of specdec.race(...) work too.
    globals().update({moved: getattr(module, moved) for moved in _MOVED_TO_RACE})
    return globals()[name]
