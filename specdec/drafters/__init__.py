"""Drafters: whatever proposes the next few tokens for the target to verify.

Speculative sampling only needs, from a drafter, up to k proposed tokens and the
distribution q each was drawn from (Leviathan et al., Algorithm 1, step 1). The
interface is `Drafter` in interfaces.py (begin / propose -> Proposal / commit).
This file holds the two drafters that run a model, and `make_drafter`:

    ModelDrafter     a smaller model with its own KV cache (the papers' setting)
    EarlyExitDrafter the target itself through its first L layers, writing into
                     the target's KV cache (self-speculative decoding)

Beside them, one file each: NgramDrafter (ngram.py: prompt lookup, no model),
SuffixDrafter (suffix.py, "suffix": suffix decoding, a tree of what followed every
earlier occurrence of the text's longest repeated suffix, in the text, in earlier
outputs and in a datastore of the target's replies (datastore.py), sized by the
cost of verifying it), MedusaDrafter and EagleDrafter (medusa.py, eagle.py: heads
that read the target's hidden states), CrossVocabDrafter (crossvocab.py: a draft
model with ANOTHER tokenizer, its drafts re-spelt in the target's vocabulary by
Timor et al.'s exact rules) and LookupFirst (lookup_first.py, "ngram+eagle",
"suffix+eagle": a model-free lookup where it proposes, another drafter elsewhere).

Asked for a tree (`nodes` given), each grows one with trees.py: the two model
drafters by EAGLE-2's expansion (`tree_width` children for the most confident
nodes of each layer), the n-gram drafter as a trie of every earlier occurrence.

`make_drafter(draft, target, cross_vocab, siblings, confidence)` turns what a caller
passed as `draft` into a drafter for `target`: a GPT2 or a Llama becomes a
ModelDrafter; "ngram", "ngram:N" or "ngram:M..N" an NgramDrafter with n_max N
(default 3) and n_min M (default 1); "suffix" a SuffixDrafter over the text and its
own earlier outputs, "suffix:DIR" with the datastore in DIR too; "early_exit:L" an
EarlyExitDrafter over the target's first L layers; "eagle" the
EAGLE head shipped for the target, "eagle:DIR" or "medusa:DIR" heads trained by
`python -m specdec.train`; "ngram+X" or "suffix[:DIR]+X" (X one of those) a LookupFirst; a Drafter
(interfaces.py) is used as it is.
- cross_vocab ("tli", "slem" or "slrs"): the draft model's tokenizer differs from
  the target's, and its drafts are re-spelt in the target's vocabulary by that rule.
- siblings ("iid" or "without replacement"; None: the drafter's default): how the two
  drafters that sample a tree's children (a model, early exit) draw the siblings of one
  node; refused for any other draft.
- confidence (a bar in (0, 1]; None: the papers' fixed K): a chain ends before the
  position where the draft's own confidence that the chain survives falls below the bar
  (stopping.py), for the drafters that draw from a distribution (a model, early exit,
  Medusa and EAGLE heads, the second drafter of "ngram+X"); refused for any other.
  "auto": checked the same way, built without a bar; config.setup sets `drafter.stop`
  once the costs that set the bar are measured (costmodel.confidence_bar).

Layer: above model/ and checkpoints/. May import model/, checkpoints/ (head files), the
round's rule modules interfaces.py, sampling.py and verify/, the cost model's arithmetic (costmodel/: a
model-free drafter sizes its rounds by it), safe_io/ (reading files), and drafters/ itself;
never the samplers that use drafters, training or benchmarks (tests/test_imports.py).
"""

from __future__ import annotations

import weakref

import numpy as np

from ..checkpoints.registry import shipped_datastore, shipped_heads
from ..interfaces import Drafter, Proposal
from ..model.base import CausalLM, LanguageModel
from ..model.attention import KVCache
from ..sampling import SamplingParams, draw, greedy, probabilities
from .crossvocab import CrossVocabDrafter, check_rule
from .datastore import Datastore
from .eagle import EagleDrafter
from .lookup_first import LookupFirst
from .medusa import MedusaDrafter
from .ngram import NgramDrafter
from .specs import MODEL_FREE, lookup_shortest, parse_draft
from .stopping import ChainGate, ConfidenceStop
from .suffix import EARLIER_CAPACITY, SuffixDrafter
from .suffix_index import SuffixIndex
from .trees import SIBLINGS, model_tree


