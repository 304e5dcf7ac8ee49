"""The samplers: greedy equivalence, exact output distributions, cache state, edge cases.

The distribution tests enumerate the exact target probability of every 3-token
continuation of a tiny 6-token-vocabulary model, draw many samples, and apply a
chi-square test. Each test also runs a deliberately broken sampler through the
same check and asserts that it fails, so the check is shown to have teeth.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import specdec.verify as verify
from specdec import AdaptiveK, Proposal, autoregressive_sample, speculative_sample
from specdec.drafters import EarlyExitDrafter, ModelDrafter, NgramDrafter
from specdec.gpt2 import GPT2, Block, HParams, Linear, Weights, random_weights
from specdec.sampling import SamplingParams, draw, probabilities

from conftest import tiny_model

# --- models ---------------------------------------------------------------------

SMALL = HParams(n_vocab=6, n_ctx=16, n_embd=16, n_head=2, n_layer=1)
PROMPT = [1, 2]
N_SAMPLES_MAIN = 25_000  # the headline exactness test
N_SAMPLES = 8_000  # each further correct-sampler check
N_BROKEN = 2_000  # enough: every broken variant lands at 3-30x the threshold


def perturbed(model: GPT2, noise: float, seed: int) -> GPT2:
    """A draft that resembles the target: its weights plus Gaussian noise."""
    rng = np.random.default_rng(seed)
    w = model.weights

    def noisy(a):
        return a + np.float32(noise) * rng.standard_normal(a.shape, dtype=np.float32)

    blocks = []
    for b in w.blocks:
        fields = {
            name: Linear(noisy(v.w_t), noisy(v.b)) if isinstance(v, Linear) else noisy(v) for name, v in vars(b).items()
        }
        blocks.append(Block(**fields))
    weights = Weights(noisy(w.wte), w.wpe, blocks, w.ln_f_weight, w.ln_f_bias)
    return GPT2(model.hparams, weights, name=f"{model.name}+noise")


@pytest.fixture(scope="module")
def small_target():
    return GPT2(SMALL, random_weights(SMALL, seed=10, scale=0.6), name="small-target")


@pytest.fixture(scope="module")
def small_draft(small_target):
    return perturbed(small_target, 0.15, seed=1)


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=1)


# --- the exact distribution and the check -----------------------------------------------


def exact_continuations(model: GPT2, prompt, n: int, params: SamplingParams) -> dict[tuple, float]:
    """P(continuation) for every n-token continuation, by the chain rule."""
    out = {}
    for seq in itertools.product(range(model.n_vocab), repeat=n):
        logits = model(list(prompt) + list(seq[:-1]))[len(prompt) - 1 :]  # [n, n_vocab]
        p = probabilities(logits, params)
        out[seq] = float(np.prod([p[i, t] for i, t in enumerate(seq)], dtype=np.float64))
    return out


def chi_square_passes(samples: list[tuple], exact: dict[tuple, float]) -> tuple[bool, float, float]:
    """Pearson chi-square of sample counts against exact probabilities.

    Cells expected to hold fewer than 5 samples are pooled into one, as usual.
    The threshold, df + 6 sqrt(2 df), lies about 6 standard deviations above the
    statistic's mean under the null: a correct sampler essentially never
    exceeds it, while a biased one at this sample size is far beyond it.
    """
    n = len(samples)
    counts: dict[tuple, int] = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    assert set(counts) <= {s for s, p in exact.items() if p > 0}, "sampled a continuation of probability 0"
    big = [s for s, p in exact.items() if p * n >= 5]
    observed = [counts.get(s, 0) for s in big] + [n - sum(counts.get(s, 0) for s in big)]
    expected = [exact[s] * n for s in big] + [n * (1 - sum(exact[s] for s in big))]
    obs, exp = np.array(observed, float), np.array(expected, float)
    keep = exp > 0
    stat = float((((obs - exp) ** 2)[keep] / exp[keep]).sum())
    df = int(keep.sum()) - 1
    return stat <= df + 6 * np.sqrt(2 * df), stat, df


def sample_many(sampler, n_samples=N_SAMPLES, seed=0) -> list[tuple]:
    rng = np.random.default_rng(seed)
    return [tuple(sampler(rng).tokens) for _ in range(n_samples)]


# --- deliberately broken verification steps ------------------------------------------------


def verify_accept_on_argmax(drafts, q, p, rng):
    """BROKEN: accept a draft iff it is the target's most likely token."""
    for i, x in enumerate(drafts):
        if x != int(np.argmax(p[i])):
            return i, draw(p[i], rng)
    return len(drafts), draw(p[len(drafts)], rng)


