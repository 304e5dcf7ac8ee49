"""bench --only block: both rules' expected tau from each round's rows, on tiny models (the numbers' plumbing)."""

import numpy as np

from specdec.bench.block import measure
from specdec.model.gpt2 import GPT2, HParams, random_weights
from specdec.sampling import SamplingParams

H = HParams(n_vocab=8, n_ctx=32, n_embd=16, n_head=2, n_layer=2)


def model(seed: int) -> GPT2:
    return GPT2(H, random_weights(H, seed=seed, scale=0.6), name=f"m{seed}")


def test_measure_gives_block_at_least_token_wise_and_equal_for_ngram():
    target, draft = model(10), model(20)
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 4, 5, 4]]
    r = measure(target, draft, prompts, 10, 4, SamplingParams(1.0), seed=0)
    assert r["rounds"] > 5 and r["min_round_gain"] >= -1e-5
    assert r["E_block"] > r["E_token"] > 1  # an unrelated stochastic draft: a strict gain
    assert 1 <= r["tau_token"] <= 5 and 1 <= r["tau_block"] <= 5
    ngram = measure(target, "ngram", prompts, 10, 4, SamplingParams(1.0), seed=0)
    assert ngram["rounds"] > 0 and np.isclose(ngram["E_block"], ngram["E_token"], atol=1e-6)  # point masses: no gain
