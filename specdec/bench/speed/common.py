"""The speed sections' shared tools: the shapes they time, statistics, tables, a filled KV cache, the run's state."""

from __future__ import annotations

import argparse
import time
from typing import Callable

import numpy as np

from ...checkpoints.settings import default_models_dir
from ...model.fast import tuning
from ...model.base import CausalLM
from ...model.attention import KVCache
from ...model.gpt2 import F32, GPT2, HParams, random_weights
from ...model.gpt2 import step_weights as gpt2_step_weights
from ...model.shapes import GPT2_SHAPES
from ...timing import time_calls
from ..progress import Progress

SIZES = GPT2_SHAPES  # 124M, 355M, 774M, 1558M
# Tiny shapes for the smoke test (--quick): not offered in --help.
TEST_SIZES = {
    "tiny": HParams(n_vocab=512, n_ctx=1024, n_embd=64, n_head=4, n_layer=4),
    "tiny2": HParams(n_vocab=512, n_ctx=1024, n_embd=128, n_head=4, n_layer=8),
}
ALL_SIZES = {**SIZES, **TEST_SIZES}

VERIFY_CTX = 256  # context of the verification-cost curve and of predict's step times
VERIFY_M = range(1, 17)  # m = K + 1 new tokens, for K = 0..15 (trees want 4-16 nodes)
TOKEN = 464  # the token fed at every timed step (any id works: cost does not depend on it)


# ---------------------------------------------------------------------------
# Small tools: statistics, tables, models.
# ---------------------------------------------------------------------------


def stats_ms(seconds) -> dict:
    """Median, quartiles and range of a list of durations, in milliseconds."""
    a = np.asarray(list(seconds), dtype=np.float64) * 1e3
    q1, med, q3 = np.percentile(a, [25, 50, 75])
    return {
        "median_ms": float(med),
        "q1_ms": float(q1),
        "q3_ms": float(q3),
        "min_ms": float(a.min()),
        "max_ms": float(a.max()),
        "n": int(a.size),
    }


def table(out, title: str, explanation: str, headers: list[str], rows: list[list]) -> None:
    """Print an aligned table: a title, a one-line explanation, a header row, the rows."""
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    print(f"\n== {title}\n   {explanation}", file=out)
    for row in [headers, *cells]:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)), file=out)
    out.flush()


def cell(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        if value != value:  # nan
            return "-"
        return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def filled_cache(model: CausalLM, n_past: int, rng: np.random.Generator) -> KVCache:
    """A KV cache holding n_past positions of random keys and values.

    NOTE: not a real forward over n_past tokens. Attention's cost depends only on
    cache.length, so random K/V plus `cache.length = n_past` times the same.
    """
    h = model.hparams
    cache = model.new_cache()
    cache.reserve(min(h.n_ctx, n_past + max(VERIFY_M)))  # room for the timed passes: no growth while timing
    shape = (h.n_layer, h.n_kv_head, n_past, h.d_head)
    cache.k[:, :, :n_past] = rng.standard_normal(shape, dtype=F32)  # [n_layer, n_kv_head, n_past, d_head]
    cache.v[:, :, :n_past] = rng.standard_normal(shape, dtype=F32)
    cache.length = n_past
    return cache


def step_bytes(h: HParams) -> int:
    """Bytes of float32 weights one 1-token step of a GPT-2 with these hyperparameters reads (GPT2.step_weights)."""
    return 4 * gpt2_step_weights(h)


class Bench:
    """One benchmark run: its settings, the models built so far, and every result."""

    def __init__(self, args: argparse.Namespace, out):
        self.args, self.out, self.rng = args, out, np.random.default_rng(args.seed)
        self.progress = Progress("speed", args.quiet)  # what it is doing, on stderr
        self.models: dict[str, GPT2] = {}
        self.results: dict = {}  # section -> measurements (the --json object)

    def model(self, size: str) -> GPT2:
        if size not in self.models:
            start = time.perf_counter()
            self.models[size] = GPT2(ALL_SIZES[size], random_weights(ALL_SIZES[size]), name=size)
            tuning.tune(self.models[size], default_models_dir())  # the product paths load_model would give it
            self.say(
                f"(built {size}-shaped random weights and their product paths in {time.perf_counter() - start:.1f} s)"
            )
        return self.models[size]

    def smallest_with_prompt(self) -> tuple[str, GPT2, list[int]]:
        """(the first --sizes entry, its model, an 8-token random prompt for it): what the decoding sections run."""
        size = self.args.sizes[0]
        model = self.model(size)
        return size, model, [int(t) for t in self.rng.integers(0, model.n_vocab, 8)]

    def say(self, line: str) -> None:
        print(line, file=self.out)
        self.out.flush()

    def time(self, calls: dict, repeats: int | None = None, after: Callable | None = None) -> dict:
        return time_calls(calls, repeats or self.args.repeats, self.rng, after)
