"""Drafts from a model with another tokenizer (drafters/crossvocab.py): exact, like the rest.

Two tiny GPT-2s with two different tiny byte-level BPEs built here:
    target  a b c ab bc <|endoftext|>   (6 tokens)
    draft   a b c ca <|endoftext|>      (5 tokens)
They share a, b, c and <|endoftext|>; "ab" and "bc" are the target's alone, "ca" the draft's.
Checked: greedy output equals the target's own greedy decoding (every rule); at T=1 (and
with top-k) TLI and SLRS reproduce the target's law over three tokens by chi-square; one round's
whole output law, enumerated, equals the target's (TLI to 1e-8, SLRS to 1e-6 as its row is
float32). TLI without renormalising, and SLRS counting one tokenization of each target token,
fail both.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tiktoken
from helpers import N_BROKEN, N_SAMPLES, assert_cache_holds, chi_square_passes, exact_continuations, sample_many

import specdec.drafters.crossvocab as crossvocab
from specdec import autoregressive_sample, speculative_sample
from specdec.drafters import make_drafter
from specdec.drafters.crossvocab import CrossVocabDrafter
from specdec.drafters.vocabmap import complete_utf8, spell, tokenization_tree_size, vocab_map
from specdec.model.gpt2 import GPT2, HParams, random_weights
from specdec.model.tokenizer import GPT2_PATTERN
from specdec.race import race
from specdec.sampling import SamplingParams, probabilities

PROMPT = [1, 2]  # "bc" spelt b, c (the target's own tokens need not be its canonical encoding)


def encoding(name: str, pieces: list[bytes]) -> tiktoken.Encoding:
    """A byte-level BPE whose ranks (= ids) are the order of `pieces`, plus <|endoftext|> last."""
    ranks = {piece: i for i, piece in enumerate(pieces)}
    return tiktoken.Encoding(
        name, pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": len(pieces)}
    )


def tiny(tokenizer, seed: int, n_ctx: int = 16, name: str = "tiny") -> GPT2:
    h = HParams(n_vocab=tokenizer.n_vocab, n_ctx=n_ctx, n_embd=16, n_head=2, n_layer=1)
    return GPT2(h, random_weights(h, seed=seed, scale=0.6), tokenizer, name=name)


TARGET_BPE = encoding("target", [b"a", b"b", b"c", b"ab", b"bc"])
DRAFT_BPE = encoding("draft", [b"a", b"b", b"c", b"ca"])


@pytest.fixture(scope="module")
def target():
    return tiny(TARGET_BPE, seed=10, name="target")


@pytest.fixture(scope="module")
def draft():
    return tiny(DRAFT_BPE, seed=3, n_ctx=32, name="draft")


def unnormalised(self, q_draft):
    """BROKEN: TLI reporting the draft's shared mass without renormalising (it still draws from the
    renormalised row, since draw() normalises: only the acceptance test reads the wrong q)."""
    row = self.vocab.to_target(q_draft)
    return row if row.sum() > 0 else None


STRING_LAW = CrossVocabDrafter.string_law


def one_tokenization(self, new, params):
    """BROKEN: SLRS whose q(y) counts one draft tokenization of y, the draft's own spelling of its
    bytes, and nothing after it (it still draws y by walking the draft: only the test reads the
    wrong q). The target's "c" is also the draft's "ca" stopping on "c"; "a" is "a" followed by a
    token that does not make "ab"."""
    _, nodes = STRING_LAW(self, new, params)
    row = np.zeros(self.n_vocab, np.float32)
    for y in range(self.n_vocab):
        path = DRAFT_BPE.encode(TARGET_BPE.decode([y]), allowed_special="all")
        for j, x in enumerate(path):  # a node the tree left out (top-k gave it q = 0) has probability 0
            q = nodes.get(tuple(path[:j]))
            row[y] = (row[y] if j else 1) * (q[x] if q is not None else 0)
    return row, nodes


# --- the vocabulary map and the boundary -------------------------------------------------------


def test_the_map_pairs_tokens_with_the_same_bytes_and_control_tokens_by_name():
    m = vocab_map(DRAFT_BPE, TARGET_BPE, 5, 6)
    assert list(zip(m.draft_ids.tolist(), m.target_ids.tolist())) == [(0, 0), (1, 1), (2, 2), (4, 5)]
    row = m.to_target(np.array([0.1, 0.2, 0.3, 0.25, 0.15], np.float32))
    np.testing.assert_allclose(row, [0.1, 0.2, 0.3, 0, 0, 0.15])
    assert row.dtype == np.float32


def test_bytes_that_are_not_utf8_alone_are_spelt_byte_by_byte():
    bpe = encoding("bytes", [bytes([b]) for b in range(256)] + ["é".encode()])
    e = "é".encode()  # two bytes; a byte-level token may end between them
    assert spell(bpe, e) == [256]
    assert spell(bpe, e[:1] + b"a") == [e[0], ord("a")]
    assert complete_utf8(b"a" + e[:1]) == b"a" and complete_utf8(b"a" + e) == b"a" + e
    assert complete_utf8("€".encode()[:2]) == b""


# --- greedy: exactly the target's own decoding -------------------------------------------------


@pytest.mark.parametrize("rule", ["tli", "slem", "slrs"])
@pytest.mark.parametrize("seed", [3, 4, 5])
def test_greedy_is_the_targets_greedy_decoding(target, rule, seed):
    draft = tiny(DRAFT_BPE, seed=seed, n_ctx=32)
    expected = autoregressive_sample(target, PROMPT, 12).tokens
    for K in (1, 3):
        out = speculative_sample(target, draft, PROMPT, 12, K=K, cross_vocab=rule)
        assert out.tokens == expected, (rule, K)


@pytest.mark.parametrize("rule", ["slem", "slrs"])
def test_greedy_with_the_target_as_its_own_draft_accepts_across_tokenizers(rule):
    """A draft that IS the target, read through the other tokenizer: the string rules must accept drafts."""
    target = tiny(TARGET_BPE, seed=10, n_ctx=32)
    out = speculative_sample(target, target, PROMPT, 12, K=3, cross_vocab=rule)
    assert out.tokens == autoregressive_sample(target, PROMPT, 12).tokens
    assert sum(out.accepted_per_round) > 0


def test_the_drafts_cache_holds_a_prefix_of_its_encoding_of_the_text(target, draft):
    drafter = make_drafter(draft, target, "tli")
    out = speculative_sample(target, drafter, PROMPT, 10, K=3, temperature=1.0, seed=1)
    assert drafter.cache.length == len(drafter.cached)
    assert_cache_holds(draft, drafter.cache, drafter.cached)
    text = TARGET_BPE.decode_bytes(PROMPT + out.tokens)
    assert text.startswith(DRAFT_BPE.decode_bytes(drafter.cached))


# --- sampling: TLI and SLRS reproduce the target's law, their broken variants do not -----------


@pytest.mark.slow  # one to three minutes each: 10,000 runs
@pytest.mark.parametrize("top_k", [None, 3])
@pytest.mark.parametrize(
    "rule,method,broken", [("tli", "intersect", unnormalised), ("slrs", "string_law", one_tokenization)]
)
def test_the_sampling_rules_match_the_target_distribution(target, draft, rule, method, broken, top_k, monkeypatch):
    params = SamplingParams(1.0, top_k=top_k)
    exact = exact_continuations(target, PROMPT, 3, params)

    def run(rng):
        return speculative_sample(
            target, draft, PROMPT, 3, K=2, temperature=1.0, top_k=top_k, rng=rng, cross_vocab=rule
        )

    ok, stat, df = chi_square_passes(sample_many(run, n_samples=N_SAMPLES), exact)
    assert ok, f"{rule} failed: chi2={stat:.1f} df={df}"
    monkeypatch.setattr(CrossVocabDrafter, method, broken)
    ok, stat, df = chi_square_passes(sample_many(run, n_samples=N_BROKEN), exact)
    assert not ok, f"{rule} with {broken.__name__} passed (chi2={stat:.1f} df={df})"


# --- one round's whole output law, enumerated ---------------------------------------------------


def softmax64(logits) -> np.ndarray:
    z = np.exp(np.asarray(logits, np.float64) - np.max(logits))
    return z / z.sum()


def round_law(target, rows, ctx: list[int], K: int) -> dict[tuple, float]:
    """P(one round's output, continued by the target itself, is s) for every (K+1)-token s.

    Leviathan et al.'s rule written out on the rows a rule uses: rows(c, i) gives, for draft
    step i after the text c, the law the draft token is DRAWN with and the q the acceptance test
    READS (None: no draft this step); the residual and the bonus are over the full target vocabulary.
    """
    p_of = lambda c: softmax64(target(list(c))[-1])  # noqa: E731

    def target_law(c, m):
        if m == 0:
            return {(): 1.0}
        p = p_of(c)
        return {(z, *s): p[z] * w for z in range(target.n_vocab) for s, w in target_law((*c, z), m - 1).items()}

    def law(c, i):
        if i == K:  # all accepted: the bonus
            return target_law(c, 1)
        drawn_and_read = rows(c, i)
        if drawn_and_read is None:  # no draft this step: the target's token, then the target
            return target_law(c, K + 1 - i)
        drawn, q = drawn_and_read
        p = p_of(c)
        out: dict[tuple, float] = {}
        accept = np.minimum(1.0, np.divide(p, q, out=np.ones_like(p), where=q > 0))
        for y in np.flatnonzero(drawn > 0):
            for s, w in law((*c, y), i + 1).items():
                out[(int(y), *s)] = out.get((int(y), *s), 0.0) + drawn[y] * accept[y] * w
        rejected = float((drawn * (1 - accept)).sum())
        residual = np.maximum(p - q, 0)
        if rejected > 0:
            residual /= residual.sum()
            for z in range(target.n_vocab):
                for s, w in target_law((*c, z), K - i).items():
                    out[(z, *s)] = out.get((z, *s), 0.0) + rejected * residual[z] * w
        return out

    return law(tuple(ctx), 0)


def tli_rows(draft, drafter, ctx, K):
    """TLI's rows: the draft reads its own id of each drafted target token after its context."""

    def rows(c, i):
        draft_tokens = drafter.context(ctx, K) + [drafter.to_draft[int(y)] for y in c[len(ctx) :]]
        q = drafter.intersect(softmax64(draft(draft_tokens)[-1]))  # [n_target] as reported
        return None if q is None else (q / q.sum(), q)

    return rows


TARGET_TOKENS = {b"a": 0, b"b": 1, b"c": 2, b"ab": 3, b"bc": 4}  # TARGET_BPE's ordinary tokens; 5 is <|endoftext|>
DRAFT_PIECES = [b"a", b"b", b"c", b"ca"]  # DRAFT_BPE's ordinary tokens; 4 is <|endoftext|>


def slrs_drawing_law(draft, tokens: list[int]) -> np.ndarray:
    """[6] float64: P(the draft, writing after `tokens`, stops on target token y), by brute force.

    The draft writes while its string is "a" or "b" (the proper prefixes of "ab" and "bc"); then
    y is the longest target token the string begins with (<|endoftext|> at the start: the target's).
    """
    law = np.zeros(6)

    def longest(s):
        return next(TARGET_TOKENS[s[:n]] for n in (2, 1) if s[:n] in TARGET_TOKENS)

    def write(tokens, s, mass):
        q = softmax64(draft(tokens)[-1])  # [5]
        law[5 if not s else longest(s)] += mass * q[4]  # <|endoftext|> ends the string
        for x, piece in enumerate(DRAFT_PIECES):
            if s + piece in (b"a", b"b"):
                write([*tokens, x], s + piece, mass * q[x])
            else:
                law[longest(s + piece)] += mass * q[x]

    write(list(tokens), b"", 1.0)
    return law


def slrs_rows(draft, drafter, ctx, K):
    """SLRS's rows: drawn by brute force from the draft itself, read from the drafter's string_law."""

    def rows(c, i):
        new = drafter.sync(list(c), K - i)
        q = drafter.string_law(new, SamplingParams(1.0))[0].astype(np.float64)
        drafter.cache.rollback(len(drafter.cached))
        return slrs_drawing_law(draft, drafter.context(list(c), K - i)), q / q.sum()

    return rows


def law_error(target, rows, K) -> float:
    got = round_law(target, rows, PROMPT, K)
    seqs = list(itertools.product(range(target.n_vocab), repeat=K + 1))
    p = {s: float(np.prod([softmax64(target([*PROMPT, *s[:i]])[-1])[t] for i, t in enumerate(s)])) for s in seqs}
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-6)
    return max(abs(got.get(s, 0.0) - p[s]) for s in seqs)


