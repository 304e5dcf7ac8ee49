"""The cost model (Leviathan et al., section 3) and the K policies built on it."""

import math

import numpy as np
import pytest
from conftest import tiny_model

from specdec import AdaptiveK, speculative_sample
from specdec.costmodel import (
    OTHER_DRAFT_COST,
    CostModelK,
    best_k,
    draft_step_cost,
    expected_tokens_per_round,
    predicted_speedup,
    speedup_from_rounds,
    make_tree_policy,
    verify_cost,
)
from specdec.drafters import EarlyExitDrafter, ModelDrafter
from specdec.drafters.restricted import restrict
from specdec.model.llama import LlamaHParams, random_llama


def test_expected_tokens_per_round():
    assert expected_tokens_per_round(0.0, 4) == 1.0  # nothing accepted: the target's own token
    assert expected_tokens_per_round(1.0, 4) == 5.0  # everything accepted: K drafts + the bonus
    # 1 + a + a^2 + ... + a^K, summed by hand
    assert expected_tokens_per_round(0.7, 3) == pytest.approx(1 + 0.7 + 0.49 + 0.343)


def test_expected_tokens_match_simulated_rounds():
    """Rounds with i.i.d. acceptance: the closed form is the simulated mean."""
    rng = np.random.default_rng(0)
    alpha, k = 0.75, 5
    accepted = rng.random((200_000, k)) < alpha
    n_accepted = np.where(accepted.all(axis=1), k, accepted.argmin(axis=1))
    assert np.mean(n_accepted + 1) == pytest.approx(expected_tokens_per_round(alpha, k), rel=0.01)


def test_speedup_reduces_to_the_papers_formula_when_verifying_costs_one_step():
    # Leviathan et al., section 3 (walltime improvement): (1 - a^(g+1)) / ((1 - a)(g c + 1))
    for alpha, gamma, c in [(0.8, 4, 0.05), (0.6, 2, 0.3), (0.9, 7, 0.1)]:
        paper = (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + 1))
        assert predicted_speedup(alpha, gamma, c) == pytest.approx(paper)


def test_a_measured_verification_curve_lowers_the_prediction():
    r = [1.0, 1.5, 1.8, 2.0, 2.2, 2.5, 2.7, 3.0, 3.2]
    assert verify_cost(5, r) == 2.2 and verify_cost(1, r) == 1.0
    assert verify_cost(18, r) == pytest.approx(6.4)  # linear beyond the measured range
    assert predicted_speedup(0.8, 4, 0.1, r) == pytest.approx(predicted_speedup(0.8, 4, 0.1) * 1.4 / (0.4 + 2.2))


def test_best_k():
    k, s = best_k(0.9, 0.05)  # cheap draft, high acceptance, GPU-like verification: long drafts
    assert k >= 6 and s > 3
    k, s = best_k(0.9, 0.4, r=[1.0] + [3.0] * 9)  # a CPU where verifying costs 3 steps: nothing wins
    assert (k, s) == (0, 1.0)
    assert best_k(0.5, 0.01)[0] < best_k(0.95, 0.01)[0]  # more acceptance, longer drafts


@pytest.mark.parametrize("alpha", [1.5, -0.1, 4.0])
def test_an_alpha_that_is_not_a_probability_is_refused(alpha):
    """best_k(alpha=1.5) used to answer (8, 6.43x): an acceptance rate above 1 priced as if every draft passed."""
    for formula in (lambda: best_k(alpha, 0.05), lambda: predicted_speedup(alpha, 4, 0.05)):
        with pytest.raises(ValueError, match=r"alpha is an acceptance rate, a probability in \[0, 1\]"):
            formula()
    assert best_k(1.0, 0.05)[0] == 8 and math.isnan(predicted_speedup(math.nan, 4, 0.05))  # the edges still answer


def test_cost_model_k_policy_tracks_acceptance():
    policy = CostModelK(c=0.05, r=None, k_max=8, prior_alpha=0.5, prior_weight=4)
    k_start = policy.next_k()
    for _ in range(30):
        policy.update(policy.next_k(), policy.next_k())  # every draft accepted
    assert policy.alpha > 0.9 and policy.next_k() > k_start
    for _ in range(60):
        policy.update(policy.next_k(), 0)  # every first draft rejected
    assert policy.alpha < 0.5 and policy.next_k() >= 1


def test_adaptive_k_grows_and_shrinks():
    target = tiny_model(seed=1)
    policy = AdaptiveK(k_start=2, k_min=1, k_max=6)
    out = speculative_sample(target, target, [1, 2], 40, K=policy)
    assert out.k_per_round[:4] == [2, 3, 4, 5]  # all accepted: grows each round
    p = AdaptiveK(k_start=3, k_min=2, k_max=4)
    p.update(3, 3)
    assert p.next_k() == 4  # all accepted: grow
    p.update(4, 4)
    assert p.next_k() == 4  # capped at k_max
    p.update(4, 1)
    p.update(3, 0)
    p.update(2, 1)
    assert p.next_k() == 2  # rejections shrink, down to k_min
    rejecting = speculative_sample(target, tiny_model(seed=42), [1, 2], 30, K=AdaptiveK(4, 1, 8))
    assert rejecting.k_per_round[:5] == [4, 3, 2, 1, 1]  # an unrelated draft drives K to its minimum