OTHER_TOKENIZER = (
    "the draft {} tokenizes text differently from the target {}: pass cross_vocab='tli' (any "
    "temperature) or 'slem' (greedy) to verify its drafts across tokenizers (--cross_vocab tli|slem)"
)
OTHER_VOCABULARY = (
    "draft and target must share a vocabulary: the draft has {} tokens, the target {}; pick a draft "
    "from the target's family (GPT-2 models all have 50257)"
)


def _draft_chain(step, new: list[int], k: int, params: SamplingParams, rng, stop: ConfidenceStop = None) -> Proposal:
    """Up to k autoregressive draft steps (step(tokens) feeds tokens, returns the last row's logits), each token
    drawn from exactly the q the acceptance test will read. stop: a confidence bar that may end the chain early."""
    tokens, q_rows, gate = [], [], stop and ChainGate(stop)
    for _ in range(k):
        logits = step(new)  # [n_vocab]
        q = None if params.greedy else probabilities(logits[None], params)[0]  # [n_vocab], filtered like the target
        if gate and not gate.opens(logits, q):
            break  # decided from q, before drawing (stopping.py)
        token = greedy(logits) if q is None else draw(q, rng)
        if gate:
            gate.drew(token, q)
        if q is not None:
            q_rows.append(q)
        tokens.append(token)
        new = [token]
    return Proposal.chain(tokens, np.stack(q_rows) if q_rows else None)  # q: [k, n_vocab]


def check_siblings(siblings: str) -> str:
    if siblings not in SIBLINGS:
        raise ValueError(f"siblings must be 'without replacement' or 'iid', got {siblings!r}")
    return siblings


class ModelDrafter:
    """A smaller model: k autoregressive steps, each drawn from its filtered distribution.

    NOTE: the token is drawn from exactly the q that the acceptance test later
    reads; testing against any other q (say, an unfiltered one) breaks
    exactness. Filtering q like the target (temperature, top-k, top-p) is not
    needed for exactness, but it makes q closer to p and raises acceptance.

        speculative_sample(target, ModelDrafter(load_model("124M")), ids, 40)
    """

    def __init__(self, model: CausalLM, tree_width=2, siblings="without replacement", stop: ConfidenceStop = None):
        self.model = model
        self.stop = stop  # a chain ends where the draft's confidence falls below the bar (stopping.py)
        self.siblings = check_siblings(siblings)  # how a sampled tree's siblings are drawn (trees.dynamic_tree)
        self.n_vocab = model.n_vocab
        self.n_ctx = model.n_ctx
        self.cache = model.new_cache()
        self.calls = 0
        self.tree_width = tree_width  # children per expanded node when asked for a tree

    def begin(self, target: CausalLM, cache: KVCache, prompt: list[int]) -> None:
        self.cache.rollback(0)

    def propose(self, ids, k, params, rng, nodes=None) -> Proposal:
        if nodes is not None:
            return self.propose_tree(ids, k, params, rng, nodes)

        def step(new):
            self.calls += 1
            return self.model.forward(new, self.cache, last_only=True)[0]

        # Catch up on the text the cache has not seen: the last emitted token, and
        # after a fully accepted round also the last draft token (never fed in).
        return _draft_chain(step, ids[self.cache.length :], k, params, rng, self.stop)

    def propose_tree(self, ids, k, params, rng, nodes: int) -> Proposal:
        """A tree of at most `nodes` drafts, depth k, grown by EAGLE-2's expansion (trees.model_tree)."""
        pending = ids[self.cache.length :]
        tree, calls = model_tree(
            self.model, self.cache, pending, k, nodes, self.tree_width, params, rng, siblings=self.siblings
        )
        self.calls += calls
        return Proposal(*tree)

    def commit(self, ids, features) -> None:
        # Keep only accepted text: everything but ids[-1], which no cache has seen.
        self.cache.rollback(min(self.cache.length, len(ids) - 1))


