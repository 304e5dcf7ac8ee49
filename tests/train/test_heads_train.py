"""Training heads on distillation shards (specdec/train/heads_train.py), on a tiny random chat Llama:
labels, the held-out split, batches that line up with the data, the masked loss's gradient against
finite differences, and a whole run whose head loads, drafts, and leaves greedy output unchanged."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from specdec.autoregressive import autoregressive_sample
from specdec.drafters import eagle
from specdec.drafters.heads import DraftVocab, load_heads
from specdec.speculative import speculative_sample
from specdec.train import heads_train as ht
from specdec.train import rows as tr
from specdec.train import ship
from specdec.train.cli import main
from specdec.train.distill import make_data
from specdec.train.shards import load_distill_data
from specdec.train.features import hidden_states

from test_distill import POOL, SETTINGS, chat_model


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("distill")
    model = chat_model(scale=1.0)  # peaked enough that its replies have patterns a head can learn
    make_data(model, folder, 400, POOL, **{**SETTINGS, "max_reply": 24, "greedy_frac": 0.75})
    return model, folder


def test_soft_targets_renormalise_the_top_k_and_drop_mass_outside_the_vocabulary():
    vocab = DraftVocab(np.array([1, 4, 7]), np.zeros((3, 2), np.float32), 10)
    ids = np.array([[4, 1, 9], [7, 4, 1]])
    probs = np.array([[0.4, 0.2, 0.2], [0.5, 0.3, 0.2]], np.float32)
    p = tr.soft_targets(ids, probs, vocab)
    np.testing.assert_allclose(p, [[0.25, 0.5, 0.0], [0.2, 0.3, 0.5]], atol=1e-7)  # token 9 is outside: 0.25 lost


def test_held_out_rows_keep_every_row_of_a_request_on_one_side(shards):
    model, folder = shards
    data = load_distill_data(folder, model)
    held = tr.held_out_rows(data, 0.5)
    for text in set(data.request_text):
        sides = {bool(h) for h, t in zip(held, data.request_text) if t == text}
        assert len(sides) == 1
    assert held.any() and not held.all()
    assert not tr.held_out_rows(data, 1e-9).any()


def test_batches_cover_every_row_once_within_the_budget_and_line_up_with_the_data(shards):
    model, folder = shards
    data = load_distill_data(folder, model)
    rows = list(range(len(data.replies)))
    groups = tr.row_batches(data, rows, 64, np.random.default_rng(0))
    assert sorted(r for g in groups for r in g) == rows
    for g in groups:
        longest = max(len(data.prompts[r]) + len(data.replies[r]) for r in g)
        assert len(g) == 1 or longest * len(g) <= 64
    states = ht.row_states(model, data, rows, [model.hparams.n_layer], progress=False)
    vocab = DraftVocab.of(model, np.arange(0, model.n_vocab, 2))
    batch = tr.make_batch(data, groups[0], states, vocab)
    b, t = np.nonzero(batch.label_mask)
    np.testing.assert_array_equal(batch.next_ids, batch.tokens[b, t + 1])  # label at t describes token t + 1
    for i, r in enumerate(groups[0]):
        n_prompt, n_reply = len(data.prompts[r]), len(data.replies[r])
        np.testing.assert_array_equal(
            np.nonzero(batch.label_mask[i])[0], np.arange(n_prompt - 1, n_prompt + n_reply - 1)
        )
        ref = dict(hidden_states(model, data, [model.hparams.n_layer], [r]))[r]
        np.testing.assert_allclose(batch.states[:, i, : n_prompt + n_reply - 1], ref, atol=2e-3)  # float16 kept
    first = np.concatenate([data.top_ids[r] for r in groups[0]])
    assert batch.p.shape == (len(first), len(vocab.ids))
    assert np.all(batch.p.sum(axis=1) <= 1 + 1e-5)


def test_cached_states_are_the_computed_ones_and_a_tampered_cache_is_made_again(shards, tmp_path):
    model, folder = shards
    data = load_distill_data(folder, model)
    rows, layers = [0, 2, 3], [1, model.hparams.n_layer]
    fresh = ht.row_states(model, data, rows, layers, progress=False)
    first = ht.row_states(model, data, rows, layers, progress=False, cache=tmp_path)  # computes and keeps
    files = sorted(tmp_path.glob("states-L*.npy"))
    assert len(files) == 2
    for r in rows:
        np.testing.assert_allclose(first[r], fresh[r], rtol=4e-3, atol=4e-3)  # batched with other rows
    again = ht.row_states(model, data, [3], [model.hparams.n_layer], progress=False, cache=tmp_path)  # read back
    np.testing.assert_array_equal(again[3][0], first[3][1])  # the very values kept
    flat = np.load(files[0])
    flat[0, 0] += 1
    np.save(files[0], flat)  # edited after it was recorded: its sha256 no longer matches
    stamp = files[0].stat().st_mtime_ns
    ht.row_states(model, data, rows, layers, progress=False, cache=tmp_path)
    assert files[0].stat().st_mtime_ns != stamp  # made again, not trusted
    redone = ht.row_states(model, data, rows, layers, progress=False, cache=tmp_path)
    for r in rows:
        np.testing.assert_allclose(redone[r], fresh[r], rtol=4e-3, atol=4e-3)


def test_when_the_data_grows_only_the_new_rows_states_are_computed(shards, tmp_path, monkeypatch):
    from specdec.train import states as states_module

    model, folder = shards
    data = load_distill_data(folder, model)
    n, layers = len(data.replies), [1, model.hparams.n_layer]
    computed: list[int] = []

    def counting(target, data, layers, rows, batch=8):
        computed.extend(rows)
        yield from hidden_states(target, data, layers, rows, batch)

    monkeypatch.setattr(states_module, "hidden_states", counting)
    first = ht.row_states(model, data, list(range(n // 2)), layers, progress=False, cache=tmp_path)  # a smaller run
    computed.clear()
    grown = ht.row_states(model, data, list(range(n)), layers, progress=False, cache=tmp_path)
    assert sorted(computed) == list(range(n // 2, n)), "the rows the earlier cache held are read, not computed"
    for r in range(n // 2):
        np.testing.assert_array_equal(grown[r], first[r])
    fresh = ht.row_states(model, data, list(range(n)), layers, progress=False)
    for r in range(n):
        np.testing.assert_allclose(grown[r], fresh[r], rtol=4e-3, atol=4e-3)

    computed.clear()
    fewer = ht.row_states(model, data, [1, n // 2 + 1], layers, progress=False, cache=tmp_path)  # a smaller run again
    assert computed == [], "a cache of more rows of the same data serves fewer rows"
    for r in (1, n // 2 + 1):
        np.testing.assert_array_equal(fewer[r], grown[r])
    assert len(list(tmp_path.glob("states-*.npy"))) == 2 * len(layers), "nothing more is written"

    for path in tmp_path.glob("states-*.npy"):
        flat = np.load(path)
        flat[0, 0] += 1
        np.save(path, flat)
    ht.row_states(model, data, list(range(n)), layers, progress=False, cache=tmp_path)
    assert sorted(computed) == list(range(n)), "a cache whose sha256 no longer matches is made again, all of it"


def test_the_masked_eagle_loss_has_the_gradient_of_finite_differences(shards):
    model, folder = shards
    data = load_distill_data(folder, model)
    rows = [0, 1, 2]
    states = ht.row_states(model, data, rows, [model.hparams.n_layer], progress=False)
    vocab = DraftVocab.of(model, np.arange(0, model.n_vocab, 3))
    vocab = DraftVocab(vocab.ids, vocab.w.astype(np.float64), vocab.n_vocab)  # float64 for the differences
    batch = tr.make_batch(data, rows, states, vocab)
    batch.states = batch.states.astype(np.float64)
    kind = ht.KINDS["eagle"]
    config = kind.config(model, {})
    params = {k: v.astype(np.float64) for k, v in kind.init_params(model, config, np.random.default_rng(1)).items()}
    params = {k: v + 0.05 * np.random.default_rng(2).standard_normal(v.shape) for k, v in params.items()}
    _, _, grads = kind.loss_and_grads(params, model, config, vocab, batch)
    rng = np.random.default_rng(3)
    for name in ("fc.weight", "attn.c_attn.weight", "mlp.c_proj.bias", "ln_2.weight"):
        for _ in range(3):
            at = tuple(rng.integers(0, s) for s in params[name].shape)
            old = params[name][at]
            params[name][at] = old + 1e-5
            up = kind.loss_and_grads(params, model, config, vocab, batch)[0]
            params[name][at] = old - 1e-5
            down = kind.loss_and_grads(params, model, config, vocab, batch)[0]
            params[name][at] = old
            assert abs((up - down) / 2e-5 - grads[name][at]) <= 1e-6 + 1e-4 * abs(grads[name][at]), name


def test_a_trained_head_loads_drafts_and_keeps_greedy_output(shards, tmp_path, capsys, monkeypatch):
    model, folder = shards
    import specdec.checkpoints.load as load

    monkeypatch.setattr(load, "load_model", lambda name, progress=True: model)
    out = tmp_path / "head"
    args = [
        "eagle",
        "--model",
        "tiny",
        "--data",
        str(folder),
        "--out",
        str(out),
        "--vocab-top",
        "100",
        "--epochs",
        "30",
        "--batch-tokens",
        "256",
        "--held-out",
        "0.3",
        "--lr",
        "3e-3",
        "--quiet",
    ]
    assert main(args) == 0
    err = capsys.readouterr().err + capsys.readouterr().out
    import json

    card = json.loads((out / "heads.json").read_text())
    assert card["data"]["rows_held_out"] > 0 and card["draft_vocab"] == 100
    assert set(card["held_out"]["trained"]) == {"top1", "top5", "positions", "top1_by_position"}
    # A random model's replies are too few to generalise from; the rows it trained on it must have learned.
    data = load_distill_data(folder, model)
    rows = [r for r in range(len(data.replies)) if not tr.held_out_rows(data, 0.3)[r]]
    kind = ht.KINDS["eagle"]
    config, params, vocab = load_heads(out, "eagle", model, eagle.param_shapes)
    states = ht.row_states(model, data, rows, kind.layers(model), progress=False)
    trained = tr.held_out_accuracy(kind, params, model, config, vocab, data, rows, states, 256)
    untrained = tr.held_out_accuracy(
        kind, kind.init_params(model, config, np.random.default_rng(0)), model, config, vocab, data, rows, states, 256
    )
    assert trained["top1"] > untrained["top1"] + 0.2, err
    prompt = model.tokenizer.encode("Hi there")
    ar = autoregressive_sample(model, prompt, 20, temperature=0.0)
    sd = speculative_sample(model, f"eagle:{out}", prompt, 20, K=3, temperature=0.0)
    assert sd.tokens == ar.tokens
    assert main([*args[:-1], "--resume", "--quiet"]) == 0  # a finished run resumes to the same end

    # Shipped: float16 weights (ids kept exact), checked on the way in and out, with a card.
    shipped = tmp_path / "shipped"
    assert main(["ship", "--model", "tiny", "--head", str(out), "--out", str(shipped)]) == 0
    half = next(shipped.glob("heads-*.safetensors")).stat().st_size
    assert half < 0.6 * next(out.glob("heads-*.safetensors")).stat().st_size
    _, half_params, half_vocab = load_heads(shipped, "eagle", model, eagle.param_shapes)
    np.testing.assert_array_equal(half_vocab.ids, vocab.ids)
    np.testing.assert_allclose(half_params["fc.weight"], params["fc.weight"], rtol=1e-3, atol=1e-4)
    assert "held-out teacher-forced top-1" in (shipped / "CARD.txt").read_text()
    assert shipped.stat().st_mode & 0o777 == 0o755 and {p.stat().st_mode & 0o777 for p in shipped.iterdir()} == {0o644}
    sd = speculative_sample(model, f"eagle:{shipped}", prompt, 20, K=3, temperature=0.0)
    assert sd.tokens == ar.tokens
    monkeypatch.setattr(ship, "SHIP_LIMIT", 1000)
    assert main(["ship", "--model", "tiny", "--head", str(out), "--out", str(tmp_path / "big")]) == 2
    assert "over the" in capsys.readouterr().err
    assert not (tmp_path / "big").exists() and not list(tmp_path.glob(".big.*"))  # nothing left half-made


def test_init_starts_a_run_from_an_earlier_runs_weights_and_refuses_another_kind_of_run(
    shards, tmp_path, capsys, monkeypatch
):
    import json

    import specdec.checkpoints.load as load

    model, folder = shards
    monkeypatch.setattr(load, "load_model", lambda name, progress=True: model)
    base = [
        "eagle",
        "--model",
        "tiny",
        "--data",
        str(folder),
        "--vocab-top",
        "100",
        "--batch-tokens",
        "256",
        "--held-out",
        "0.3",
        "--quiet",
    ]
    first, second, fresh = tmp_path / "first", tmp_path / "second", tmp_path / "fresh"
    assert main([*base, "--out", str(first), "--steps", "4", "--lr", "3e-3"]) == 0
    # A near-zero learning rate: a run started from `first` ends where `first` ended, a fresh one does not.
    assert main([*base, "--out", str(second), "--steps", "1", "--lr", "1e-12", "--init", str(first / ".")]) == 0
    assert main([*base, "--out", str(fresh), "--steps", "1", "--lr", "1e-12"]) == 0
    weights = {
        run: load_heads(run, "eagle", model, eagle.param_shapes)[1]["fc.weight"] for run in (first, second, fresh)
    }
    np.testing.assert_allclose(weights[second], weights[first], atol=1e-6)
    assert np.abs(weights[fresh] - weights[first]).max() > 1e-3
    card = json.loads((second / "heads.json").read_text())
    assert card["init"]["folder"] == "first" and card["init"]["step"] == 4
    assert card["init"]["top1_top5"]["top1"] == pytest.approx(card["held_out"]["trained"]["top1"], abs=1e-6)
    assert card["held_out"]["untrained"]["top1"] < card["init"]["top1_top5"]["top1"], "untrained means untrained"
    # Resumed (here: a finished run resumed to a later step), a run started with --init still says where it began.
    assert main([*base, "--out", str(second), "--steps", "2", "--lr", "1e-12", "--resume"]) == 0
    resumed = json.loads((second / "heads.json").read_text())
    assert resumed["init"]["folder"] == "first" and resumed["init"]["step"] == 4
    assert main(["ship", "--model", "tiny", "--head", str(second), "--out", str(tmp_path / "shipped")]) == 0
    assert "started from: first (step 4" in (tmp_path / "shipped" / "CARD.txt").read_text()

    capsys.readouterr()
    (tmp_path / "empty").mkdir()
    damaged = tmp_path / "damaged"
    shutil.copytree(first, damaged)
    weights_file = next(damaged.glob("checkpoint-*.safetensors"))
    weights_file.write_bytes(weights_file.read_bytes()[:-8] + bytes(8))
    for extra, message in (
        (["--init", str(tmp_path / "empty")], "no checkpoint in"),
        (["--init", str(first), "--held-out", "0.2"], "differs from this one in held_out"),
        (["--init", str(first), "--block", "llama"], "differs from this one in"),
        (["--init", str(damaged)], "sha256"),
        (["--init", str(first), "--resume"], "not both"),
    ):
        out = tmp_path / f"refused-{len(list(tmp_path.iterdir()))}"
        args = [*base, *extra] if "--held-out" not in extra else [*base[:-3], *extra, "--quiet"]
        assert main([*args, "--out", str(out), "--steps", "1"]) == 2, extra
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, err
        assert not out.exists(), "a refused --init leaves no --out folder behind"
    before = sorted(p.name for p in first.iterdir())
    assert main([*base, "--out", str(first), "--steps", "1", "--init", str(first / ".")]) == 2  # the same folder
    err = capsys.readouterr().err
    assert "is the --out folder itself" in err and err.count("\n") == 1, err
    assert sorted(p.name for p in first.iterdir()) == before, "the earlier run's checkpoint is left as it was"


def test_cli_refuses_mixed_or_wrong_flags_in_one_line(shards, tmp_path, capsys):
    model, folder = shards
    for bad, message in (
        (["eagle", "--model", "x", "--out", str(tmp_path), "--data", str(folder), "--tokens", "5"], "not both"),
        (["eagle", "--model", "x", "--out", str(tmp_path)], "either --tokens"),
        (["medusa", "--model", "x", "--out", str(tmp_path), "--data", str(folder)], "--data trains EAGLE"),
        (
            ["eagle", "--model", "x", "--out", str(tmp_path), "--tokens", "5", "--epochs", "2"],
            "only applies with --data",
        ),
        # the distilled draft's own flags (train/draft_model.py)
        (
            ["eagle", "--model", "x", "--out", str(tmp_path), "--data", str(folder), "--n-ff", "8"],
            "--n-ff only applies to draft",
        ),  # the flag as it is spelled
        (
            ["eagle", "--model", "x", "--out", str(tmp_path), "--data", str(folder), "--loss", "tvd"],
            "only applies to draft",
        ),
        (
            ["draft", "--model", "x", "--out", str(tmp_path), "--data", str(folder), "--block", "llama"],
            "only applies to eagle",
        ),
        (
            ["draft", "--model", "x", "--out", str(tmp_path), "--data", str(folder), "--layers", "0,a"],
            "separated by commas",
        ),
        (["draft", "--model", "x", "--out", str(tmp_path), "--tokens", "5"], "train on distillation shards"),
        (["eagle", "--model", "x", "--out", str(tmp_path), "--tokens", "5", "--init", "x"], "only applies with --data"),
        (
            ["eagle", "--model", "x", "--out", str(tmp_path), "--tokens", "5", "--init-head", "x"],
            "--init-head only applies with --data",
        ),  # the flag as it is spelled, not its dest
    ):
        with pytest.raises(SystemExit) as e:
            main(bad)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