def test_one_tli_round_has_exactly_the_target_law(target, draft, monkeypatch):
    drafter = make_drafter(draft, target, "tli")
    assert law_error(target, tli_rows(draft, drafter, PROMPT, 2), K=2) < 1e-8
    monkeypatch.setattr(CrossVocabDrafter, "intersect", unnormalised)
    assert law_error(target, tli_rows(draft, drafter, PROMPT, 2), K=2) > 1e-3


def test_slrs_draws_what_its_row_says(target, draft):
    """The walk through the draft (what proposes) and string_law (what the test reads) agree, and
    both agree with the brute-force law: 20,000 first drafts against the row, chi-square."""
    drafter = make_drafter(draft, target, "slrs")
    new = drafter.sync(PROMPT, 1)
    row, nodes = drafter.string_law(new, SamplingParams(1.0))
    np.testing.assert_allclose(row, slrs_drawing_law(draft, drafter.context(PROMPT, 1)), atol=1e-6)
    rng = np.random.default_rng(0)
    samples = [(drafter.walk(nodes, rng),) for _ in range(20_000)]
    ok, stat, df = chi_square_passes(samples, {(y,): float(w) for y, w in enumerate(row)})
    assert ok, f"chi2={stat:.1f} df={df}"


def test_one_slrs_round_has_exactly_the_target_law(target, draft, monkeypatch):
    drafter = make_drafter(draft, target, "slrs")
    assert law_error(target, slrs_rows(draft, drafter, PROMPT, 2), K=2) < 1e-6
    monkeypatch.setattr(CrossVocabDrafter, "string_law", one_tokenization)
    assert law_error(target, slrs_rows(draft, drafter, PROMPT, 2), K=2) > 1e-3