class EarlyExitDrafter:
    """Self-speculative drafting: the target's first `n_layer` blocks, then ln_f and the LM head.

    It writes keys/values for those layers into the *target's* cache (the values
    are exactly what the target computes there), then sets the cache length back,
    so the target's verification pass starts from the same place and rewrites
    those positions for all layers. No extra memory; a draft step costs about
    n_layer / target.n_layer of a target step plus the LM head.

        speculative_sample(target, EarlyExitDrafter(target, n_layer=6), ids, 40)  # or draft="early_exit:6"
    """

    def __init__(
        self,
        target: CausalLM,
        n_layer: int,
        tree_width: int = 2,
        siblings: str = "without replacement",
        stop: ConfidenceStop | None = None,
    ):
        if not 1 <= n_layer < target.n_layer:
            raise ValueError(f"early exit needs 1 <= L < {target.n_layer} (the target's layers), got L={n_layer}")
        self.model = target
        self.n_layer = n_layer
        self.stop = stop  # a chain ends where the draft's confidence falls below the bar (stopping.py)
        self.tree_width = tree_width  # children per expanded node when asked for a tree
        self.siblings = check_siblings(siblings)  # how a sampled tree's siblings are drawn (trees.dynamic_tree)
        self.n_vocab = target.n_vocab
        self.n_ctx = target.n_ctx
        self.cache: KVCache | None = None  # the target's cache for the current run (set by begin)
        self.calls = 0

    def begin(self, target: CausalLM, cache: KVCache, prompt: list[int]) -> None:
        if target is not self.model:
            raise ValueError("this early-exit drafter was built on a different target model")
        self.cache = cache

    def propose(self, ids, k, params, rng, nodes=None) -> Proposal:
        start = self.cache.length
        if nodes is not None:
            tree, calls = model_tree(
                self.model,
                self.cache,
                ids[start:],
                k,
                nodes,
                self.tree_width,
                params,
                rng,
                n_layer=self.n_layer,
                siblings=self.siblings,
            )
            self.calls += calls
            self.cache.rollback(start)  # the target verifies from here
            return Proposal(*tree)

        def step(new):
            self.calls += 1
            return self.model.forward(new, self.cache, last_only=True, n_layer=self.n_layer)[0]

        proposal = _draft_chain(step, ids[start:], k, params, rng, self.stop)
        self.cache.rollback(start)  # the target verifies from here
        return proposal

    def commit(self, ids, features) -> None:
        pass  # the target's own cache is the only state


def make_drafter(draft, target: CausalLM, cross_vocab=None, siblings=None, confidence=None) -> Drafter:
    """What a caller passed as `draft`, made into a drafter for `target` (the module docstring lists every kind)."""
    if cross_vocab is not None or siblings is not None or confidence is not None:
        check_drafting(draft, cross_vocab, siblings, confidence)
    if cross_vocab is not None:
        return _cross_vocab_drafter(draft, target, cross_vocab)
    stop = None if confidence in (None, "auto") else ConfidenceStop(confidence)
    if isinstance(draft, LanguageModel):  # even draft is target works: it gets its own cache
        if draft.tokenizer and target.tokenizer and not same_tokenizer(draft, target):
            raise ValueError(OTHER_TOKENIZER.format(draft.name, target.name))
        drafter = ModelDrafter(draft, siblings=siblings or "without replacement", stop=stop)
    else:
        drafter = _as_drafter(draft, target, siblings or "without replacement", stop)
    if drafter.n_vocab != target.n_vocab:
        raise ValueError(OTHER_VOCABULARY.format(drafter.n_vocab, target.n_vocab))
    return drafter


def check_drafting(draft, cross_vocab: str | None, siblings: str | None, confidence) -> None:
    """Refuse, in one line, a confidence bar or a way of drawing siblings for a draft they do not apply to."""
    if confidence is not None and (cross_vocab is not None or not _stoppable(draft)):
        raise ValueError(
            f"a draft confidence bar cuts the chains of a draft model, early_exit:L, medusa:DIR or "
            f"eagle: it does not apply to {draft if isinstance(draft, str) else type(draft).__name__}"
            + (" with cross_vocab" if cross_vocab is not None else "")
            + (
                " (a lookup's drafts are certain: their confidence is always 1)"
                if isinstance(draft, str) and parse_draft(draft).kind in MODEL_FREE
                else ""
            )
            + (
                " (a drafter object: build it with stop=ConfidenceStop(bar); a LookupFirst: its second drafter)"
                if isinstance(draft, Drafter)
                else ""
            )
        )
    if siblings is not None:
        check_siblings(siblings)
        early_exit = isinstance(draft, str) and parse_draft(draft).kind == "early_exit"
        if cross_vocab is not None or not (isinstance(draft, LanguageModel) or early_exit):
            raise ValueError(
                f"siblings applies to a draft model or early_exit:L, which sample a tree's children; "
                f"not to {draft if isinstance(draft, str) else type(draft).__name__}"
                + (" with cross_vocab" if cross_vocab is not None else "")
            )


