"""The timing harness: measured costs, and the race report with its text and JSON forms."""

import json
import math

import numpy as np
import pytest
from conftest import tiny_model
from helpers import perturbed

from specdec import timing
from specdec.race import race
from specdec.timing import measure_costs, time_calls, verify_curve


@pytest.fixture(scope="module")
def models():
    target = tiny_model(seed=1)
    return target, perturbed(target, 0.05, seed=4)


def test_measure_costs(models):
    target, draft = models
    costs = measure_costs(target, draft, [1, 2, 3], m_max=5, repeats=2)
    assert len(costs.r) == 5 and costs.r[0] == 1.0 and costs.c > 0
    # The n-gram drafter has no model step; its cost is the lookup itself.
    ngram = measure_costs(target, "ngram", [1, 2, 1, 2], m_max=3, repeats=2)
    assert len(ngram.r) == 3 and ngram.draft_step > 0
    early = measure_costs(target, "early_exit:1", [1, 2, 1, 2], m_max=3, repeats=2)
    assert early.draft_step > 0
    assert measure_costs(target, None, [1, 2], m_max=2, repeats=1).draft_step == 0.0


def test_time_calls_interleaves_and_ratios_are_within_repeats():
    order = []
    times = time_calls({1: lambda: order.append(1), 2: lambda: order.append(2)}, repeats=5, after=None)
    assert len(times[1]) == len(times[2]) == 5 and len(order) == 12  # a warm-up call each, then 5 repeats
    assert all(sorted(order[i : i + 2]) == [1, 2] for i in range(2, 12, 2))  # each repeat times each call once
    assert verify_curve({1: [1.0, 2.0], 2: [3.0, 2.0]}) == [1.0, 2.0]  # median of 3/1 and 2/2


def test_race_report(models):
    target, draft = models
    report = race(target, draft, [1, 2, 3], 20, K=3, repeats=2)
    assert len(report.autoregressive) == len(report.speculative) == 2
    assert report.texts_identical and report.first_difference() is None
    spec = report.spec
    assert 0 < spec.draft_seconds + spec.verify_seconds <= spec.seconds
    explained = report.explain()
    assert explained["measured_speedup"] == pytest.approx(report.speedup)
    assert 0 <= explained["alpha"] <= 1 and explained["alpha"] >= spec.result.accepted / spec.result.drafted
    assert math.isfinite(explained["predicted_speedup"])
    out = spec.result
    assert explained["predicted_speedup_from_rounds"] == pytest.approx(
        len(out.tokens) / (out.draft_calls * report.costs.c + sum(report.costs.r[k] for k in out.k_per_round))
    )
    assert "...from this run's own rounds" in str(report)
    data = json.loads(json.dumps(report.to_dict(), allow_nan=False))
    assert data["speculative"]["tokens"] == data["autoregressive"]["tokens"] and data["settings"]["K"] == 3
    text = str(report)
    assert "── summary" in text and text.split("identical text at temperature 0")[1].split()[0] == "yes"


def test_race_streams_with_the_samplers_callback_and_names_each_decoder(models):
    target, _ = models
    events = []
    report = race(
        target,
        "ngram",
        [1, 2, 1, 2],
        8,
        K="adaptive",
        decoders=("speculative",),
        warmup=False,
        on_token=lambda token, kind: events.append((token, kind)),
        on_decoder=events.append,
    )
    assert events[0] == "speculative" and [t for t, _ in events[1:]] == report.spec.result.tokens
    assert report.ar is None and "autoregressive" not in report.to_dict()


def test_race_first_difference_and_noise_warning(models):
    target, draft = models
    report = race(target, draft, [1, 2, 3], 6, K=2, warmup=False, repeats=1)
    report.costs.note = ""  # (a note on re-measured costs is not the warning looked for here)
    report.speculative[0].result.tokens[3] += 1  # as if a float32 near-tie went the other way
    assert report.first_difference() == 3 and "from new token 3" in str(report)
    predicted = report.explain()["predicted_speedup_from_rounds"]  # the headline's prediction
    report.autoregressive[0].seconds = report.speculative[0].seconds * predicted  # measured == predicted
    assert "NOTE" not in str(report)
    report.autoregressive[0].seconds /= 3  # a burst of noise in one run: measured a third of predicted
    assert "differ by more than 1.5x" in str(report)
    report.autoregressive[0].seconds *= 9  # three times predicted: more than the passes allow, said in the verdict
    assert report.verdict == "noise" and "more than these passes allow" in str(report)


def test_race_checks_the_request_before_measuring(models):
    target, draft = models
    for kwargs, message in [
        (dict(K=0), "K"),
        (dict(K="fast"), "adaptive"),
        (dict(k_max=40), "k_max"),
        (dict(repeats=0), "repeats"),
        (dict(decoders=("beam",)), "decoders"),
        (dict(draft="ngram:x"), "ngram:N"),
    ]:
        args = {**dict(target=target, draft=draft, prompt=[1, 2], n_tokens=4), **kwargs}
        with pytest.raises(ValueError, match=message):
            race(**args)