def test_the_slrs_tree_counts_every_draft_tokenization_of_every_prefix():
    assert tokenization_tree_size(DRAFT_BPE, TARGET_BPE, 5, 6, 100) == 3  # the root, "a", "b"
    target = encoding("t", [b"a", b"aa", b"aaa", b"aaaa"])
    draft = encoding("d", [b"a", b"aa"])
    # "a": a; "aa": a+a, aa; "aaa": a+a+a, a+aa, aa+a
    assert tokenization_tree_size(draft, target, 3, 5, 100) == 1 + 1 + 2 + 3
    assert tokenization_tree_size(draft, target, 3, 5, 4) > 4  # counting stops past the limit


# --- refusals -------------------------------------------------------------------------------------


def test_settings_a_rule_cannot_keep_exact_are_refused(target, draft, monkeypatch):
    with pytest.raises(ValueError, match="slem.*temperature 0"):
        speculative_sample(target, draft, PROMPT, 4, temperature=1.0, cross_vocab="slem")
    monkeypatch.setattr(crossvocab, "SLRS_MAX_PASSES", 2)  # the tiny pair's tree has 3 nodes
    with pytest.raises(ValueError, match="'slrs' sums over every draft tokenization.*more than 2 draft passes"):
        speculative_sample(target, draft, PROMPT, 4, temperature=1.0, cross_vocab="slrs")
    speculative_sample(target, draft, PROMPT, 4, cross_vocab="slrs")  # greedy walks one path: no limit
    with pytest.raises(ValueError, match="tokenizes text differently.*cross_vocab='tli'"):
        speculative_sample(target, draft, PROMPT, 4)
    with pytest.raises(ValueError, match="draft MODEL"):
        speculative_sample(target, "ngram", PROMPT, 4, cross_vocab="tli")
    with pytest.raises(ValueError, match="cross_vocab must be"):
        speculative_sample(target, draft, PROMPT, 4, cross_vocab="TLI")