def test_speedup_from_rounds_prices_the_rounds_a_run_had():
    r = [1.0, 1.2, 1.3, 1.4, 1.5]
    # two rounds of 4 drafts (a pass over 5 tokens each) and one with none (a plain step), 8 draft steps
    assert speedup_from_rounds(10, [4, 4, 0], 8, 0.1, r) == pytest.approx(10 / (8 * 0.1 + 1.5 + 1.5 + 1.0))
    # rounds that all draft k and emit eq. 1's expected tokens give eq. 1's speedup
    alpha, k, c, n_rounds = 0.7, 4, 0.2, 50
    n_tokens = n_rounds * expected_tokens_per_round(alpha, k)
    assert speedup_from_rounds(n_tokens, [k] * n_rounds, k * n_rounds, c, r) == pytest.approx(
        predicted_speedup(alpha, k, c, r)
    )


# --- batches ---------------------------------------------------------------------------------


def test_best_k_per_batch_size_by_hand():
    from specdec.costmodel import batch_break_even, best_k_batch

    # B = 1: r(m) = 1 + 0.2 (m - 1), c = 0. alpha = 0.8: E[k=4] = (1 - 0.8^5) / 0.2 = 3.3616, cost r(5) = 1.8,
    # speedup 1.8676; k = 5: 3.6893 / 2.0 = 1.8446; k = 3: 2.952 / 1.6 = 1.845. So k = 4.
    # B = 16: r(m) = m (compute-bound): E[k] / (k + 1) < 1 for every k -> no speculation.
    # B = 4: r(m) = 1 + 0.6 (m - 1): k = 1: 1.8 / 1.6 = 1.125; k = 2: 2.44 / 2.2 = 1.109. So k = 1.
    costs = {1: (0.0, lambda m: 1 + 0.2 * (m - 1)), 4: (0.0, lambda m: 1 + 0.6 * (m - 1)), 16: (0.0, lambda m: m)}
    best = best_k_batch(0.8, costs)
    assert best[1][0] == 4 and abs(best[1][1] - 3.3616 / 1.8) < 1e-9
    assert best[4][0] == 1 and abs(best[4][1] - 1.8 / 1.6) < 1e-9
    assert best[16] == (0, 1.0)
    assert batch_break_even(best) == 16
    assert batch_break_even({1: (4, 1.9)}) is None
    # A draft step that costs c_B: k = 1 at B = 4 with c = 0.1 -> 1.8 / (0.1 + 1.6) = 1.0588.
    assert abs(best_k_batch(0.8, {4: (0.1, costs[4][1])})[4][1] - 1.8 / 1.7) < 1e-9


def test_speedup_from_batch_rounds_by_hand():
    from specdec.costmodel import BatchPassTimes, speedup_from_batch_rounds

    # T_2 = 10 ms, r_2 = [1, 1.5, 2, 2.5, 3], c_2 = 0.5; T_4 = 12 ms, r_4 = [1, 2, 3, 4, 5], c_4 = 0.25.
    times = BatchPassTimes(
        step={2: 0.010, 4: 0.012}, r={2: [1, 1.5, 2, 2.5, 3], 4: [1, 2, 3, 4, 5]}, c={2: 0.5, 4: 0.25}
    )
    # Rounds: 4 rows, k = 4 each, 4 draft passes: 4 * 0.25 * 12 + 5 * 12 = 72 ms; then 3 rows (priced as 4),
    # k = 2 each, 2 passes: 2 * 3 + 3 * 12 = 42 ms; then 1 row (priced as 2), k = 1, 1 pass: 5 + 15 = 20 ms.
    # Autoregressive: 10 steps of 4 rows (120 ms) and 2 of 1 row (20 ms): 140 ms. 140 / 134.
    rounds = [(4, [4, 4, 4, 4], 4), (3, [2, 2, 2], 2), (1, [1], 1)]
    assert abs(speedup_from_batch_rounds(rounds, [4] * 10 + [1] * 2, times) - 140 / 134) < 1e-9
    # A ragged round: 2 rows drafting 4 and 1 (7 tokens, 3.5 per row): r_2(3.5) = 2.25 -> 22.5 ms, + 4 * 5 ms.
    assert abs(times.pass_seconds(2, 3.5) - 0.0225) < 1e-12
    assert abs(speedup_from_batch_rounds([(2, [4, 1], 4)], [2] * 4, times) - 40 / 42.5) < 1e-9
    assert times.size(5) == 4  # beyond the largest measured size: the largest