def same_tokenizer(a, b) -> bool:
    """Whether two models' tokenizers give the same ids for the same text (a probe of digits, unicode, a control)."""
    probe = "Tokenizers must agree: 123 \u00fcn\u00efcode <|endoftext|>\n\tdef f(x):  return x"
    if a.n_vocab != b.n_vocab:
        return False  # (and a tokenizer may fail on ids the other's vocabulary lacks)
    return a.tokenizer is b.tokenizer or _spells(a.tokenizer, probe) == _spells(b.tokenizer, probe)


def _spells(tokenizer, text: str):
    try:
        return tokenizer.encode(text, allowed_special="all")
    except ValueError:  # a character this vocabulary cannot spell
        return None


def _cross_vocab_drafter(draft, target, cross_vocab: str) -> Drafter:
    if isinstance(draft, CrossVocabDrafter) and draft.rule == cross_vocab:
        return draft  # made already (race makes one for all its runs)
    check_rule(cross_vocab)
    if not isinstance(draft, LanguageModel) or draft.tokenizer is None or target.tokenizer is None:
        raise ValueError(
            f"cross_vocab verifies a draft MODEL's tokens across tokenizers: pass a GPT2 or Llama draft, "
            f"both with a tokenizer, not {draft!r:.60}"
        )
    return CrossVocabDrafter(draft, target, cross_vocab)


# Earlier outputs, one bounded index per target for the process: every drafter made from "suffix" for that target
# reads and adds to it, so a chat's turns, a benchmark's requests and a script's calls draft from each other.
_EARLIER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def suffix_drafter(datastore: str, target: CausalLM) -> SuffixDrafter:
    """What "suffix" and "suffix:DIR" build: suffix decoding over the text, this process's earlier outputs for
    the target (a bounded SuffixIndex), and a datastore: the one in DIR, else the one shipped for the target
    (checkpoints/registry.SHIPPED_DATASTORES), loaded and checked; "suffix:none" reads none."""
    folder = shipped_datastore(target.name) if datastore == "" else None if datastore == "none" else datastore
    store = Datastore.load(folder, target.n_vocab) if folder is not None else None
    earlier = _EARLIER.setdefault(target, SuffixIndex(EARLIER_CAPACITY))
    return SuffixDrafter(target.n_vocab, earlier=earlier, datastore=store)


def _stoppable(draft) -> bool:
    """Whether `draft` names a drafter that make_drafter builds with a confidence stop."""
    return isinstance(draft, LanguageModel) or (isinstance(draft, str) and parse_draft(draft).kind not in MODEL_FREE)


def _as_drafter(draft, target: CausalLM, siblings: str, stop: ConfidenceStop | None = None) -> Drafter:
    """A drafter from a spec string or a Drafter object (make_drafter makes a model's itself)."""
    if isinstance(draft, LanguageModel):
        return ModelDrafter(draft, siblings=siblings, stop=stop)
    if isinstance(draft, str):
        spec = parse_draft(draft)
        if spec.kind == "ngram":
            return NgramDrafter(target.n_vocab, n_max=spec.arg, n_min=spec.n_min or 1)
        if spec.kind == "suffix":
            return suffix_drafter(spec.arg, target)
        if spec.kind == "lookup_first":
            lookup, then = spec.parts()
            if lookup.kind == "suffix":
                looker = suffix_drafter(lookup.arg, target)
            else:
                looker = NgramDrafter(target.n_vocab, lookup.arg, lookup_shortest(lookup))
            return LookupFirst(looker, _as_drafter(str(then), target, siblings, stop))
        if spec.kind == "early_exit":
            return EarlyExitDrafter(target, spec.arg, siblings=siblings, stop=stop)
        if spec.kind == "eagle" and spec.arg == "":  # the head shipped inside specdec for this target
            return EagleDrafter.load(shipped_heads(target.name, "eagle"), target, stop=stop)
        if spec.kind in ("medusa", "eagle"):  # heads trained by `python -m specdec.train`, in folder spec.arg
            return (MedusaDrafter if spec.kind == "medusa" else EagleDrafter).load(spec.arg, target, stop=stop)
        raise ValueError(
            f"unknown drafter {draft!r}: use 'ngram', 'ngram:N', 'early_exit:L', 'medusa:DIR', 'eagle:DIR', "
            f"'suffix', 'suffix:DIR', 'ngram+eagle', 'suffix+eagle', or load the model first and pass it "
            f"(load_model({draft!r}))"
        )
    if isinstance(draft, Drafter):
        return draft
    raise TypeError(
        f"draft must be a GPT2 or Llama, 'ngram', 'early_exit:L' or a drafter (begin, propose, commit, n_vocab, n_ctx, "
        f"calls: see specdec/interfaces.py), not {type(draft).__name__}"
    )