def verify_unnormalised_residual(drafts, q, p, rng):
    """BROKEN: samples the residual max(0, p - q) as if it already summed to 1."""
    for i, x in enumerate(drafts):
        if rng.random() * q[i, x] < p[i, x]:
            continue
        residual = np.maximum(p[i] - q[i], 0)
        u = rng.random()  # uniform on [0, 1) against a cdf that ends below 1
        return i, min(int(np.searchsorted(np.cumsum(residual), u, side="right")), len(residual) - 1)
    return len(drafts), draw(p[len(drafts)], rng)


def verify_resample_target_on_reject(drafts, q, p, rng):
    """BROKEN: on rejection draws from p instead of the residual (over-weights p's mode)."""
    for i, x in enumerate(drafts):
        if rng.random() * q[i, x] < p[i, x]:
            continue
        return i, draw(p[i], rng)
    return len(drafts), draw(p[len(drafts)], rng)


# --- distribution tests ------------------------------------------------------------


@pytest.fixture(scope="module")
def exact_t1(small_target):
    return exact_continuations(small_target, PROMPT, 3, SamplingParams(1.0))


def test_autoregressive_sampling_matches_the_exact_distribution(small_target, exact_t1):
    samples = sample_many(lambda rng: autoregressive_sample(small_target, PROMPT, 3, temperature=1.0, rng=rng))
    ok, stat, df = chi_square_passes(samples, exact_t1)
    assert ok, f"chi2={stat:.1f} df={df}"


def test_speculative_sampling_matches_the_target_distribution(small_target, small_draft, exact_t1, monkeypatch):
    def run(rng):
        return speculative_sample(small_target, small_draft, PROMPT, 3, K=2, temperature=1.0, rng=rng)

    samples = sample_many(run, n_samples=N_SAMPLES_MAIN)
    ok, stat, df = chi_square_passes(samples, exact_t1)
    assert ok, f"correct sampler failed: chi2={stat:.1f} df={df}"

    # The same check must reject broken variants of the verification step.
    for broken in (verify_accept_on_argmax, verify_unnormalised_residual, verify_resample_target_on_reject):
        monkeypatch.setattr(verify, "sampled_chain", broken)
        ok, stat, df = chi_square_passes(sample_many(run, n_samples=N_BROKEN), exact_t1)
        assert not ok, f"{broken.__name__} passed the check (chi2={stat:.1f}, df={df})"


def test_acceptance_rate_matches_theory(small_target, small_draft):
    """P(accept the first draft) = sum_x min(p(x), q(x)) (Leviathan et al., section 3, "Calculating alpha")."""
    params = SamplingParams(1.0)
    p = probabilities(small_target(PROMPT)[-1:], params)[0]
    q = probabilities(small_draft(PROMPT)[-1:], params)[0]
    alpha = float(np.minimum(p, q).sum())
    assert 0.2 < alpha < 0.95, "the test models should disagree sometimes and agree sometimes"

    rng = np.random.default_rng(5)
    first_kinds = []
    for _ in range(N_SAMPLES):
        kinds = []
        speculative_sample(small_target, small_draft, PROMPT, 2, K=1, temperature=1.0, rng=rng,
                           on_token=lambda t, kind: kinds.append(kind))  # fmt: skip
        first_kinds.append(kinds[0] == "draft")
    measured = np.mean(first_kinds)
    stderr = np.sqrt(alpha * (1 - alpha) / N_SAMPLES)
    assert abs(measured - alpha) < 4.5 * stderr, f"measured {measured:.4f}, theory {alpha:.4f}"


