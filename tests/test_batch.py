"""Batched speculative decoding (specdec/batch.py, forward_batch in model/).

- forward_batch over a ragged batch equals each row's own forward;
- greedy batched decoding equals unbatched greedy decoding row by row, for every drafter that batches;
- a row's tokens do not depend on which prompts share its batch (same seed, same tokens);
- at T = 1 every row follows its own target distribution (chi-square per row), and a
  broken batch (rows rolled back by another row's acceptance: one shared counter) fails the same check.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
from conftest import tiny_model
from helpers import N_BROKEN, N_SAMPLES, chi_square_passes, exact_continuations, perturbed, small_model

import specdec.speculative as round_step  # the round's steps 3-5, which the batch runs per row
from specdec import autoregressive_sample, speculative_sample
from specdec.batch import autoregressive_sample_batch, speculative_sample_batch
from specdec.model.llama import LlamaHParams, random_llama
from specdec.sampling import SamplingParams
from specdec.verify import verify

PROMPTS = [[5, 6, 7, 5, 6, 7, 5, 6], [3], [11, 40, 2, 9, 17], [7, 7]]  # ragged lengths; one repetitive


@pytest.fixture(scope="module")
def gpt2_pair():
    target = tiny_model(seed=1)
    return target, perturbed(target, 0.05, seed=3)


@pytest.fixture(scope="module")
def llama_pair():
    target = random_llama(seed=3, scale=0.3)
    draft = random_llama(LlamaHParams(**{**vars(target.hparams), "n_layer": 1}), seed=4, scale=0.3)
    return target, draft


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_forward_batch_equals_each_rows_own_forward(arch, gpt2_pair, llama_pair):
    """Rows with different cached lengths and different numbers of new tokens (one a tree), packed in one pass."""
    model = gpt2_pair[0] if arch == "gpt2" else llama_pair[0]
    pasts = [[1, 2, 3], [], [4, 5, 6, 7, 8, 9, 10], [3]]
    news = [[11, 12], [13], [14, 15, 16, 17], [18, 19, 20]]
    parents = [None, None, None, [-1, 0, 0]]  # the last row is a tree: a root and two children

    def filled(past):
        cache = model.new_cache()
        if past:
            model.forward(past, cache)
        return cache

    caches = [filled(p) for p in pasts]
    for last_only, n_layer in [(False, None), (True, None), (False, 1)]:
        for c, p in zip(caches, pasts):
            c.rollback(len(p))
        logits, hidden = model.forward_batch(
            news, caches, last_only=last_only, n_layer=n_layer, return_hidden=True, parents=parents
        )
        for b, (past, new) in enumerate(zip(pasts, news)):
            alone = filled(past)
            want, want_hidden = model.forward(new, alone, last_only, n_layer, True, parents[b])
            assert logits[b].shape == want.shape and logits[b].dtype == np.float32
            np.testing.assert_allclose(logits[b], want, atol=2e-5, err_msg=f"row {b}")
            np.testing.assert_allclose(hidden[b], want_hidden, atol=2e-5)
            assert caches[b].length == alone.length == len(past) + len(new)
            written = (slice(n_layer), slice(None), slice(alone.length))  # the layers this pass ran
            np.testing.assert_allclose(caches[b].k[written], alone.k[written], atol=2e-5)
    # last_only without hidden states: the LM head reads one row per sequence.
    for c, p in zip(caches, pasts):
        c.rollback(len(p))
    assert [x.shape[0] for x in model.forward_batch(news, caches, last_only=True)] == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="its own KV cache"):
        model.forward_batch([[1], [2]], [caches[0], caches[0]])
    with pytest.raises(ValueError, match="at least one new token"):
        model.forward_batch([[1], []], [model.new_cache(), model.new_cache()])


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_greedy_batch_equals_unbatched_greedy_row_by_row(arch, gpt2_pair, llama_pair):
    target, draft = gpt2_pair if arch == "gpt2" else llama_pair
    n = 16
    expected = [autoregressive_sample(target, p, n).tokens for p in PROMPTS]
    assert [r.tokens for r in autoregressive_sample_batch(target, PROMPTS, n)] == expected
    accepted = {}
    for name, d in {"model": draft, "ngram": "ngram", "early_exit": "early_exit:1", "self": target}.items():
        for K in (2, "adaptive"):
            outs = speculative_sample_batch(target, d, PROMPTS, n, K=K)
            for b, out in enumerate(outs):
                assert out.tokens == expected[b], f"draft={name} K={K} row {b}"
                alone = speculative_sample(target, d, PROMPTS[b], n, K=K)  # the same rounds, one at a time
                assert (out.k_per_round, out.accepted_per_round) == (alone.k_per_round, alone.accepted_per_round)
                assert (out.target_calls, out.draft_calls) == (alone.target_calls, alone.draft_calls)
            accepted[name] = accepted.get(name, 0) + sum(out.accepted for out in outs)
    assert accepted["self"] > 0 and accepted["ngram"] > 0 and accepted["model"] > 0


@pytest.fixture(scope="module")
def head_folders(llama_pair, tmp_path_factory):
    """Medusa and EAGLE heads for the Llama target (untrained, saved as training saves them), on a restricted
    draft vocabulary: {kind: folder}."""
    from specdec.drafters import eagle_grad, medusa
    from specdec.drafters.heads import DraftVocab, save_heads

    target, folder = llama_pair[0], tmp_path_factory.mktemp("heads")
    vocab = DraftVocab.of(target, np.arange(0, target.n_vocab, 2))
    params = {
        "medusa": medusa.init_params(3, target.n_embd),
        "eagle": eagle_grad.init_params(target.n_embd, np.random.default_rng(0), std=0.2),
    }
    for kind, p in params.items():
        save_heads(folder / kind, kind, target, p, {"n_heads": 3 if kind == "medusa" else 1}, vocab)
    return {kind: folder / kind for kind in params}


def test_heads_and_a_restricted_draft_batch_too_greedy_row_by_row(llama_pair, head_folders):
    """Medusa and EAGLE heads draft per row, each row with its own drafting state. A restricted-vocabulary
    draft model drafts in batched passes (its forward_batch widens each row's logits). Greedy output is the
    target's (each row's rounds and passes: the test below)."""
    from specdec.drafters.restricted import restrict

    target = llama_pair[0]
    expected = [autoregressive_sample(target, p, 12).tokens for p in PROMPTS]
    heads = [f"{kind}:{folder}" for kind, folder in head_folders.items()]
    for draft in [*heads, restrict(target, 32, np.arange(0, target.n_vocab, 2))]:
        outs = speculative_sample_batch(target, draft, PROMPTS, 12, K=3)
        assert [o.tokens for o in outs] == expected, draft
        assert sum(o.drafted for o in outs) > 0, draft


def counters(result) -> dict:
    """Everything a DecodeResult records (tokens, target and draft passes, k, accepted and judged per round)."""
    return {f.name: getattr(result, f.name) for f in fields(result) if f.compare}


@pytest.mark.parametrize("kind", ["medusa", "eagle", "model"])
def test_a_rows_counters_are_those_of_the_row_decoded_alone(kind, llama_pair, head_folders):
    """A row of a 3-row batch records what the row decoded alone records, draft passes included: an EAGLE
    head's passes while committing (its block over each accepted token's feature, after every target pass,
    the last round's too) count in a batch as they do alone (speculative.count_draft_passes)."""
    target, draft_model = llama_pair
    draft = draft_model if kind == "model" else f"{kind}:{head_folders[kind]}"
    outs = speculative_sample_batch(target, draft, PROMPTS[:3], 12, K=3)
    for b, out in enumerate(outs):
        alone = speculative_sample(target, draft, PROMPTS[b], 12, K=3)
        assert counters(out) == counters(alone), f"{kind} row {b}"
    assert all(out.draft_calls > 0 for out in outs)


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_a_batch_reads_its_head_file_once(kind, llama_pair, head_folders, monkeypatch):
    """The rows share the heads' weights (read-only while drafting): one read of the file for the whole batch."""
    from specdec.drafters import heads

    module = __import__(f"specdec.drafters.{kind}", fromlist=["load_heads"])
    reads = []
    monkeypatch.setattr(module, "load_heads", lambda *a, **kw: reads.append(a[0]) or heads.load_heads(*a, **kw))
    outs = speculative_sample_batch(llama_pair[0], f"{kind}:{head_folders[kind]}", PROMPTS[:3], 6, K=2)
    assert len(outs) == 3 and sum(o.drafted for o in outs) > 0
    assert len(reads) == 1, f"the {kind} head file was read {len(reads)} times for a batch of 3 rows"


