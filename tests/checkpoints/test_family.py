"""The shipped stdlib family (specdec/checkpoints/family.py and weights/): it loads by name offline,
its tokenizer is a real BPE, its F16 files give the logits torch gives, and it is trained:
its drafters are accepted far more often than untrained ones (tests/fixtures/train_family.py)."""

import dataclasses
import json
import sysconfig
from pathlib import Path

import numpy as np
import pytest

import specdec
from specdec.checkpoints import family, registry
from specdec.costmodel import drafts_judged
from specdec.model.gpt2 import GPT2, random_weights

REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "family_reference.npz"
NAMES = [name for name, card in registry.MODELS.items() if card.tokenizer == "stdlib"]  # the family's rows


@pytest.fixture(scope="module")
def target() -> GPT2:
    return specdec.load_model(family.TARGET)


@pytest.fixture(scope="module")
def draft() -> GPT2:
    return specdec.load_model(family.DRAFT)


def test_names_load_offline_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no models/ folder here: the files come from the package
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: any download attempt fails
    card = family.card()["models"]
    assert sorted(NAMES) == sorted(card) == sorted([family.TARGET, family.DRAFT])  # the registry's rows: the family
    for name in NAMES:
        model = specdec.load_model(name)
        h = model.hparams
        assert (h.n_layer, h.n_embd, h.n_head, h.n_ctx, h.n_vocab) == (
            card[name]["n_layer"],
            card[name]["n_embd"],
            card[name]["n_head"],
            card[name]["n_ctx"],
            4096,
        )
        assert model.tokenizer.n_vocab == h.n_vocab


def test_files_are_gpt2_checkpoints_in_f16_within_budget():
    own = [registry.shipped_folder(name) for name in NAMES] + list(family.WEIGHTS_DIR.glob("*.json"))
    total = sum(p.stat().st_size for path in own for p in [path, *path.rglob("*")] if p.is_file())  # not the heads
    assert total <= 10_000_000, f"the shipped family is {total} bytes; the budget is 10 MB"
    for name in NAMES:
        folder = registry.shipped_folder(name)
        files = sorted(p.name for p in folder.iterdir())
        assert files == ["config.json", "merges.txt", "model.safetensors", "vocab.json"]
        raw = (folder / "model.safetensors").read_bytes()
        header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        assert all(k.startswith("transformer.") for k in tensors)  # the Hub's key scheme
        assert {v["dtype"] for v in tensors.values()} == {"F16"}
    # One tokenizer for the family: draft and target must agree on every id.
    for f in ("vocab.json", "merges.txt"):
        target, draft = (registry.shipped_folder(name) / f for name in (family.TARGET, family.DRAFT))
        assert target.read_bytes() == draft.read_bytes()