@pytest.mark.parametrize(
    "params",
    # A high temperature leaves real mass outside the filter, so filtering
    # mistakes have visible effects.
    [SamplingParams(1.5, top_k=3), SamplingParams(1.5, top_p=0.7), SamplingParams(1.5, top_k=4, top_p=0.8)],
    ids=["top_k", "top_p", "top_k+top_p"],
)
def test_filtered_sampling_matches_the_filtered_target(small_target, small_draft, params, monkeypatch):
    exact = exact_continuations(small_target, PROMPT, 3, params)
    assert sum(p == 0 for p in exact.values()) > 0, "the filter should remove something"

    def run(rng):
        return speculative_sample(small_target, small_draft, PROMPT, 3, K=2, temperature=params.temperature,
                                  top_k=params.top_k, top_p=params.top_p, rng=rng)  # fmt: skip

    ok, stat, df = chi_square_passes(sample_many(run, seed=1), exact)
    assert ok, f"chi2={stat:.1f} df={df}"

    # BROKEN: the draft token is drawn from the filtered q, but the acceptance
    # test reads the unfiltered q (the "filtered on one side only" bug class).
    class OneSideFiltered(ModelDrafter):
        def propose(self, ids, k, params, rng, nodes=None):
            tokens = super().propose(ids, k, params, rng).tokens
            logits = self.model(list(ids) + tokens[:-1])[len(ids) - 1 :]  # [k, n_vocab]
            return Proposal.chain(tokens, probabilities(logits, SamplingParams(params.temperature)))

    def run_broken(rng):
        return speculative_sample(small_target, OneSideFiltered(small_draft), PROMPT, 3, K=2,
                                  temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                                  rng=rng)  # fmt: skip

    ok, stat, df = chi_square_passes(sample_many(run_broken, n_samples=N_BROKEN, seed=2), exact)
    assert not ok, f"one-side filtering passed the check (chi2={stat:.1f}, df={df})"


@pytest.mark.parametrize("drafter", ["ngram", "early_exit:1"])
def test_other_drafters_keep_the_target_distribution(drafter, monkeypatch):
    two_layers = HParams(**{**vars(SMALL), "n_layer": 2})
    model = GPT2(two_layers, random_weights(two_layers, seed=11, scale=0.6))
    # A prompt with repeats, so the n-gram drafter has something to propose.
    prompt = [1, 2, 1, 2, 3, 1, 2]
    exact = exact_continuations(model, prompt, 3, SamplingParams(1.0))

    def run(rng):
        return speculative_sample(model, drafter, prompt, 3, K=2, temperature=1.0, rng=rng)

    assert run(np.random.default_rng(0)).drafted > 0
    ok, stat, df = chi_square_passes(sample_many(run), exact)
    assert ok, f"chi2={stat:.1f} df={df}"
    monkeypatch.setattr(verify, "sampled_chain", verify_resample_target_on_reject)
    ok, stat, df = chi_square_passes(sample_many(run, n_samples=N_BROKEN), exact)
    assert not ok, f"a broken sampler passed with {drafter} (chi2={stat:.1f})"


# --- greedy equivalence -------------------------------------------------------------------


def test_greedy_speculative_equals_greedy_autoregressive(target):
    good = perturbed(target, 0.05, seed=3)
    bad = tiny_model(seed=99)  # unrelated random weights
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, target.n_vocab, size=n)) for n in (1, 2, 5, 9, 14)]
    prompts.append([7, 8, 9, 7, 8, 9, 7, 8])  # repetitive: n-gram drafts get accepted
    drafters = {"good": good, "bad": bad, "self": target, "ngram": "ngram", "early_exit": "early_exit:1"}
    accepted = {name: 0 for name in drafters}
    for prompt in prompts:
        expected = autoregressive_sample(target, prompt, 30).tokens
        for name, draft in drafters.items():
            for K in range(1, 9):
                out = speculative_sample(target, draft, prompt, 30, K=K)
                assert out.tokens == expected, f"draft={name} K={K} prompt={prompt}"
                accepted[name] += out.accepted
    assert accepted["self"] > 0 and accepted["good"] > 0 and accepted["ngram"] > 0