def test_rows_finish_early_and_leave_the_batch(gpt2_pair):
    target, draft = gpt2_pair
    rounds = []
    outs = speculative_sample_batch(target, target, PROMPTS[:3], 9, K=4, on_batch_round=rounds.append)
    assert [len(o.tokens) for o in outs] == [9, 9, 9]
    assert rounds[0].rows == [0, 1, 2] and rounds[-1].rows  # every round has rows; finished ones are gone
    assert all(len(r.k) == len(r.rows) == len(r.accepted) for r in rounds)
    with pytest.raises(ValueError, match="chains only"):
        speculative_sample_batch(target, draft, PROMPTS, 5, tree=4)
    with pytest.raises(ValueError, match="int or 'adaptive'"):
        speculative_sample_batch(target, draft, PROMPTS, 5, K="auto")
    with pytest.raises(ValueError, match="non-empty list"):
        speculative_sample_batch(target, draft, [], 5)


@pytest.mark.parametrize("draft", ["model", "ngram"])
def test_a_rows_tokens_do_not_depend_on_its_batch_companions(gpt2_pair, draft):
    """seed=s gives every row default_rng(s): alone or among other prompts, a prompt gets the same tokens."""
    target, model_draft = gpt2_pair
    d = model_draft if draft == "model" else "ngram"
    prompt = PROMPTS[2]
    for seed in range(3):
        alone = speculative_sample(target, d, prompt, 20, K=3, temperature=1.0, seed=seed).tokens
        for companions in ([PROMPTS[0]], [PROMPTS[1], PROMPTS[3], PROMPTS[0]]):
            outs = speculative_sample_batch(target, d, [*companions, prompt], 20, K=3, temperature=1.0, seed=seed)
            assert outs[-1].tokens == alone, f"seed {seed}, companions {companions}"
        auto = autoregressive_sample(target, prompt, 12, temperature=1.0, seed=seed).tokens
        outs = autoregressive_sample_batch(target, [PROMPTS[0], prompt], 12, temperature=1.0, seed=seed)
        assert outs[1].tokens == auto
    # Block verification (each row's chain judged jointly) keeps rows independent too.
    alone = speculative_sample(target, d, prompt, 20, K=3, temperature=1.0, seed=7, verification="block")
    outs = speculative_sample_batch(
        target, d, [PROMPTS[0], prompt], 20, K=3, temperature=1.0, seed=7, verification="block"
    )
    assert outs[1].tokens == alone.tokens and outs[1].accepted_per_round == alone.accepted_per_round
    # Different seeds per row: a list.
    outs = speculative_sample_batch(target, d, [prompt, prompt], 20, K=3, temperature=1.0, seed=[0, 1])
    assert outs[0].tokens == speculative_sample(target, d, prompt, 20, K=3, temperature=1.0, seed=0).tokens
    assert outs[1].tokens == speculative_sample(target, d, prompt, 20, K=3, temperature=1.0, seed=1).tokens