def test_the_module_names_the_rules():
    assert crossvocab.CROSS_VOCAB == ("slem", "slrs", "tli")


@pytest.mark.parametrize("rule", ["tli", "slem", "slrs"])
def test_race_takes_cross_vocab(target, draft, rule):
    report = race(target, draft, PROMPT, 6, K=2, repeats=1, warmup=False, cross_vocab=rule)
    assert report.settings["cross_vocab"] == rule
    assert report.speculative[0].result.tokens == report.autoregressive[0].result.tokens
    with pytest.raises(ValueError, match="'slem' is exact only at temperature 0"):
        race(target, draft, PROMPT, 6, temperature=1.0, cross_vocab="slem")


# --- the real pair: SmolLM2-135M drafted for by the shipped stdlib-2L (another tokenizer) -------


@pytest.fixture(scope="module")
def smollm2_and_stdlib(smollm2_gguf):
    from specdec import load_model

    return load_model(str(smollm2_gguf)), load_model("stdlib-2L")


@pytest.mark.slow  # SmolLM2 decodes at a few tokens per second here
@pytest.mark.parametrize("rule", ["tli", "slem", "slrs"])
@pytest.mark.parametrize("prompt,chat", [("def mean(xs):\n    total = 0\n", False), ("Name three rivers.", True)])
def test_smollm2_with_a_stdlib_draft_is_smollm2s_greedy_decoding(smollm2_and_stdlib, rule, prompt, chat):
    target, draft = smollm2_and_stdlib
    expected = autoregressive_sample(target, prompt, 24, chat=chat).tokens
    out = speculative_sample(target, draft, prompt, 24, K=4, chat=chat, cross_vocab=rule)
    assert out.tokens == expected


def test_the_bench_measures_the_mass_on_shared_tokens(target, draft):
    from specdec.bench.crossvocab import shared_mass

    p = probabilities(target(TARGET_BPE.encode_ordinary("abcab")), SamplingParams(1.0))  # [n, 6]
    expected = p[:, [0, 1, 2, 5]].sum(axis=1).mean()  # a, b, c and <|endoftext|>: what the draft also has
    assert shared_mass(target, DRAFT_BPE, 5, "abcab") == pytest.approx(expected, rel=1e-6)


@pytest.mark.slow  # SmolLM2 loads in a few seconds
def test_the_cli_refuses_slrs_sampling_it_cannot_afford(smollm2_gguf, capsys):
    from specdec.cli import main

    argv = ["--target_model_size", str(smollm2_gguf), "--draft", "stdlib-2L", "--cross_vocab", "slrs"]
    assert main.main([*argv, "--temperature", "1"]) == 2
    err = capsys.readouterr().err
    assert "more than 4,096 draft passes" in err and len(err.strip().splitlines()) == 1, err