def test_draft_equal_to_target_accepts_everything(target):
    out = speculative_sample(target, target, [3, 4], 20, K=4)
    assert out.acceptance_rate == 1.0
    assert out.rounds == 4 and out.target_calls == 5  # 4 rounds of 5 tokens, plus the prefill
    assert out.accepted_histogram == [0, 0, 0, 0, 4]
    out = speculative_sample(target, target, [3, 4], 18, K=4)
    assert out.k_per_round == [4, 4, 4, 2]  # 3 tokens left: draft 2, and the bonus makes 3
    assert out.accepted_histogram == [0, 0, 1, 0, 3]
    out = speculative_sample(target, target, [3, 4], 20, K=4, temperature=0.9, seed=1)
    assert out.acceptance_rate > 0.99


# --- caches, counters, edge cases ---------------------------------------------------------


def assert_cache_holds(model, cache, text, n_layer=None):
    """cache equals a fresh cache built from text[:cache.length] (the first n_layer layers)."""
    n = cache.length
    if n == 0:
        return  # nothing cached: trivially a prefix
    fresh = model.new_cache()
    model.forward(text[:n], fresh)
    layers = slice(None, n_layer)
    np.testing.assert_allclose(cache.k[layers, :, :n], fresh.k[layers, :, :n], atol=2e-5)
    np.testing.assert_allclose(cache.v[layers, :, :n], fresh.v[layers, :, :n], atol=2e-5)


