"""Results that explain themselves: tau, per-position acceptance, token kinds, .text,
.to_dict(), a one-line repr, a short summary and a notebook's coloured HTML trace."""

from __future__ import annotations

import json
import re

import pytest
from conftest import tiny_checkpoint, tiny_model  # noqa: F401 (fixture)
from helpers import perturbed

from specdec import autoregressive_sample, load_folder, speculative_sample
from specdec.race import race
from specdec.race.render import jsonable
from specdec.result import KIND_COLOURS, DecodeResult, sparkline


@pytest.fixture(scope="module")
def pair():
    return tiny_model(seed=0), tiny_model(seed=1)


def run_with_kinds(target, draft, **kw):
    seen = []
    result = speculative_sample(target, draft, [1, 2, 3], on_token=lambda t, kind: seen.append((t, kind)), **kw)
    return result, seen


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_kinds_are_what_on_token_was_told(pair, temperature):
    target, draft = pair
    result, seen = run_with_kinds(target, draft, n_tokens=40, K=3, temperature=temperature, seed=5)
    assert list(zip(result.tokens, result.kinds)) == seen
    assert {"draft", "target"} <= set(result.kinds)  # the run has both, so the check above bites
    result, seen = run_with_kinds(target, target, n_tokens=9, K=3, temperature=temperature, seed=5)
    assert result.kinds == [kind for _, kind in seen] == ["draft"] * 3 + ["bonus"] + ["draft"] * 3 + ["bonus", "target"]


def test_tau_and_acceptance_by_position(pair):
    target, draft = pair
    result = speculative_sample(target, draft, [1, 2, 3], n_tokens=60, K=4, temperature=1.0, seed=2)
    assert result.tau == pytest.approx(len(result.tokens) / result.rounds)
    assert result.tau == pytest.approx(1 + result.accepted / result.rounds)  # each round: its accepted drafts + 1
    by_position = result.acceptance_by_position
    assert len(by_position) == 4 and by_position[0] == pytest.approx(
        sum(n > 0 for n in result.accepted_per_round) / sum(k > 0 for k in result.k_per_round)
    )
    plain = autoregressive_sample(target, [1, 2, 3], n_tokens=5)
    assert plain.tau == 1.0 and plain.acceptance_by_position == [] and plain.kinds == ["target"] * 5  # a token a pass


def test_text_needs_a_tokenizer(tiny_checkpoint):  # noqa: F811
    model = load_folder(tiny_checkpoint)
    ids = model.tokenizer.encode("the cat")
    result = speculative_sample(model, model, ids, n_tokens=6, K=2)
    assert result.text == model.tokenizer.decode(result.tokens) and result.text
    assert autoregressive_sample(model, ids, 3).text == model.tokenizer.decode(
        autoregressive_sample(model, ids, 3).tokens
    )
    assert speculative_sample(tiny_model(), tiny_model(), ids, n_tokens=3, K=2).text is None  # no tokenizer


def test_to_dict_is_plain_and_complete(pair):
    target, draft = pair
    result = speculative_sample(target, draft, [1, 2, 3], n_tokens=20, K=3, temperature=1.0, seed=1)
    d = result.to_dict()
    assert d["tokens"] == result.tokens and d["tau"] == result.tau and d["kinds"] == result.kinds
    assert d["acceptance_by_position"] == result.acceptance_by_position and d["alpha"] == result.alpha
    json.dumps(jsonable(d), allow_nan=False)  # plain values only
    d["tokens"].append(0)
    assert len(result.tokens) == 20  # a copy, not the result's own lists


