"""The suffix drafter (drafters/suffix.py): how much it drafts and from where, what it learns from the text as
it arrives, its draft specs; greedy output equal to the target's own with it alone and first in a cascade; and at
temperature 1 the target's distribution kept (chains and trees, token-wise and block verification), while the
same drafter misreporting its candidates' q fails the same check."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from conftest import tiny_model
from helpers import (
    N_BROKEN,
    chi_square_passes,
    exact_continuations,
    sample_many,
    small_model,
    verify_resample_target_on_reject,
)

import specdec.verify as verify
from specdec import LookupFirst, SuffixDrafter, autoregressive_sample, load_model, speculative_sample
from specdec.drafters import EarlyExitDrafter, make_drafter
from specdec.drafters.datastore import Datastore, DatastoreFileError
from specdec.drafters.suffix import EARLIER_CAPACITY
from specdec.drafters.suffix_index import SuffixIndex
from specdec.interfaces import Proposal
from specdec.sampling import SamplingParams
from specdec.timing import measure_costs

GREEDY, T1 = SamplingParams(0.0), SamplingParams(1.0)


def flat(m: float) -> float:
    """A verification pass as cheap as one step whatever its size (the papers' r = 1, a GPU's)."""
    return 1.0


def linear(m: float) -> float:
    """A pass over m tokens costs m steps: nothing is gained by verifying tokens together."""
    return float(m)


def started(drafter: SuffixDrafter, prompt: list[int]) -> SuffixDrafter:
    drafter.begin(None, None, prompt)
    drafter.commit(prompt, None)
    return drafter


def passage(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(100, 1000, n).tolist()


# --- how much, and from where ---------------------------------------------------------------------------


def test_it_drafts_long_where_the_text_repeats_and_nothing_on_a_short_match():
    text = passage(0, 60)
    ids = text + passage(1, 20) + text[:12]  # the passage is being copied: 12 tokens so far
    drafter = started(SuffixDrafter(1000), ids)
    long = drafter.propose(ids, 32, GREEDY, None)
    assert long.tokens == text[12 : 12 + len(long)] and long.is_chain and len(long) >= 10  # the prior alone
    short = ids[:-10] + [text[0], text[1]]  # [p0, p1] occurred once: two tokens of evidence
    assert len(started(SuffixDrafter(1000), short).propose(short, 32, GREEDY, None)) == 0
    assert len(started(SuffixDrafter(1000, r=flat), short).propose(short, 32, GREEDY, None)) > 0  # unless r = 1
    assert len(started(SuffixDrafter(1000, r=linear), ids).propose(ids, 32, GREEDY, None)) == 0  # r(m) = m: never
    for k, nodes in ((4, None), (32, 5)):  # the round's k and nodes bound it
        assert len(started(SuffixDrafter(1000), ids).propose(ids, k, GREEDY, None, nodes)) == min(k, nodes or k)


def test_a_match_of_a_pair_the_datastore_never_saw_is_trusted_sooner():
    """Two tokens of evidence: the prior L / (L + 2) abstains (above), L / (L + 1) drafts. A pair the target's own
    replies never hold gets the second; one they hold often, or no datastore to ask, the first."""
    text = passage(0, 60)
    short = text + passage(1, 20) + text[:2]  # [p0, p1] occurred once before
    never = Datastore.build([passage(7, 50), passage(8, 50)], 1000)
    often = Datastore.build([[text[0], text[1], t] for t in range(100, 140)], 1000)
    assert never.count(text[:2]) == 0 and often.count(text[:2]) == 40
    drafter = started(SuffixDrafter(1000, datastore=never), short)
    proposal = drafter.propose(short, 32, GREEDY, None)
    assert len(proposal) > 0 and proposal.tokens == text[2 : 2 + len(proposal)] and drafter.proposed == {"text": 1}
    for abstains in (SuffixDrafter(1000, datastore=often), SuffixDrafter(1000)):
        assert len(started(abstains, short).propose(short, 32, GREEDY, None)) == 0
    drafter.commit(short + text[2:5], None)  # its guess is scored in the rare pairs' a(L), not the text's
    assert drafter.calibration["text, rare pair"].hits[1] > 0 and drafter.calibration["text"].support == [0.0] * 7
    # The same for a match in earlier outputs.
    store = SuffixIndex(EARLIER_CAPACITY)
    first = started(SuffixDrafter(1000, earlier=store, datastore=never), [1, 2, 3])
    first.commit([1, 2, 3] + text, None)  # an earlier reply
    asked = [4, 5] + text[:2]
    other = started(first.fresh(), asked)
    proposal = other.propose(asked, 32, GREEDY, None)
    assert len(proposal) > 0 and proposal.tokens == text[2 : 2 + len(proposal)] and other.proposed == {"earlier": 1}
    other.commit(asked + text[2:5], None)
    assert other.calibration["earlier, rare pair"].hits[1] > 0 and other.calibration["earlier"].support == [0.0] * 7
    common = started(SuffixDrafter(1000, earlier=store, datastore=often), asked)
    assert len(common.propose(asked, 32, GREEDY, None)) == 0


def test_when_the_target_samples_a_match_must_show_more_before_it_is_trusted():
    """At T = 1 a copied token is accepted with p(x) < 1: the text's priors start from L / (L + 4). A rare pair's
    2-token match, which drafts greedily (L / (L + 1)), abstains; an 8-token match still drafts; the same drafter
    back at T = 0 drafts the short one again (the offsets are set per round, not once)."""
    text = passage(0, 60)
    never = Datastore.build([passage(7, 50), passage(8, 50)], 1000)
    short = text + passage(1, 20) + text[:2]
    long = text + passage(1, 20) + text[:8]
    drafter = started(SuffixDrafter(1000, datastore=never), short)
    assert len(drafter.propose(short, 32, T1, np.random.default_rng(0))) == 0
    assert drafter.calibration["text, rare pair"].rate(2) == pytest.approx(2 / 6)
    assert drafter.calibration["datastore"].prior_offset == 8.0  # the datastore's own prior is not changed
    assert len(drafter.propose(short, 32, GREEDY, None)) > 0
    assert drafter.calibration["text, rare pair"].rate(2) == pytest.approx(2 / 3)
    plain = started(SuffixDrafter(1000), short)  # no datastore: an ordinary match, L / (L + 2) when greedy
    plain.propose(short, 32, T1, np.random.default_rng(0))
    assert plain.calibration["text"].rate(2) == pytest.approx(2 / 6)
    plain.propose(short, 32, GREEDY, None)
    assert plain.calibration["text"].rate(2) == pytest.approx(2 / 4)
    sampled = started(SuffixDrafter(1000, datastore=never), long).propose(long, 32, T1, np.random.default_rng(0))
    assert len(sampled) > 0 and sampled.tokens == text[8 : 8 + len(sampled)]


def test_what_it_learns_from_the_text_sets_the_size():
    """Scored against the tokens that arrive (nothing drafted is needed), a copy that keeps being right raises
    a(L) and the drafts grow to the cap; a copy that keeps being wrong silences it."""
    text = passage(2, 200)
    ids = text + passage(3, 5)
    rng = np.random.default_rng(4)
    broken = [t for o in rng.integers(0, 150, 20) for t in (*text[o : o + 2], int(rng.integers(100, 1000)))]
    right, wrong = started(SuffixDrafter(1000), ids), started(SuffixDrafter(1000), ids)
    for drafter, stream in ((right, text[:40]), (wrong, broken)):  # 2 tokens copied, then another: again and again
        text_so_far = list(ids)
        for token in stream:  # one token a round: as when it abstains
            drafter.propose(text_so_far, 32, GREEDY, None)
            text_so_far.append(token)
            drafter.commit(text_so_far, None)
    assert right.calibration["text"].rate(40) > 0.95 and wrong.calibration["text"].rate(2) < 0.2
    right_ids, wrong_ids = ids + text[:40], ids + broken
    assert len(right.propose(right_ids, 32, GREEDY, None)) == 32
    assert right.propose(right_ids, 32, GREEDY, None).tokens == text[40:72]
    copying = wrong_ids[:-3] + text[37:40]  # a match again, but the text has not been copying
    assert len(wrong.propose(copying, 32, GREEDY, None)) == 0


def test_a_tree_holds_the_continuations_that_followed_most_often():
    ids = [5, 6, 7, 8, 1, 5, 6, 7, 9, 2, 5, 6, 7, 8, 3, 5, 6, 7]  # [5, 6, 7] was followed by 8, 9, 8
    tree = started(SuffixDrafter(10, r=flat), ids).propose(ids, 4, T1, None, nodes=6)
    assert tree.tokens[:2] == [8, 9] and tree.parents[:2] == [-1, -1] and not tree.is_chain
    np.testing.assert_array_equal(tree.q, np.eye(10, dtype=np.float32)[tree.tokens])  # point masses
    assert tree.q.dtype == np.float32
    chain = started(SuffixDrafter(10, r=flat), ids).propose(ids, 4, T1, None)
    assert chain.is_chain and chain.tokens[0] == 8 and chain.q.shape == (len(chain), 10)
    assert started(SuffixDrafter(10, r=flat), ids).propose(ids, 4, GREEDY, None).q is None


def test_earlier_outputs_are_read_but_never_those_of_the_same_prompt():
    reply = passage(5, 40)
    store = SuffixIndex(EARLIER_CAPACITY)
    first = SuffixDrafter(1000, earlier=store)
    first.begin(None, None, [1, 2, 3])
    first.commit([1, 2, 3] + reply, None)  # its output goes into the store, the prompt does not
    assert len(store) == len(reply)
    asked = [4, 5] + reply[:10]  # another request whose text is heading the same way
    other = started(first.fresh(), asked)
    proposal = other.propose(asked, 32, GREEDY, None)
    assert proposal.tokens == reply[10 : 10 + len(proposal)] and other.proposed == {"earlier": 1}
    repeat = first.fresh()  # a repeat of the first request: its own earlier answer is not read
    repeat.begin(None, None, [1, 2, 3])
    repeat.commit([1, 2, 3] + reply[:10], None)
    assert len(repeat.propose([1, 2, 3] + reply[:10], 32, GREEDY, None)) == 0
    alone = started(SuffixDrafter(1000), asked)  # without the store: nothing to copy from
    assert len(alone.propose(asked, 32, GREEDY, None)) == 0


def test_the_datastore_is_read_where_nothing_else_proposes():
    reply = passage(6, 50)
    store = Datastore.build([passage(7, 50), reply, passage(8, 50)], 1000)
    asked = [4, 5] + reply[:16]  # 16 tokens of another reply: its prior L / (L + 8) is 2/3 here
    drafter = started(SuffixDrafter(1000, datastore=store), asked)
    proposal = drafter.propose(asked, 32, GREEDY, None)
    assert proposal.tokens == reply[16 : 16 + len(proposal)] and len(proposal) > 0
    assert drafter.proposed == {"datastore": 1}
    assert len(started(SuffixDrafter(1000, datastore=store), asked[:-8]).propose(asked[:-8], 32, GREEDY, None)) == 0
    here = asked + [7, 8] + reply[:10]  # the text itself now has the match: the datastore is not read
    drafter = started(SuffixDrafter(1000, datastore=store), here)
    assert len(drafter.propose(here, 32, GREEDY, None)) and drafter.proposed == {"text": 1}
    with pytest.raises(ValueError, match="vocabulary"):
        SuffixDrafter(999, datastore=store)


def test_draft_specs_build_it_alone_and_first_in_a_cascade(tmp_path):
    target = tiny_model(seed=1)
    drafter = make_drafter("suffix", target)
    assert isinstance(drafter, SuffixDrafter) and drafter.datastore is None and drafter.earlier is not None
    assert drafter.earlier.capacity == EARLIER_CAPACITY and drafter.r is None and drafter.calls == 0
    assert drafter.fresh().earlier is drafter.earlier  # a batch's rows share it
    cascade = make_drafter("suffix+early_exit:1", target)
    assert isinstance(cascade, LookupFirst) and isinstance(cascade.lookup, SuffixDrafter)
    assert isinstance(cascade.then, EarlyExitDrafter) and cascade.priced is cascade.then
    Datastore.build([[1, 2, 3, 4]], target.n_vocab).save(tmp_path)
    assert len(make_drafter(f"suffix:{tmp_path}", target).datastore) == 6
    assert len(make_drafter(f"suffix:{tmp_path}+early_exit:1", target).lookup.datastore) == 6
    with pytest.raises(DatastoreFileError, match="no datastore here"):
        make_drafter(f"suffix:{tmp_path / 'none'}", target)
    with pytest.raises(ValueError, match="a lookup's drafts are certain"):
        make_drafter("suffix", target, confidence=0.5)
    with pytest.raises(ValueError, match="cap must be in 1..32"):
        SuffixDrafter(10, cap=33)


def test_the_costs_time_its_lookup():
    """measure_costs (K and the bar "auto", the race) times one propose of the drafter itself: no model pass."""
    target = tiny_model(seed=1)
    drafter = SuffixDrafter(target.n_vocab)
    costs = measure_costs(target, drafter, [1, 2, 3, 1, 2, 3, 1, 2], m_max=3, repeats=2)
    assert costs.draft_step > 0 and len(costs.r) == 3 and drafter.calls == 0


# --- greedy: the target's own output --------------------------------------------------------------------


def repeating(target, n: int, seed: int) -> list[int]:
    """A prompt that repeats a stretch of the target's own greedy text, so that copying pays."""
    start = np.random.default_rng(seed).integers(0, target.n_vocab, 3).tolist()
    own = autoregressive_sample(target, start, n).tokens
    return start + own + start + own[: n // 3]


@pytest.mark.parametrize("tree", [None, 8])
def test_greedy_with_suffix_decoding_equals_greedy_autoregressive(tree):
    for seed, target in ((0, tiny_model(seed=1)), (1, tiny_model(seed=2)), (2, small_model(seed=10, n_layer=2))):
        n = min(16, target.n_ctx // 4)
        prompts = [repeating(target, n, seed), np.random.default_rng(seed).integers(0, target.n_vocab, 5).tolist()]
        drafted = 0
        for prompt in prompts:
            plain = autoregressive_sample(target, prompt, target.n_ctx - len(prompt)).tokens
            for drafter in (SuffixDrafter(target.n_vocab), SuffixDrafter(target.n_vocab, r=flat)):
                out = speculative_sample(target, drafter, prompt, len(plain), K=8, tree=tree)
                assert out.tokens == plain, (seed, prompt)
                drafted += sum(out.k_per_round)
        assert drafted > 0


def test_greedy_on_a_trained_model_with_copying_text_and_a_cascade():
    """stdlib-6L (trained on the standard library) asked to go on after a function it has just seen: the reply
    copies, the suffix drafter drafts long, early exit where it abstains; the output is the target's."""
    target = load_model("stdlib-6L")
    code = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef add(a, b):\n"
    prompt = target.tokenizer.encode(code)
    plain = autoregressive_sample(target, prompt, 48).tokens
    for draft in (
        SuffixDrafter(target.n_vocab),
        LookupFirst(SuffixDrafter(target.n_vocab), EarlyExitDrafter(target, 2)),
    ):
        for tree in (None, 16):
            out = speculative_sample(target, draft, prompt, 48, K=32, tree=tree)
            assert out.tokens == plain
            first = draft if isinstance(draft, SuffixDrafter) else draft.lookup
            assert first.proposed["text"] > 0 and max(out.k_per_round) >= 8, out.k_per_round


# --- temperature 1: the target's distribution -----------------------------------------------------------


class SmoothedQ(SuffixDrafter):
    """BROKEN: reports each candidate's q as half a point mass and half uniform, while the candidates are fixed
    tokens (their true q is the point mass): the acceptance test then accepts them too often."""

    def propose(self, ids, k, params, rng, nodes=None):
        found = super().propose(ids, k, params, rng, nodes)
        if found.q is None or not len(found):
            return found
        q = (0.5 * found.q + 0.5 / self.n_vocab).astype(np.float32)
        return Proposal(found.tokens, found.parents, q)

    def fresh(self):
        return SmoothedQ(self.n_vocab, self.earlier, self.datastore, self.r, self.cap)


PROMPT = [1, 2, 3, 1, 2, 4, 1, 2]  # [1, 2] was followed by 3 and by 4: two candidates, siblings in a tree


@pytest.fixture(scope="module")
def exact_t1():
    return exact_continuations(small_model(seed=11, n_layer=2), PROMPT, 3, T1)


def greedy_priors(drafter: SuffixDrafter) -> SuffixDrafter:
    """The drafter with its greedy priors at T = 1 too: the checks below judge the round's rules on trees that
    branch, which the sampled priors (L / (L + 4)) seldom draft on these short texts."""
    for calibration in drafter.calibration.values():
        calibration.sampled_offset = calibration.greedy_offset
    return drafter


def sampled_run(make, tree, verification, proposed: Counter | None = None):
    """Runs of 3 tokens after PROMPT at T=1, each with a fresh drafter from make() (as draft="suffix" makes one per
    call); the rounds each source drafted, and the rounds that drafted a tree with siblings, added to `proposed`."""
    target = small_model(seed=11, n_layer=2)
    proposed = Counter() if proposed is None else proposed

    def count(proposal, logits):
        proposed["branched"] += len(set(proposal.parents)) < len(proposal)

    def run(rng):
        drafter = make()
        settings = dict(temperature=1.0, rng=rng, tree=tree, verification=verification, on_round=count)
        out = speculative_sample(target, drafter, PROMPT, 3, K=2, **settings)
        proposed.update(drafter.proposed)
        return out

    return run


def test_sampling_with_suffix_decoding_keeps_the_target_distribution_quick(exact_t1):
    """A tree of point masses, judged by SpecInfer's rule: 2,000 runs, and 1,000 of the broken variant (which lands
    at about 3x the threshold); the full-size checks are below (slow)."""
    proposed = Counter()
    samples = sample_many(sampled_run(lambda: SuffixDrafter(6, r=flat), 4, "token", proposed), 2000)
    assert proposed["text"] > 1500 and proposed["branched"] > 1500  # most runs draft two candidates at once
    ok, stat, df = chi_square_passes(samples, exact_t1)
    assert ok, f"chi2={stat:.1f} df={df}"
    broken = sampled_run(lambda: SmoothedQ(6, r=flat), 4, "token")
    ok, stat, df = chi_square_passes(sample_many(broken, 1000), exact_t1)
    assert not ok, f"the drafter misreporting q passed (chi2={stat:.1f}, df={df})"


@pytest.mark.slow
@pytest.mark.parametrize("tree,verification", [(None, "block"), (4, "traversal"), (None, "token"), (4, "token")])
def test_sampling_with_suffix_decoding_keeps_the_target_distribution_full(exact_t1, tree, verification):
    """The full-size check, with block verification of chains and traversal verification of trees too, and earlier
    outputs (the target's replies to other prompts, in a store every run shares) read where the text has nothing."""
    target, store = small_model(seed=11, n_layer=2), SuffixIndex(EARLIER_CAPACITY)
    for seed in range(20):
        other = [seed % 6, 4, 5]
        writer = SuffixDrafter(6, earlier=store)
        writer.begin(None, None, other)
        writer.commit(other + autoregressive_sample(target, other, 8, temperature=1.0, seed=seed).tokens, None)
    proposed = Counter()
    run = sampled_run(lambda: greedy_priors(SuffixDrafter(6, earlier=store, r=flat)), tree, verification, proposed)
    ok, stat, df = chi_square_passes(sample_many(run, 10_000), exact_t1)
    assert ok, f"chi2={stat:.1f} df={df}"
    assert proposed["text"] + proposed["earlier"] > 8000 and proposed["earlier"] > 100, proposed
    assert (proposed["branched"] > 2000) == (tree is not None)  # about a third of tree runs branch
    broken = sampled_run(lambda: greedy_priors(SmoothedQ(6, earlier=store, r=flat)), tree, verification)
    ok, stat, df = chi_square_passes(sample_many(broken, N_BROKEN), exact_t1)
    assert not ok, f"the drafter misreporting q passed (chi2={stat:.1f}, df={df})"


@pytest.mark.slow
def test_a_broken_acceptance_rule_fails_the_same_check(exact_t1, monkeypatch):
    """The check's teeth against the rule rather than the drafter: after rejecting a point mass on x, the next
    token drawn from p itself (x included) instead of p with x removed."""
    monkeypatch.setattr(verify, "sampled_chain", verify_resample_target_on_reject)
    run = sampled_run(lambda: SuffixDrafter(6, r=flat), None, "token")
    ok, stat, df = chi_square_passes(sample_many(run, N_BROKEN), exact_t1)
    assert not ok, f"a broken rule passed (chi2={stat:.1f}, df={df})"


def test_each_spec_says_which_datastore_it_reads():
    """What the race prints as the draft: the shipped datastore for "suffix", none for "suffix:none", DIR's."""
    from specdec.drafters.specs import parse_draft

    assert (
        parse_draft("suffix").describe()
        == "suffix decoding (the text, earlier outputs and the datastore shipped for the target)"
    )
    assert parse_draft("suffix:none").describe() == "suffix decoding (the text, earlier outputs)"
    assert (
        parse_draft("suffix:/data/store").describe()
        == "suffix decoding (the text, earlier outputs and the datastore in /data/store)"
    )
    assert parse_draft("suffix:none+eagle").describe().startswith("suffix decoding (the text, earlier outputs), else ")
