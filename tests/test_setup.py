"""One set-up, built once: every entry point builds its run through config.setup, K is parsed in one place, and
a speculative run's settings are one Config (by name or as config=)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
from conftest import tiny_model

import specdec
from specdec import autoregressive_sample, speculative_sample
from specdec.config import Config, make_config, parse_k, setup

ROOT = Path(specdec.__file__).parent
# The entry points: the API's samplers, the batch samplers, the race, and the command line (which runs the race
# and the batch samplers, and checks its prompt through setup before it loads a draft).
ENTRY_POINTS = ["speculative.py", "autoregressive.py", "batch.py", "race/__init__.py", "cli/main.py"]
# What setup does, which no entry point may do itself.
SET_UP_PIECES = {"make_request", "with_settings", "make_drafter", "parse_k", "make_tree_policy", "costs_for"}


def calls(path: Path) -> dict[str, int]:
    """{name: how often a function of that name is called} in a module."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            found[name] = found.get(name, 0) + 1
    return found


def entry_points() -> list[Path]:
    paths = [ROOT / name for name in ENTRY_POINTS if (ROOT / name).exists()]
    assert len(paths) >= 4, f"entry points moved: {ENTRY_POINTS}"
    return paths


def test_every_entry_point_builds_its_run_through_setup_and_nothing_else():
    counted = {path.relative_to(ROOT).as_posix(): calls(path) for path in entry_points()}
    assert all(found.get("setup", 0) >= 1 for found in counted.values()), counted
    doing_it_themselves = {where: sorted(SET_UP_PIECES & set(found)) for where, found in counted.items()}
    assert all(not pieces for pieces in doing_it_themselves.values()), doing_it_themselves


def test_the_count_can_fail():
    """The same count over a module that makes its own request (as speculative.py once did) finds it."""
    source = "from .config import make_request\ndef sample(t, p):\n    return make_request(t, p, 4)\n"
    found = {name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call) for name in [node.func.id]}
    assert SET_UP_PIECES & found == {"make_request"} and "setup" not in found


def test_k_is_parsed_in_one_place():
    """Only config.parse_k says what K may be: no other module of the package words its refusal."""
    sources = {p.relative_to(ROOT).as_posix(): p.read_text() for p in ROOT.rglob("*.py")}
    wording = "K must be an integer >= 1"
    assert [where for where, text in sources.items() if wording in text] == ["config.py"]
    assert parse_k("6") == 6 and parse_k("auto") == "auto" and Config(K="4").K == 4
    for bad in ("0", 33, "often", True, 2.5):
        with pytest.raises(ValueError, match="K must be"):
            Config(K=bad)


def test_the_sampler_s_signature_reads_at_a_glance():
    signature = inspect.signature(speculative_sample)
    assert len(signature.parameters) <= 12, list(signature.parameters)
    assert len(inspect.getdoc(speculative_sample).splitlines()) < 15


def test_settings_by_name_and_as_a_config_are_the_same_run():
    target, draft = tiny_model(seed=1), tiny_model(seed=2)
    by_name = speculative_sample(target, draft, [5, 6, 7], 12, K=3, temperature=1.0, top_k=20, seed=4)
    config = Config(K=3, temperature=1.0, top_k=20)
    as_config = speculative_sample(target, draft, [5, 6, 7], 12, config=config, K=3, temperature=1.0, seed=4)
    assert by_name.tokens == as_config.tokens and by_name.k_per_round == as_config.k_per_round
    assert make_config(config, top_p=0.5).top_p == 0.5 and make_config(config, top_p=0.5).top_k == 20
    with pytest.raises(TypeError, match="bogus"):
        speculative_sample(target, draft, [5, 6, 7], 4, bogus=1)


def test_setup_builds_the_run_once():
    """A Setup holds the checked request and the drafter; the autoregressive sampler uses it with no draft."""
    target, draft = tiny_model(seed=1), tiny_model(seed=2)
    run = setup(target, draft, [5, 6, 7], 8, Config(K=2, temperature=0.0))
    assert run.request.prompt == [5, 6, 7] and run.drafter.model is draft and run.k_policy() is None
    assert setup(target, None, [5, 6, 7], 8, Config()).drafter is None
    assert autoregressive_sample(target, [5, 6, 7], 8).tokens == speculative_sample(target, draft, [5, 6, 7], 8).tokens
    with pytest.raises(ValueError, match="tree"):
        setup(target, None, [5, 6, 7], 8, Config(tree=4))


def test_a_config_s_k_and_temperature_hold_unless_given_by_name():
    """config=Config(K=3, temperature=1.0) is not overridden by the samplers' defaults; a name given beside it is."""
    target, draft = tiny_model(seed=1), tiny_model(seed=2)
    config = Config(K=3, temperature=1.0)
    out = speculative_sample(target, draft, [5, 6, 7], 12, config=config, seed=1)
    assert max(out.k_per_round) == 3 and out.k_max == 3
    assert out.tokens == speculative_sample(target, draft, [5, 6, 7], 12, K=3, temperature=1.0, seed=1).tokens
    assert max(speculative_sample(target, draft, [5, 6, 7], 12, 2, config=config, seed=1).k_per_round) == 2
    assert make_config(config, K=None).K == 3 and make_config(config, temperature=0.0).temperature == 0.0