def test_repr_is_one_short_line_and_str_a_summary():
    result = DecodeResult(
        tokens=list(range(11)), target_calls=5, k_per_round=[4, 4, 4, 2], accepted_per_round=[4, 0, 2, 1], k_max=4
    )
    assert repr(result) == "DecodeResult(11 tokens, 4 rounds, alpha 0.70, tau 2.75)"  # 7 of 10 judged; 11 / 4
    lines = str(result).splitlines()
    assert lines[0] == repr(result)
    assert "alpha 0.70 (7 accepted of 10 judged drafts; 14 drafted), tau 2.75" in lines[1]
    assert "target passes 5 (1 over the prompt + 4 rounds)" in lines[4]
    assert "1: 0.75  2: 0.67  3: 0.50  4: 1.00" in lines[2]  # judged 4, 3, 2, 1 times
    assert "0:1 1:1 2:1 3:0 4:1" in lines[3]
    assert repr(DecodeResult(tokens=[1, 2], target_calls=2)) == "DecodeResult(2 tokens, 2 target passes)"


def test_html_trace_colours_each_token_and_escapes_text(tiny_checkpoint):  # noqa: F811
    model = load_folder(tiny_checkpoint)
    tokens = model.tokenizer.encode("a<b>&c")
    result = DecodeResult(
        tokens=tokens,
        target_calls=3,
        k_per_round=[3, 3],
        accepted_per_round=[3, len(tokens) - 5],
        k_max=3,
        tokenizer=model.tokenizer,
    )
    html = result._repr_html_()
    assert html.count('<span style="color:') - html.count("■") == len(tokens)  # one span per token (+ legend)
    assert "&lt;" in html and "&amp;" in html and "<b>" not in html
    for kind in set(result.kinds):
        assert f'color:{KIND_COLOURS[kind]}" title="{kind}"' in html
    assert "<span" not in DecodeResult(tokens=[1], target_calls=1)._repr_html_()  # no tokenizer: the summary only


def test_sparkline():
    assert sparkline([1, 4, 0, 2]) == "▂█ ▄"
    assert sparkline([0, 0]) == "  " and sparkline([]) == ""


def test_race_report_repr_html_and_json(tiny_checkpoint):  # noqa: F811
    model = load_folder(tiny_checkpoint)
    ids = model.tokenizer.encode("the cat")
    report = race(model, perturbed(model, 0.3, seed=2), ids, 12, K=3, temperature=1.0, seed=1, warmup=False)
    spec = report.spec.result
    assert repr(report) == (
        f"RaceReport(speedup {report.speedup:.2f}x, alpha {spec.alpha:.2f}, tau {spec.tau:.2f}, K=3, 12 tokens)"
    )
    text = str(report)
    rows = dict(line.split("  ", 1) for line in text.splitlines() if "  " in line)
    assert rows["tau (tokens per round = per target pass)"].split()[0] == f"{spec.tau:.2f}"
    assert "acceptance at draft position 1..K" in text
    html = report._repr_html_()
    assert html.count('" title="') == 12 and "&lt;" not in html.split("</pre>")[1]  # the trace: one span per token
    d = report.to_dict()["speculative"]
    assert d["tau"] == spec.tau and d["acceptance_by_position"] == jsonable(spec.acceptance_by_position)  # nan: null
    assert d["kinds"] == spec.kinds and len(d["acceptance_by_position"]) == 3


def summary_rows(text: str) -> dict[str, str]:
    """The summary's rows, label -> value (labels and values are separated by two spaces or more)."""
    body = text.split("── summary")[1].splitlines()[1:]
    pairs = (re.split(r"( {2,})", line, maxsplit=1) for line in body if "  " in line)
    return {k.strip(): v.strip() for k, _, v in pairs}


