"""The benchmark script runs end to end and reports every section, with sane values.

A smoke test on tiny shapes (`--quick`, the hidden sizes tiny and tiny2): it
checks the structure and sanity of the JSON report, never timing thresholds
(a benchmark is a script, not a timed test). `check_report` is also run on a
deliberately corrupted report, to show it can fail.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest

import specdec.bench.speed as bench
from specdec.costmodel import best_k, predicted_speedup

ALL = "decode,verify,predict,drafters,costcheck,overhead,io"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    returned = bench.main(["--quick", "--sizes", "tiny,tiny2", "--only", ALL, "--json", str(path)])
    written = json.loads(path.read_text())
    assert written["settings"] == json.loads(json.dumps(returned["settings"]))
    return written


def positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def check_report(r: dict) -> None:
    """Everything the benchmark must report, and values that make sense."""
    for section in ALL.split(","):
        assert section in r, f"section {section} missing from the report"
    assert r["environment"]["numpy"]

    for size in ("tiny", "tiny2"):
        for ctx in ("32", "256", "1000"):
            s = r["decode"][size][ctx]
            assert positive(s["median_ms"]) and s["min_ms"] <= s["median_ms"] <= s["max_ms"]
            assert positive(s["nocache"]["median_ms"])

        v = r["verify"][size]
        assert v["m"] == list(bench.VERIFY_M) == list(range(1, 17)) and len(v["r"]) == 16
        assert v["r"][0] == 1.0, "r(1) is t_1 / t_1"
        assert all(positive(x) for x in v["r"])

    assert set(r["predict"]) == {"tiny->tiny2", "tiny->1558M"}
    for pair in r["predict"].values():
        assert 0 < pair["c"] and len(pair["rows"]) == len(bench.ALPHAS)
        for row in pair["rows"]:
            # Structural, never a timing threshold: each best K is what the cost model picks for the
            # reported c and r(m) (0 when no K beats plain decoding, as when a draft times slower than its target).
            alpha, c, r_m = row["alpha"], pair["c"], pair["r"]
            assert (row["best_k"], row["speedup"]) == pytest.approx(best_k(alpha, c, r_m, bench.K_MAX))
            assert (row["best_k_r1"], row["speedup_r1"]) == pytest.approx(best_k(alpha, c, None, bench.K_MAX))
            assert 0 <= row["best_k"] <= bench.K_MAX and 0 <= row["best_k_r1"] <= bench.K_MAX
            assert positive(row["speedup"]) and positive(row["speedup_r1"])
            assert all(positive(s) for s in row["speedup_by_k"].values())
    assert r["predict"]["tiny->1558M"]["target_source"].startswith("extrapolated")

    runs = r["drafters"]["runs"]
    assert {"autoregressive", "ngram K=2", "ngram K=4", "ngram K=8", "ngram adaptive K"} <= set(runs)
    assert any(name.startswith("early_exit:") for name in runs)
    for name, run in runs.items():
        assert run["identical_to_autoregressive"] is True, f"{name}: greedy tokens differ from autoregressive"
        assert run["tau"] >= 1 and positive(run["speedup"])

    check = r["costcheck"]
    assert {(run["target"], run["draft"], run["K"]) for run in check["runs"]} == set(
        bench.costcheck_runs(["tiny", "tiny2"])
    )
    for run in check["runs"]:
        assert run["identical_tokens"] is True, f"{run['draft']} -> {run['target']}: greedy tokens differ"
        assert positive(run["measured_speedup"]) and positive(run["predicted_from_rounds"])
        assert 0 <= run["outside_passes"] < 1 and positive(run["passes_vs_predicted"])
        # eq. 1 is the cost model's own prediction for the reported alpha, c and r(m)
        assert run["predicted_eq1"] == pytest.approx(predicted_speedup(run["alpha"], run["K"], run["c"], run["r"]))
        assert run["error_from_rounds"] == pytest.approx(run["predicted_from_rounds"] / run["measured_speedup"] - 1)
    within = sum(abs(run["error_from_rounds"]) <= bench.COSTCHECK_TOLERANCE for run in check["runs"])
    assert check["within_tolerance"] == within

    o = r["overhead"]
    assert 0 <= o["overhead_fraction"] < 1 and o["runs"][0]["rounds"] > 0

    io = r["io"]
    assert positive(io["open_ms"]["median_ms"]) and positive(io["load_folder_ms"]["median_ms"])
    assert positive(io["first_load_ms"]) and positive(io["load_folder_kept_ms"]["median_ms"])
    assert io["file_bytes_sum"] == sum(io["file_bytes"].values()) > 0
    assert io["memory"]["tokens"] == 20 and io["memory"]["peak_kb"] >= io["memory"]["baseline_kb"] > 0


def test_report_has_every_section_with_sane_values(report):
    check_report(report)


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda r: r.pop("verify"),
        lambda r: r["verify"]["tiny"]["r"].__setitem__(0, 1.2),
        lambda r: r["drafters"]["runs"]["ngram K=4"].__setitem__("identical_to_autoregressive", False),
        lambda r: r["predict"]["tiny->tiny2"]["rows"][0].__setitem__("speedup", None),  # NaN is written as null
        lambda r: r["costcheck"]["runs"][0].__setitem__(
            "predicted_eq1", r["costcheck"]["runs"][0]["predicted_eq1"] * 1.2
        ),
        lambda r: r["costcheck"]["runs"].pop(),
        lambda r: r["predict"]["tiny->tiny2"]["rows"][-1].__setitem__(  # not the cost model's choice
            "best_k", (r["predict"]["tiny->tiny2"]["rows"][-1]["best_k"] + 1) % (bench.K_MAX + 1)
        ),
    ],
)
def test_check_report_catches_a_broken_report(report, corrupt):
    broken = copy.deepcopy(report)
    corrupt(broken)
    with pytest.raises((AssertionError, KeyError)):
        check_report(broken)


def test_one_bench_command_routes_each_section_to_its_group(monkeypatch, capsys):
    """`python -m specdec.bench --only X`: every section reaches its group's code with its flags; an
    unknown section, or sections of groups with different flags, are one error line (exit 2)."""
    from specdec.bench import __main__ as cli

    calls = []
    for name, (group, _) in cli.SECTIONS.items():
        monkeypatch.setitem(
            cli.SECTIONS, name, (lambda argv, g=group: calls.append((g.__module__, argv)) or 0, cli.SECTIONS[name][1])
        )
    assert cli.main(["--only", "tree-r", "--sizes", "124M"]) == 0
    assert cli.main(["--only", "alpha-table", "--models", "a,b"]) == 0
    assert cli.main(["--only=family", "--prompts", "2"]) == 0
    assert calls == [
        ("specdec.bench.trees", ["--only", "r", "--sizes", "124M"]),
        ("specdec.bench.suite", ["--alpha-table", "--models", "a,b"]),
        ("specdec.bench.family", ["--prompts", "2"]),
    ]
    assert cli.main(["--only", "bogus"]) == 2
    assert cli.main(["--only", "decode,family"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "unknown section bogus" in err[0] and "different flags" in err[1]


def test_exit_agreement_counts_the_full_models_greedy_tokens():
    """bench real's early-exit table: all layers agree with the full model's greedy reply exactly;
    fewer layers agree on a fraction; a guess compared one position off would not give 1.0."""
    from specdec.bench.real import exit_agreement
    from specdec.checkpoints.load import load_model

    model = load_model("stdlib-6L")
    agreement = exit_agreement(model, [2, model.n_layer], n_tokens=24, text="def main(argv):\n    ")
    assert agreement[model.n_layer] == 1.0
    assert 0.0 <= agreement[2] <= 1.0


def test_bench_real_prices_a_draft_model_named_like_the_built_in_drafters(capsys, monkeypatch):
    """`--only real --drafts stdlib-2L,ngram`: a draft model by its name gets its c beside prompt lookup's."""
    from specdec.bench import real
    from specdec.checkpoints.load import load_model

    monkeypatch.setattr(real, "random_model", lambda name: load_model("stdlib-2L"))
    monkeypatch.setattr(real, "CONTEXT", 16)
    result = real.main(
        ["--target", "stdlib-6L", "--drafts", "stdlib-2L,ngram", "--repeats", "1", "--exit-layers", "", "--quiet"]
    )
    assert set(result["costs"]) == {"stdlib-2L", "ngram"}
    assert result["costs"]["stdlib-2L"]["c"] > result["costs"]["ngram"]["c"] > 0  # two of six blocks, not a lookup
    assert "| stdlib-2L |" in capsys.readouterr().out
    timed = []
    monkeypatch.setattr(real, "time_calls", lambda *args, **kwargs: timed.append(1))
    for bad in ("stdlib-2L,ngram:x", "no-such-model", "early_exit:99"):  # refused before any timing, in one line
        with pytest.raises(SystemExit) as e:
            real.main(["--target", "stdlib-6L", "--drafts", bad, "--repeats", "1", "--exit-layers", "", "--quiet"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1 and "error:" in err and not timed, (bad, err)


def test_the_batch_section_runs_on_a_tiny_model(capsys, tmp_path):
    """`python -m specdec.bench --only batch`, smoke-sized: one table row per batch size, tokens identical,
    and the JSON with each batch size's pass curve."""
    from specdec.bench import batch

    path = tmp_path / "batch.json"
    argv = ["--models", "tiny", "--batches", "1,3", "--tokens", "6", "--repeats", "1", "--pass-samples", "2"]
    assert batch.main([*argv, "--json", str(path)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("|  1 |") or line.startswith("|  3 |")]
    assert len(rows) == 2 and all(line.rstrip().endswith("| yes |") for line in rows), out
    assert "speculation stops paying" in out
    written = json.loads(path.read_text())
    assert written["args"]["pass_samples"] == 2 and "_given" not in written["args"]
    three = written["models"]["tiny"]["batches"]["3"]
    assert three["grid"] == batch.pass_grid(3) and len(three["pass_seconds"]) == len(three["grid"])
    assert all(s > 0 for s in three["pass_seconds"])
    # The prompts (so the rounds) of a batch size do not depend on how many repeats or samples were timed.
    again = tmp_path / "again.json"
    assert batch.main([*argv[:-4], "--repeats", "2", "--pass-samples", "1", "--json", str(again)]) == 0
    rounds = {b: r["rounds"] for b, r in json.loads(again.read_text())["models"]["tiny"]["batches"].items()}
    assert rounds == {b: r["rounds"] for b, r in written["models"]["tiny"]["batches"].items()}


def test_the_batch_pass_grid_straddles_the_kernel_switch_and_spreads_tokens_evenly():
    """Every r_B(m) point is timed, and both sides of kernels.linear's switch to OpenBLAS's product, so a
    ragged round is never priced by a line drawn across the jump."""
    from specdec.bench.batch import M_MAX, pass_grid, spread
    from specdec.model.fast import kernels

    switch = kernels.MAX_CHUNKED_ROWS
    for b in (1, 2, 3, 4, 8, 16):
        grid = pass_grid(b)
        assert grid == sorted(set(grid)) and all(b * m in grid for m in range(1, M_MAX + 1))
        assert {switch, switch + 1} <= set(grid) or b * M_MAX < switch + 1
        assert all(n in grid for n in (1, 2, 4, 8) if n < b)  # the last rounds, after rows have left
    assert pass_grid(1) == list(range(1, M_MAX + 1))
    assert pass_grid(3) == [1, 2, 3, 6, 9, 12, 15, 16, 17, 18, 21, 24, 27]
    assert pass_grid(16)[:6] == [1, 2, 4, 8, 16, 17] and pass_grid(16)[-1] == 16 * M_MAX
    assert pass_grid(1, m_max=20) == [*range(1, 21)] and pass_grid(2, m_max=12)[-1] == 24  # K = 19, K = 11
    for n_tok, b in ((10, 4), (3, 8), (17, 16), (144, 16), (1, 1)):
        rows = spread(n_tok, b)
        assert sum(rows) == n_tok and len(rows) == min(b, n_tok) and max(rows) - min(rows) <= 1


def test_batch_costs_take_ratios_within_each_repeat():
    """A repeat on a busier machine (every pass in it slower by the same factor) moves T_B, r_B's passes
    and the draft step together: the ratios come out exact, and the curve is the median of every sample."""
    from specdec.bench.batch import batch_costs, pass_grid

    b, load = 2, np.array([1.0, 3.0, 1.5, 2.5])  # four repeats, each its own load factor
    base = {n: 0.010 + 0.001 * n for n in pass_grid(b)}  # seconds of the n_tok pass on an idle machine
    times = {(n, j): list(base[n] * load * (1 + 0.01 * j)) for n in base for j in range(3)}  # three samples
    times["draft"] = list(0.002 * load)
    costs = batch_costs(times, b)
    assert costs["grid"] == pass_grid(b)
    assert np.allclose(costs["r"], [base[b * m] / base[b] for m in range(1, 10)], rtol=1e-12)
    assert abs(costs["c"] - 0.002 / base[b] / 1.01) < 1e-12  # against the median sample (j = 1)
    every = np.concatenate([np.asarray(times[b, j]) for j in range(3)])
    assert costs["step"] == np.median(every) and costs["pass_seconds"][costs["grid"].index(b)] == np.median(every)
    # Paired across repeats instead (a shuffled repeat order), the ratios would carry the load: not exact.
    shuffled = {k: (v[::-1] if k == "draft" else v) for k, v in times.items()}
    assert abs(batch_costs(shuffled, b)["c"] - costs["c"]) > 1e-3


@pytest.mark.parametrize("flag", ["--pass-samples", "--repeats", "--tokens", "--K"])
def test_the_batch_section_refuses_a_count_below_one(flag, capsys):
    from specdec.bench import batch

    with pytest.raises(SystemExit) as exit_:
        batch.main(["--models", "tiny", flag, "0"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1
    assert flag.replace("-", "_").lstrip("_") in err.replace("-", "_") and "at least 1" in err
