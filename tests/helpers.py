"""Shared test helpers: small models, the exact distribution of short continuations,
the chi-square check, deliberately broken verification rules, cache checks, and the
finite-difference gradient check.

(Tiny checkpoints on disk and the loopback Hub live in conftest.py.)
"""

from __future__ import annotations

import itertools

import numpy as np

from specdec.model.gpt2 import GPT2, Block, HParams, Weights, random_weights
from specdec.model.linear import Linear
from specdec.interfaces import Proposal
from specdec.sampling import SamplingParams, draw, probabilities

# A 6-token vocabulary: every 3-token continuation (216 of them) can be enumerated.
SMALL = HParams(n_vocab=6, n_ctx=16, n_embd=16, n_head=2, n_layer=1)
PROMPT = [1, 2]
N_SAMPLES_MAIN = 25_000  # the headline exactness test
N_SAMPLES = 8_000  # each further correct-sampler check
N_BROKEN = 2_000  # enough: every broken variant lands at 3-30x the threshold


def small_model(seed: int = 10, n_layer: int = 1) -> GPT2:
    """A 6-token model with peaky distributions (scale 0.6), for the statistical tests."""
    h = HParams(**{**vars(SMALL), "n_layer": n_layer})
    return GPT2(h, random_weights(h, seed=seed, scale=0.6), name=f"small-{seed}")


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


# --- deliberately broken chain rules (the signature of verify.sampled_chain) ----------------


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


BROKEN_RULES = (verify_accept_on_argmax, verify_unnormalised_residual, verify_resample_target_on_reject)


# --- caches ---------------------------------------------------------------------------------


def assert_cache_holds(model: GPT2, cache, text, n_layer=None) -> None:
    """cache equals a fresh cache built from text[:cache.length] (the first n_layer layers)."""
    n = cache.length
    if n == 0:
        return  # nothing cached: trivially a prefix
    fresh = model.new_cache()
    model.forward(text[:n], fresh)
    layers = slice(None, n_layer)
    np.testing.assert_allclose(cache.k[layers, :, :n], fresh.k[layers, :, :n], atol=2e-5)
    np.testing.assert_allclose(cache.v[layers, :, :n], fresh.v[layers, :, :n], atol=2e-5)


TIE_HPARAMS = HParams(n_vocab=300, n_ctx=128, n_embd=32, n_head=4, n_layer=2)


def near_tie_model(eps: float = 1e-5, hparams: HParams = TIE_HPARAMS) -> GPT2:
    """A model whose two best tokens (10 and 11) are always within about 1e-5 of each other.

    ln_f's bias points along v, and wte[10] = 3 v dominates every other logit;
    wte[11] = wte[10] + eps * u with u orthogonal to v, so which of the two wins
    is decided by eps * (h . u), a difference near float32's rounding of logits
    around 30, and far above float64's.
    """
    w = random_weights(hparams, seed=0, scale=0.3)
    rng = np.random.default_rng(100)
    v = rng.standard_normal(hparams.n_embd).astype(np.float32)
    v /= np.linalg.norm(v)
    u = rng.standard_normal(hparams.n_embd).astype(np.float32)
    u -= (u @ v) * v
    u /= np.linalg.norm(u)
    w.wte[10] = 3 * v
    w.wte[11] = 3 * v + np.float32(eps) * u
    w.ln_f_bias[:] = 10 * v
    return GPT2(hparams, w, name="near-tie")


LEARNABLE = HParams(n_vocab=64, n_ctx=64, n_embd=64, n_head=4, n_layer=2)


def learnable_model() -> GPT2:
    """A tiny GPT-2 whose large random weights make its next-token distributions sharp: heads can learn it."""
    return GPT2(LEARNABLE, random_weights(LEARNABLE, seed=0, scale=1.0), name="learnable")


def numeric_grad(f, x: np.ndarray, idx) -> float:
    """Central difference of the scalar f() in entry idx of x (x is changed in place and restored)."""
    h = 1e-6
    old = x[idx]
    x[idx] = old + h
    up = f()
    x[idx] = old - h
    down = f()
    x[idx] = old
    return (up - down) / (2 * h)


def assert_grads_match(f, arrays: dict[str, np.ndarray], grads: dict[str, np.ndarray], n: int = 12, seed=0):
    """Compare analytic grads[name] with finite differences of f at n random entries of each array."""
    rng = np.random.default_rng(seed)
    for name, x in arrays.items():
        assert grads[name].shape == x.shape, name
        for flat in rng.choice(x.size, size=min(n, x.size), replace=False):
            idx = np.unravel_index(flat, x.shape)
            num = numeric_grad(f, x, idx)
            assert np.isclose(grads[name][idx], num, rtol=1e-5, atol=1e-8), (name, idx, grads[name][idx], num)


# --- a drafter that misreports its q (the exactness tests' broken control) -------------------------


class LyingQ:
    """BROKEN: proposes what the inner drafter drew, but reports q sharpened (q^2, renormalised)."""

    def __init__(self, inner):
        self.inner = inner
        self.n_vocab, self.n_ctx = inner.n_vocab, inner.n_ctx
        self.hidden_layers = getattr(inner, "hidden_layers", None)  # what it reads of the target (EAGLE-3's layers)

    calls = property(lambda self: self.inner.calls)

    def begin(self, target, cache, prompt):
        self.inner.begin(target, cache, prompt)

    def commit(self, ids, features):
        self.inner.commit(ids, features)

    def propose(self, ids, k, params, rng, nodes=None):
        p = self.inner.propose(ids, k, params, rng, nodes)
        if not len(p):
            return p
        q = self.misreport(p.q)
        return Proposal(p.tokens, p.parents, q / q.sum(axis=1, keepdims=True))

    def misreport(self, q):
        return q**2