def held_out_sources() -> list[str]:
    """Held-out files of this machine's stdlib (the training split), else the shipped held-out prompts."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if family.is_held_out(rel) and not rel.startswith("site-packages/") and len(texts) < 20:
            try:
                texts.append(path.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, OSError):
                pass
    return texts or [p["text"] for p in family.prompts()]


def test_tokenizer_round_trip_and_compression_on_held_out_source(target):
    enc = target.tokenizer
    assert enc.eot_token == target.n_vocab - 1  # <|endoftext|> is the last id, as in GPT-2
    texts = held_out_sources()
    n_bytes = n_tokens = 0
    for text in texts:
        ids = enc.encode_ordinary(text)
        assert enc.decode(ids) == text
        n_bytes, n_tokens = n_bytes + len(text.encode()), n_tokens + len(ids)
    # A vocabulary whose merges were ignored (bytes only) would give 1 byte per token; the trained BPE
    # gives about 3.4 on the training files.
    assert n_bytes / n_tokens > 2.8, n_bytes / n_tokens


def test_f16_logits_match_torch_on_the_shipped_files(target, draft):
    ref = np.load(REFERENCE, allow_pickle=False)
    tokens, rows = ref["tokens"].tolist(), ref["rows"]
    assert target.tokenizer.decode(tokens) == str(ref["text"])
    for model, key in ((target, f"logits_{family.TARGET}"), (draft, f"logits_{family.DRAFT}")):
        logits = model.forward(tokens, model.new_cache())  # [n_seq, n_vocab]
        assert logits.dtype == np.float32
        np.testing.assert_allclose(logits[rows], ref[key], rtol=0, atol=2e-4, err_msg=key)
    assert int(ref["early_exit_layer"]) == family.EARLY_EXIT_LAYER
    early = target.forward(tokens, target.new_cache(), n_layer=family.EARLY_EXIT_LAYER)
    np.testing.assert_allclose(early[rows], ref["early_exit_logits"], rtol=0, atol=2e-4)


N_PROMPTS, N_TOKENS, K = 6, 20, 4


@pytest.fixture(scope="module")
def prompts_and_greedy(target) -> list[tuple[list[int], list[int]]]:
    """(held-out prompt ids, the target's greedy continuation) for the acceptance test."""
    prompts = [target.tokenizer.encode(p["text"]) for p in family.prompts()[:N_PROMPTS]]
    return [(ids, specdec.autoregressive_sample(target, ids, N_TOKENS).tokens) for ids in prompts]


def greedy_alpha(target: GPT2, drafter, prompts_and_greedy) -> float:
    """Accepted / judged drafts over held-out prompts at temperature 0 (deterministic)."""
    accepted = judged = 0
    for ids, greedy in prompts_and_greedy:
        out = specdec.speculative_sample(target, drafter, ids, N_TOKENS, K=K, temperature=0.0)
        assert out.tokens == greedy  # whatever the drafter, greedy speculative decoding is the target's greedy
        accepted += out.accepted
        judged += sum(drafts_judged(k, n) for k, n in zip(out.k_per_round, out.accepted_per_round) if k > 0)
    return accepted / judged


def test_trained_drafters_are_accepted_far_more_often_than_untrained_ones(target, draft, prompts_and_greedy):
    untrained = GPT2(draft.hparams, random_weights(draft.hparams, seed=0), draft.tokenizer, name="untrained")
    perm = np.random.default_rng(0).permutation(draft.n_vocab)  # token ids scrambled, as a wiring bug would
    shuffled_weights = dataclasses.replace(draft.weights, wte=draft.weights.wte[perm], lm_head=None)
    shuffled = GPT2(draft.hparams, shuffled_weights, draft.tokenizer, name="shuffled")
    alphas = {
        "draft": greedy_alpha(target, draft, prompts_and_greedy),
        "early_exit": greedy_alpha(target, f"early_exit:{family.EARLY_EXIT_LAYER}", prompts_and_greedy),
        "untrained": greedy_alpha(target, untrained, prompts_and_greedy),
        "shuffled": greedy_alpha(target, shuffled, prompts_and_greedy),
    }
    # Measured on the shipped files: draft 0.76, early exit 0.95, untrained 0.00, shuffled 0.00.
    # (Greedy text from models this small loops, which is easy to predict: see the README's table at T=1.)
    assert alphas["untrained"] < 0.1 and alphas["shuffled"] < 0.1, alphas
    assert alphas["draft"] > 0.6 and alphas["draft"] > alphas["untrained"] + 0.5, alphas
    assert alphas["early_exit"] > 0.75 and alphas["early_exit"] > alphas["untrained"] + 0.5, alphas


def test_family_bench_runs_and_reports_every_drafter_at_both_temperatures():
    from specdec.bench import family as family_bench

    res = family_bench.main(["--prompts", "2", "--tokens", "8", "--repeats", "1", "--no-gpt2"])
    rows = {(r["drafter"], r["T"]): r for r in res["family"]}
    assert set(rows) == {(d, t) for d in ("draft model stdlib-2L", "early_exit:2", "ngram") for t in (0.0, 1.0)}
    for r in rows.values():
        assert 1 <= r["tau"] <= 5 and r["speedup"] > 0 and r["c"] > 0
    assert rows[("early_exit:2", 0.0)]["alpha"] > 0.5


def test_main_help_lists_the_family():
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, str(root / "main.py"), "--help"], capture_output=True, text=True, cwd=root)
    assert out.returncode == 0 and all(name in out.stdout for name in NAMES), out.stdout