@pytest.mark.parametrize("kind", ["model", "early_exit"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_caches_hold_exactly_the_accepted_text_after_each_round(target, kind, temperature):
    """At every commit (after the prefill and after every round): the target's cache
    holds all of the text but its newest token, the draft's holds a prefix of the
    text (never a rejected token), and the features are the target's hidden
    states at the positions just kept, the last one being the row that gave ids[-1]."""
    draft_model = perturbed(target, 0.05, seed=4)
    drafter = ModelDrafter(draft_model) if kind == "model" else EarlyExitDrafter(target, n_layer=1)
    prompt, emitted, checks = [5, 6, 7], [], []
    target_caches = []
    real_begin, real_commit = drafter.begin, drafter.commit

    def recording_begin(target_model, cache, prompt_ids):
        target_caches.append(cache)
        real_begin(target_model, cache, prompt_ids)

    def checking_commit(ids, features):  # called by the sampler after every target pass
        real_commit(ids, features)
        text = prompt + emitted
        checks.append(len(features))
        target_cache = target_caches[-1]
        assert list(ids) == text and len(text) - 1 == target_cache.length
        assert_cache_holds(target, target_cache, text)
        if kind == "model":
            assert drafter.cache.length <= len(text) - 1
            assert len(checks) == 1 or len(text) - 2 <= drafter.cache.length  # after a round: caught up but 1-2
            assert_cache_holds(draft_model, drafter.cache, text)
        _, hidden = target.forward(text[:-1], target.new_cache(), return_hidden=True)  # [len-1, n_embd]
        assert features.shape == (len(features), target.n_embd) and len(features) >= 1
        np.testing.assert_allclose(features, hidden[-len(features) :], atol=2e-5)

    drafter.begin, drafter.commit = recording_begin, checking_commit
    out = speculative_sample(target, drafter, prompt, 25, K=4, temperature=temperature, seed=3,
                             on_token=lambda token, kind: emitted.append(token))  # fmt: skip
    assert len(checks) == out.rounds + 1  # every round, plus the prefill
    assert checks[0] == len(prompt) - 1 and checks[1:] == [n + 1 for n in out.accepted_per_round]
    assert 0 < out.accepted < out.drafted, "the test needs both accepted and rejected drafts"


def test_counters_are_consistent(target):
    out = speculative_sample(target, perturbed(target, 0.2, seed=5), [1, 2, 3], 40, K=3, temperature=1.0, seed=0)
    assert len(out.tokens) == 40
    assert out.rounds == len(out.k_per_round) == out.target_calls - 1
    assert sum(out.accepted_histogram) == sum(1 for k in out.k_per_round if k > 0)
    assert out.accepted == sum(n * c for n, c in enumerate(out.accepted_histogram))
    assert len(out.tokens) == out.accepted + out.rounds  # every round adds one target token
    assert out.drafted == sum(out.k_per_round) and out.draft_calls >= out.drafted
    ar = autoregressive_sample(target, [1, 2, 3], 40, temperature=1.0, seed=0)
    assert ar.target_calls == 40 and ar.draft_calls == 0 and ar.tokens_per_target_call == 1.0


@pytest.mark.parametrize("n_tokens,K", [(0, 4), (1, 4), (2, 4), (3, 8), (7, 1)])
def test_short_generations(target, n_tokens, K):
    expected = autoregressive_sample(target, [9], n_tokens).tokens
    out = speculative_sample(target, target, [9], n_tokens, K=K)  # a one-token prompt
    assert out.tokens == expected and len(out.tokens) == n_tokens
    assert all(k <= n_tokens - 1 for k in out.k_per_round)
    if n_tokens == 0:
        assert out.target_calls == 0 and out.draft_calls == 0


def test_tiny_temperature_is_greedy_and_numpy_scalars_are_accepted(target):
    greedy_tokens = autoregressive_sample(target, [1, 2, 3], 8).tokens
    assert autoregressive_sample(target, [1, 2, 3], 8, temperature=1e-40, seed=0).tokens == greedy_tokens
    assert speculative_sample(target, target, [1, 2, 3], 8, temperature=1e-40, seed=0).tokens == greedy_tokens
    out = speculative_sample(target, target, [1, 2, 3], 8, K=np.int64(3), temperature=np.float32(0.7),
                             top_k=np.int32(20), top_p=np.float32(0.9), seed=0)  # fmt: skip
    assert len(out.tokens) == 8


def test_a_draft_with_a_shorter_context_stops_drafting_at_its_end(target):
    short = HParams(**{**vars(target.hparams), "n_ctx": 24})
    draft = GPT2(short, target.weights)  # same weights; only the first 24 positions
    prompt = list(range(1, 19))
    out = speculative_sample(target, draft, prompt, 30, K=4)
    assert out.tokens == autoregressive_sample(target, prompt, 30).tokens
    # Every round kept its verification within the draft's 24 positions:
    # k <= n_ctx - len(text), so drafting shrinks to nothing near the end.
    length = len(prompt)
    for k, n_accepted in zip(out.k_per_round, out.accepted_per_round):
        assert k <= max(0, 24 - length)
        length += n_accepted + 1
    assert max(out.k_per_round) == 4 and out.k_per_round[-1] == 0


def test_running_into_the_context_window(target):
    n_ctx = target.n_ctx
    prompt = list(range(1, n_ctx - 10 + 1))
    expected = autoregressive_sample(target, prompt, 10).tokens
    for K in (1, 4, 8):
        out = speculative_sample(target, target, prompt, 10, K=K)
        assert out.tokens == expected
    with pytest.raises(ValueError, match="context window of 64"):
        speculative_sample(target, target, prompt, 11)
    with pytest.raises(ValueError, match="context window"):
        autoregressive_sample(target, list(range(65)), 0)


def test_adaptive_k_grows_and_shrinks(target):
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


def test_ngram_lookup():
    d = NgramDrafter(n_vocab=50, n_max=3)
    assert d.lookup([1, 2, 3, 9, 1, 2, 3], 4) == [9, 1, 2, 3]
    assert d.lookup([5, 2, 3, 7, 1, 2, 3], 2) == [7, 1]  # the 3-gram [1,2,3] has no earlier match; [2,3] does
    assert d.lookup([4, 1, 8, 1, 8, 1], 3) == [8, 1, 8]  # [1,8,1] last seen at 1; the copy runs into itself
    assert d.lookup([7, 7, 7, 7], 5) == [7, 7, 7, 7, 7]
    assert d.lookup([6, 1, 2, 9, 1, 2], 5) == [9, 1, 2, 9, 1]
    assert d.lookup([1, 2, 3], 4) == []
    assert d.lookup([7], 4) == []
    assert NgramDrafter(50, n_max=1).lookup([5, 3, 5, 4, 5], 2) == [4, 5]  # most recent 1-gram match


def test_early_exit_drafter_restores_the_shared_cache(target):
    drafter = EarlyExitDrafter(target, n_layer=1)
    cache = target.new_cache()
    drafter.begin(target, cache, [1, 2, 3, 4])
    target.forward([1, 2, 3], cache)
    proposal = drafter.propose([1, 2, 3, 4], 3, SamplingParams(1.0), np.random.default_rng(0))
    assert len(proposal.tokens) == 3 and proposal.q.shape == (3, target.n_vocab) and drafter.calls == 3
    assert proposal.parents == [-1, 0, 1] and cache.length == 3
    with pytest.raises(ValueError, match="different target"):
        drafter.begin(tiny_model(seed=5), cache, [1, 2])


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(K=0), "K"),
        (dict(K=2.5), "K"),
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=0), "top_k"),
        (dict(prompt_ids=[]), "empty"),
        (dict(prompt_ids=[10**6]), "token ids"),
        (dict(n_tokens=-1), "n_tokens"),
        (dict(seed=1, rng=np.random.default_rng()), "either seed or rng"),
        (dict(draft="bogus"), "unknown drafter"),
        (dict(draft="early_exit:2"), "early exit"),
    ],
)
def test_bad_requests_are_clear_errors(target, kwargs, message):
    args = dict(target=target, draft=target, prompt_ids=[1, 2], n_tokens=5)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        speculative_sample(**args)