def numbers(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?", text)]


@pytest.mark.parametrize("tree", [None, 6])
def test_the_printed_summary_agrees_with_itself(tiny_checkpoint, tree):  # noqa: F811
    """Every figure of the printed summary, recomputed from the others it prints: alpha from its counts,
    tau from tokens and rounds, the histogram's total and weighted sum, the passes, no nan anywhere."""
    model = load_folder(tiny_checkpoint)
    ids = model.tokenizer.encode("the cat")
    report = race(
        model, perturbed(model, 0.3, seed=2), ids, 30, K=3, temperature=1.0, seed=1, warmup=False, tree=tree, repeats=1
    )
    text = str(report)
    assert "nan" not in text
    rows = summary_rows(text)
    alpha, accepted, judged, drafted = numbers(rows["alpha (accepted / judged drafts)"])
    assert alpha == pytest.approx(accepted / judged, abs=0.005) and accepted <= judged <= drafted
    tau, tokens, rounds, prompt_passes = numbers(rows["tau (tokens per round = per target pass)"])
    assert tau == pytest.approx(tokens / rounds, abs=0.005) and tau >= 1 and tokens == 30
    histogram = [int(x) for x in rows["rounds by drafts accepted (0, 1, ...)"].split("]")[0].strip("[").split(",")]
    assert sum(histogram) == rounds  # every round, also one that drafted nothing
    assert sum(n * c for n, c in enumerate(histogram)) == accepted
    assert tokens == accepted + rounds  # each round: its accepted drafts + the target's one token
    _draft_passes, target_passes = numbers(rows["draft / target passes"])
    if tree is None:  # k is over the rounds that drafted, and says how many did
        k, drafting, all_rounds = numbers(rows["k, mean drafts per round that drafted"])
        assert all_rounds == rounds and k == pytest.approx(drafted / drafting, abs=0.005)
    assert target_passes == rounds + prompt_passes
    timing = {
        name: line
        for line in text.splitlines()
        for name in ("autoregressive", "speculative")
        if line.startswith(f"[{name}]") and "tokens in" in line
    }
    speedup = numbers(rows["speedup (autoregressive time / speculative time)"])[0]
    rate = {name: numbers(line.split("s (")[1])[0] for name, line in timing.items()}  # tokens/s, 1 decimal
    assert speedup == pytest.approx(rate["speculative"] / rate["autoregressive"], rel=0.02, abs=0.006)
    verdict = rows[next(k for k in rows if k.startswith("verdict"))]
    assert verdict.split()[0] in ("faster", "slower", "within")
    # a deliberately broken record (a round lost from the histogram) fails the same checks
    broken = report.spec.result
    broken.k_per_round.append(3), broken.accepted_per_round.append(0)
    assert sum(broken.accepted_histogram) != rounds


@pytest.mark.parametrize("stop_at", [0, 1, 3])
def test_a_reply_that_ends_inside_a_round_records_only_the_drafts_it_emitted(stop_at):
    """A chat reply's end among the accepted drafts (or as the round's own token): the record counts the drafts
    emitted up to it, so tokens, kinds and the per-round counts agree."""
    import numpy as np

    from specdec.config import Request
    from specdec.interfaces import Proposal
    from specdec.sampling import SamplingParams
    from specdec.speculative import Sequence, settle

    model, drafts = tiny_model(seed=1), [7, 8, 9]
    logits = np.full((4, model.n_vocab), -10.0, np.float32)
    for row, token in enumerate([*drafts, 11]):  # greedy: every draft accepted, then the bonus 11
        logits[row, token] = 10.0
    stop = [*drafts, 11][stop_at]
    kinds = []
    request = Request([1, 2], 8, SamplingParams(0.0), stop=stop)
    seq = Sequence(request, model.new_cache(), np.random.default_rng(0), DecodeResult(), lambda t, k: kinds.append(k))
    model.forward([1, 2, *drafts], seq.cache)  # the prompt, then the pass over [ids[-1], *drafts], as a round has it
    settle(seq, Proposal.chain(drafts), logits)
    r = seq.result
    assert seq.ended and r.tokens == [*drafts, 11][: stop_at + 1] and len(kinds) == len(r.tokens)
    assert r.accepted_per_round == [min(stop_at + 1, len(drafts))] and r.judged == r.accepted_per_round