# --- exactness per row ---------------------------------------------------------------------------

CHI_PROMPTS = [[1, 2], [4], [0, 5, 3]]  # a 6-token vocabulary (helpers.SMALL): every 3-token continuation enumerable


@pytest.fixture(scope="module")
def chi_models():
    target = small_model(seed=10)
    return target, perturbed(target, 0.15, seed=1)


@pytest.fixture(scope="module")
def chi_exact(chi_models):
    return [exact_continuations(chi_models[0], p, 3, SamplingParams(1.0)) for p in CHI_PROMPTS]


def shared_counter(row, n_past, n_accepted, _last=[0]):  # noqa: B006 (the shared counter is the bug)
    """BROKEN: every row rolls back by the acceptance of the row verified before it (one counter for the batch)."""
    shared, _last[0] = _last[0], n_accepted
    row.cache.rollback(n_past + 1 + min(shared, row.cache.length - n_past - 1))


def mixed_rows(proposal, logits, params, rng, acceptance="exact", verification="token", _last=[None]):  # noqa: B006
    """BROKEN: each row is verified against the logits (p, and so the residual) of the row verified before it."""
    other, _last[0] = _last[0], logits
    return verify(
        proposal,
        other if other is not None and other.shape == logits.shape else logits,
        params,
        rng,
        acceptance,
        verification,
    )


