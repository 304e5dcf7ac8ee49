"""bench --only multidraft: the bound and each rule's acceptance per position, on tiny models (the plumbing)."""

import numpy as np
import pytest

from specdec.bench import multidraft
from specdec.bench.multidraft import TREE_RULES, measure, positions, tree_rounds
from specdec.model.gpt2 import GPT2, HParams, random_weights

H = HParams(n_vocab=8, n_ctx=32, n_embd=16, n_head=2, n_layer=2)


def model(seed: int) -> GPT2:
    return GPT2(H, random_weights(H, seed=seed, scale=0.6), name=f"m{seed}")


def test_every_rule_sits_between_one_draft_and_the_bound():
    target, draft = model(10), model(20)
    p, q = positions(target, "model", draft, [[1, 2, 3], [4, 5]], 6, 1.0, seed=0)
    assert p.shape == q.shape == (12, 8)
    _, early = positions(target, "early_exit:1", None, [[1, 2, 3]], 4, 1.0, seed=0)
    assert not np.allclose(early, p[:4])  # the first layer's guess, not the target's row
    for top_k in (None, 4):
        result = measure(p, q, 1.0, top_k, [2, 4], draws=5, seed=0)
        for k, r in result.items():
            assert r["positions"] == 12
            for rule in ("spectr", "specinfer_iid"):
                assert r["alpha"] - 1e-9 <= r[rule] <= r["bound_iid"] + 1e-9, (k, rule, r)
            assert np.isnan(r["bound_wor"]) == (top_k is None)
            if top_k:
                assert r["bound_wor"] >= r["bound_iid"] - 1e-9 and r["specinfer_wor"] <= r["bound_wor"] + 0.05
        assert result[4]["bound_iid"] >= result[2]["bound_iid"]


@pytest.mark.parametrize("broken", ["spectr_acceptance", "specinfer_iid_acceptance"])
def test_a_rule_above_the_bound_stops_the_run(broken, monkeypatch):
    p, q = positions(model(10), "model", model(20), [[1, 2, 3]], 4, 1.0, seed=0)
    measure(p, q, 1.0, None, [2], draws=1, seed=0)  # the real rules pass the never-worse checks
    monkeypatch.setattr(multidraft, broken, lambda p, q, k: multidraft.optimal_acceptance(p, q, k) + 0.01)
    with pytest.raises(AssertionError, match="passed the i.i.d. bound"):
        measure(p, q, 1.0, None, [2], draws=1, seed=0)


def test_whole_tree_rounds_for_each_rule():
    target, draft = model(10), model(20)
    per_rule, same = tree_rounds(target, draft, [[1, 2, 3], [4, 5]], 6, 1.0, nodes=4, depth=2, seed=0)
    assert set(per_rule) == set(TREE_RULES)
    for r in per_rule.values():
        taus, expected, seconds = r["tau"], r["expected"], r["seconds"]
        assert taus and all(1 <= t <= 3 for t in taus) and len(seconds) == len(taus) and min(seconds) > 0
        assert len(expected) == len(taus) and all(1 <= e <= 3 for e in expected)
    assert set(same["iid"]) == {
        "token",
        "spectr",
        "traversal",
        "first token",
        "first spectr",
        "first traversal",
        "bound",
    }
    assert "spectr" not in same["without replacement"]
    for values in same.values():  # the same trees for every rule; none passes the bound on average by much
        assert len({len(v) for v in values.values()}) == 1
        for rule in ("token", "traversal"):
            assert np.mean(values["first " + rule]) <= np.mean(values["bound"]) + 0.1
    per_rule, _ = tree_rounds(target, "early_exit:1", [[1, 2, 3]], 4, 1.0, nodes=4, depth=2, seed=0)
    assert set(per_rule) == set(TREE_RULES) and all(r["tau"] for r in per_rule.values())