def test_batch_rounds_are_priced_by_their_tokens_on_the_measured_pass_curve():
    from specdec.costmodel import BatchPassTimes, speedup_from_batch_rounds

    # A pass curve over n_tok with a jump between 16 and 17 tokens (the kernel switch): 16 -> 40 ms, 17 -> 30 ms.
    curve = ([4, 8, 16, 17, 20], [0.010, 0.020, 0.040, 0.030, 0.033])
    times = BatchPassTimes(step={4: 0.010}, r={4: [1, 2, 3, 4, 5]}, c={4: 0.0}, tokens={4: curve})
    assert abs(times.pass_seconds(4, 3.0) - 0.030) < 1e-12  # 12 tokens: halfway from 8 to 16
    assert abs(times.pass_seconds(4, 4.5) - 0.031) < 1e-12  # 18 tokens: on the far side of the jump
    assert abs(times.pass_seconds(4, 10.0) - 0.033 * 2) < 1e-12  # 40 tokens: beyond the grid, linearly
    assert abs(times.pass_seconds(2, 2.0) - 0.010) < 1e-12  # 2 rows left, 4 tokens: the same curve
    # The r-list alone would price 18 tokens at r_4(4.5) = 4.5 steps (45 ms); the curve says 31 ms.
    assert abs(BatchPassTimes({4: 0.010}, {4: [1, 2, 3, 4, 5]}, {4: 0.0}).pass_seconds(4, 4.5) - 0.045) < 1e-12
    # 10 autoregressive 4-row steps (100 ms) against two rounds of 18 and 12 tokens (31 + 30 ms).
    assert (
        abs(speedup_from_batch_rounds([(4, [4, 4, 4, 2], 4), (4, [2, 2, 2, 2], 2)], [4] * 10, times) - 0.100 / 0.061)
        < 1e-9
    )


# c under tree="auto" comes from the drafter's own model: the weights one of its steps reads over the target's.
# A SmolLM2-shaped Llama (grouped-query attention, SwiGLU 2.67x wide, a head as large as several blocks), tiny.
SMOLLM2_SHAPED = dict(n_vocab=512, n_ctx=64, n_embd=48, n_head=3, n_kv_head=1, n_layer=6, n_ff=128)


def llama_step_weights(h, n_layer: int, head_rows: int) -> int:
    """Written out here, independently of the library: q and output n_embd^2, k and v n_embd * n_kv_head * d_head,
    gate, up and down n_embd * n_ff, per block; the LM head head_rows * n_embd."""
    d_head = h["n_embd"] // h["n_head"]
    block = 2 * h["n_embd"] ** 2 + 2 * h["n_embd"] * h["n_kv_head"] * d_head + 3 * h["n_embd"] * h["n_ff"]
    return n_layer * block + head_rows * h["n_embd"]


def test_a_llama_early_exit_is_priced_by_the_weights_it_reads():

    target = random_llama(LlamaHParams(**SMOLLM2_SHAPED))
    drafter = EarlyExitDrafter(target, n_layer=2)
    want = llama_step_weights(SMOLLM2_SHAPED, 2, 512) / llama_step_weights(SMOLLM2_SHAPED, 6, 512)
    assert draft_step_cost(drafter, target) == pytest.approx(want, rel=1e-12)
    assert make_tree_policy("auto", drafter, target).c == pytest.approx(want, rel=1e-12)
    assert abs(want - OTHER_DRAFT_COST) > 0.2  # 0.52 here: a flat guess would be far off


def test_a_restricted_llama_draft_is_priced_by_the_head_rows_it_scores():

    target = random_llama(LlamaHParams(**SMOLLM2_SHAPED))
    small = random_llama(LlamaHParams(**{**SMOLLM2_SHAPED, "n_layer": 1}), seed=1)
    full, cut = ModelDrafter(small), ModelDrafter(restrict(small, 64))
    whole = llama_step_weights(SMOLLM2_SHAPED, 6, 512)
    assert draft_step_cost(full, target) == pytest.approx(llama_step_weights(SMOLLM2_SHAPED, 1, 512) / whole)
    assert draft_step_cost(cut, target) == pytest.approx(llama_step_weights(SMOLLM2_SHAPED, 1, 64) / whole)


def test_a_gpt2_early_exit_is_priced_by_its_blocks_and_head():
    model = tiny_model()
    h = model.hparams
    block = 12 * h.n_embd**2 + 13 * h.n_embd  # four matrices, their biases, two LayerNorms
    want = (1 * block + h.n_vocab * h.n_embd) / (h.n_layer * block + h.n_vocab * h.n_embd)
    assert draft_step_cost(EarlyExitDrafter(model, n_layer=1), model) == pytest.approx(want, rel=1e-12)