def batch_samples(models, n_calls: int) -> list[list[tuple]]:
    """[row][call] the 3 tokens row b got in each of n_calls batch calls, fresh seeds per row and call."""
    target, draft = models
    rows = [[] for _ in CHI_PROMPTS]
    for i in range(n_calls):
        outs = speculative_sample_batch(
            target,
            draft,
            CHI_PROMPTS,
            3,
            K=2,
            temperature=1.0,
            seed=[i * len(CHI_PROMPTS) + b for b in range(len(CHI_PROMPTS))],
        )
        for b, out in enumerate(outs):
            rows[b].append(tuple(out.tokens))
    return rows


def check_rows(models, exact, n_calls, broken: dict, monkeypatch):
    """Every row passes the chi-square check; with each broken variant patched in, some row fails it."""
    for b, samples in enumerate(batch_samples(models, n_calls)):
        ok, stat, df = chi_square_passes(samples, exact[b])
        assert ok, f"row {b}: chi2={stat:.1f} df={df}"
    for (name, value), n_broken in broken.items():
        with monkeypatch.context() as patch:
            patch.setattr(round_step, name, value)
            samples = batch_samples(models, n_broken)
        failed = [not chi_square_passes(rows, exact[b])[0] for b, rows in enumerate(samples)]
        assert any(failed), f"the broken batch ({value.__name__}) passed the per-row check"


def test_every_row_follows_its_own_target_distribution_quick(chi_models, chi_exact, monkeypatch):
    # Few samples (the default suite stays fast): rows mixing their p fail at this size already.
    check_rows(chi_models, chi_exact, 400, {("verify", mixed_rows): 250}, monkeypatch)


@pytest.mark.slow
def test_every_row_follows_its_own_target_distribution(chi_models, chi_exact, monkeypatch):
    broken = {("verify", mixed_rows): N_BROKEN, ("keep_accepted", shared_counter): N_BROKEN}
    check_rows(chi_models, chi_exact, N_SAMPLES, broken, monkeypatch)


def test_an_rng_gives_each_row_its_own_stream(gpt2_pair):
    target, _ = gpt2_pair
    outs = autoregressive_sample_batch(target, [[3], [3]], 10, temperature=1.0, rng=np.random.default_rng(0))
    again = autoregressive_sample_batch(target, [[3], [3]], 10, temperature=1.0, rng=np.random.default_rng(0))
    assert [o.tokens for o in outs] == [o.tokens for o in again] and outs[0].tokens != outs[1].tokens
    with pytest.raises(ValueError, match="either seed or rng"):
        autoregressive_sample_batch(target, [[3]], 2, seed=0, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="one seed per prompt"):
        autoregressive_sample_batch(target, [[3]], 2, seed=[0, 1])