def test_a_race_takes_a_made_request_and_checks_its_settings(models):
    """request= (made once by request.make_request, as the command line does): the same runs as from the
    prompt; the drafting settings are still checked, and a request made for another length is refused."""
    from specdec.config import make_request

    target, draft = models
    settings = {"K": 2, "temperature": 1.0, "top_k": 20, "repeats": 1, "warmup": False}
    made = make_request(target, [1, 2, 1], 8)
    from_prompt = race(target, draft, [1, 2, 1], 8, **settings)
    from_request = race(target, draft, None, 8, request=made, **settings)
    for name in ("autoregressive", "speculative"):
        assert getattr(from_request, name)[0].result.tokens == getattr(from_prompt, name)[0].result.tokens
    assert from_request.settings == from_prompt.settings
    with pytest.raises(ValueError, match="i.i.d."):
        race(target, draft, None, 8, request=made, tree=4, verification="spectr", **settings)
    with pytest.raises(ValueError, match="made for 8 tokens"):
        race(target, draft, None, 6, request=made, **settings)


def test_race_offers_the_tree_rules_where_they_are_exact(models):
    target, draft = models
    settings = dict(prompt=[1, 2], n_tokens=6, K=2, tree=4, temperature=1.0, repeats=1, warmup=False)
    for verification, siblings in [("spectr", "iid"), ("traversal", None), ("traversal", "iid")]:
        report = race(target, draft, verification=verification, siblings=siblings, **settings)
        assert report.spec.result.drafted > 0 and report.settings["verification"] == verification
    with pytest.raises(ValueError, match="i.i.d."):  # the model drafter draws without replacement by default
        race(target, draft, verification="spectr", **settings)
    with pytest.raises(ValueError, match="siblings applies to a draft model"):
        race(target, "ngram", verification="spectr", siblings="iid", **settings)
    with pytest.raises(ValueError, match="judges trees"):
        race(target, draft, verification="traversal", **{**settings, "tree": None})


def count_prompt_passes(monkeypatch, model, prompt: list[int]) -> list[int]:
    """Wraps model.forward: the returned list grows by one per pass over (nearly) the whole prompt."""
    passes, forward = [], model.forward

    def counting(tokens, *args, **kwargs):
        if len(tokens) >= len(prompt) - 1:
            passes.append(len(tokens))
        return forward(tokens, *args, **kwargs)

    monkeypatch.setattr(model, "forward", counting)
    return passes


def test_a_race_of_the_autoregressive_decoder_passes_the_prompt_once(monkeypatch):
    """The costs c and r(m) price speculative rounds: with nothing speculative to run, the race measures
    none, and the only pass over a long prompt is the decoder's own."""
    target, prompt = tiny_model(seed=1), [1, 2, 3] * 10
    passes = count_prompt_passes(monkeypatch, target, prompt)
    report = race(target, "ngram", prompt, 4, decoders=("autoregressive",), warmup=False, repeats=1)
    assert passes == [len(prompt)] and report.costs is None  # autoregressive_sample's prefill, nothing else
    assert "no forward-pass costs measured" in str(report)
    assert json.loads(json.dumps(report.to_dict(), allow_nan=False))["costs"] is None


def test_measuring_the_costs_again_passes_the_prompt_once(monkeypatch):
    """An implausible curve is measured again (twice, here): every measurement times its passes on top of
    the one pass over the prompt, rolling the cache back to it."""
    target, prompt = tiny_model(seed=1), [1, 2, 3] * 10
    monkeypatch.setattr(timing, "implausible", lambda r: "always, for this test")
    passes = count_prompt_passes(monkeypatch, target, prompt)
    costs = timing.measure_costs(target, "ngram", prompt, m_max=3, repeats=1)
    assert "stayed implausible over 3 measurements" in costs.note
    assert passes == [len(prompt) - 1]  # the prompt but its last token, once


def test_a_race_builds_its_drafter_once_and_reads_head_files_once(models, monkeypatch, tmp_path):
    """Every run of a race (the warm-up, each repeat, the cost measurement) drafts with the one drafter built
    when the request was checked: heads are read from disk once, however many repeats."""
    from specdec import drafters
    from specdec.drafters import medusa
    from specdec.drafters.heads import DraftVocab, save_heads

    target = models[0]
    built, reads, read_heads = [], [], medusa.load_heads

    class CountedNgram(drafters.NgramDrafter):
        def __init__(self, *args, **kwargs):
            built.append(1)
            super().__init__(*args, **kwargs)

    def counted_read(*args, **kwargs):
        reads.append(1)
        return read_heads(*args, **kwargs)

    monkeypatch.setattr(drafters, "NgramDrafter", CountedNgram)
    monkeypatch.setattr(medusa, "load_heads", counted_read)
    settings = dict(prompt=[1, 2, 3, 1, 2], n_tokens=6, K=2, repeats=3, k_max=2)
    report = race(target, "ngram", **settings)
    assert len(report.speculative) == 3 and built == [1]
    vocab = DraftVocab.of(target, np.arange(target.n_vocab))
    save_heads(tmp_path, "medusa", target, medusa.init_params(2, target.n_embd), {"n_heads": 2}, vocab)
    report = race(target, f"medusa:{tmp_path}", **settings, tree=3)
    assert len(report.speculative) == 3 and reads == [1]