def test_vocabulary_mismatch_is_refused(target):
    other = GPT2(SMALL, random_weights(SMALL))
    with pytest.raises(ValueError, match="share a vocabulary"):
        speculative_sample(target, other, [1, 2], 5)


def test_custom_drafters_need_the_whole_interface(target):
    class OnlyPropose:
        def begin(self, target, cache, prompt):
            pass

        def propose(self, ids, k, params, rng, nodes=None):
            return Proposal.chain([])

        def commit(self, ids, features):
            pass

    with pytest.raises(TypeError, match="begin, propose, commit, n_vocab, n_ctx"):
        speculative_sample(target, OnlyPropose(), [1, 2], 4)
    custom = OnlyPropose()
    custom.n_vocab, custom.n_ctx, custom.calls = target.n_vocab, None, 0
    out = speculative_sample(target, custom, [1, 2], 4)  # proposes nothing: plain target steps
    assert out.tokens == autoregressive_sample(target, [1, 2], 4).tokens and out.drafted == 0


def test_proposal_chain_and_tree_shapes():
    chain = Proposal.chain([5, 6, 7], np.full((3, 10), 0.1, np.float32))
    assert chain.parents == [-1, 0, 1] and chain.is_chain and len(chain) == 3
    assert Proposal.chain([]).is_chain and Proposal.chain([]).q is None
    tree = Proposal([5, 6, 7], [-1, -1, 0])  # two children of the text's last token; 7 follows 5
    assert not tree.is_chain
    with pytest.raises(AssertionError, match="parents must come first"):
        Proposal([5, 6], [1, -1])
    with pytest.raises(AssertionError, match="rows"):
        Proposal.chain([5, 6], np.zeros((3, 10), np.float32))