# --- the command line ------------------------------------------------------------------------------


def test_cli_batch_decodes_the_first_n_lines_together(tmp_path, capsys):
    import json

    from specdec.cli import main

    path = tmp_path / "prompts.txt"
    path.write_text("def parse(line):\n\n   \nimport os\nclass Point:\n")
    argv = [
        "--target_model_size",
        "stdlib-6L",
        "--draft",
        "ngram",
        "--prompt_file",
        str(path),
        "--batch",
        "2",
        "--n_tokens_to_generate",
        "8",
        "--repeats",
        "1",
    ]
    assert main.main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [row["prompt"] for row in out["rows"]] == ["def parse(line):", "import os"]  # blank lines skipped
    for row in out["rows"]:
        assert (
            row["speculative"]["tokens"] == row["autoregressive"]["tokens"] and len(row["speculative"]["tokens"]) == 8
        )
    assert out["speedup"] > 0 and out["settings"]["batch"] == 2
    assert main.main(argv) == 0
    text = capsys.readouterr().out
    assert "── row 2: 'import os'" in text and "identical to autoregressive: yes" in text and "tokens/s" in text


@pytest.mark.parametrize(
    "extra,why",
    [
        ([], "give the file"),
        (["--prompt_file", "FILE", "--batch", "5"], "has 3 non-empty lines; --batch 5 needs 5"),
        (["--prompt_file", "FILE", "--tree", "4"], "leave out --tree"),
        (["--prompt_file", "FILE", "--prompt", "x"], "--batch reads its prompts from --prompt_file"),
        (["--prompt_file", "FILE", "--batch", "0"], "--batch must be"),
    ],
)
def test_cli_batch_refusals_are_one_line(extra, why, tmp_path, capsys):
    from specdec.cli import main

    path = tmp_path / "prompts.txt"
    path.write_text("a\nb\n\nc\n")
    argv = ["--target_model_size", "stdlib-6L", "--draft", "ngram"] + [str(path) if a == "FILE" else a for a in extra]
    argv += [] if "--batch" in extra else ["--batch", "2"]
    with pytest.raises(SystemExit) as exit_:
        main.parse_args(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and why in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("how", ["cli", "api"])
def test_a_batch_too_large_for_the_memory_free_is_one_line_before_any_row_is_made(how, tmp_path, capsys, monkeypatch):
    """--batch N is checked against the memory free now before a single prompt is tokenized or a cache made
    (the machine's memory is set small here: 400 rows of stdlib-6L's 6 KB per position, at least 64 positions
    each, need 157 MB)."""
    import specdec.batch as batch
    from specdec.cli import main
    from specdec.model import attention as cache

    monkeypatch.setattr(cache, "memory_available", lambda: 100_000_000)
    monkeypatch.setattr(batch, "setup", lambda *a, **k: pytest.fail("a row was made"))
    monkeypatch.setattr(main, "checked_request", lambda *a, **k: pytest.fail("a prompt was tokenized"))
    path = tmp_path / "prompts.txt"
    path.write_text("import os\n" * 400)
    if how == "cli":
        argv = ["--target_model_size", "stdlib-6L", "--draft", "stdlib-2L", "--prompt_file", str(path)]
        argv += ["--batch", "400", "--n_tokens_to_generate", "8", "--repeats", "1"]
        assert main.main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "--batch 400: 400 rows need at least 0.2 GB" in err, err
    else:
        target = tiny_model(seed=1)  # 512 bytes per position: 400 rows need 13 MB
        monkeypatch.setattr(cache, "memory_available", lambda: 10_000_000)
        with pytest.raises(ValueError, match="400 prompts decoded together: 400 rows need at least"):
            speculative_sample_batch(target, perturbed(target, 0.05, seed=3), [[5, 6]] * 400, 8)
        monkeypatch.setattr(cache, "memory_available", lambda: 20_000_000)
        batch.check_batch_memory(target, 400, 8, "the same rows fit a larger machine")
