"""Drafters: whatever proposes the next few tokens for the target to verify.

Speculative sampling only needs, from a drafter, up to k proposed tokens and the
distribution q each was drawn from (Leviathan et al., Algorithm 1, step 1). The
interface is `Drafter` in interfaces.py (begin / propose -> Proposal / commit);
three drafters implement it:

    ModelDrafter     a smaller model with its own KV cache (the papers' setting)
    EarlyExitDrafter the target itself through its first L layers, writing into
                     the target's KV cache (self-speculative decoding)
    NgramDrafter     no model: copy what followed the last earlier occurrence of
                     the current suffix (prompt lookup decoding)

and, for a draft model with ANOTHER tokenizer, CrossVocabDrafter (crossvocab.py):
its drafts re-spelt in the target's vocabulary by Timor et al.'s exact rules; and
LookupFirst (lookup_first.py, "ngram+eagle"): prompt lookup where it finds a match,
another drafter elsewhere; and SuffixDrafter (suffix.py, "suffix"): suffix decoding, a tree of
what followed every earlier occurrence of the text's longest repeated suffix, in the text, in earlier
outputs and in a datastore of the target's replies (datastore.py), sized by the cost of verifying it.

Asked for a tree (`nodes` given), each grows one with trees.py: the two model
drafters by EAGLE-2's expansion (`tree_width` children for the most confident
nodes of each layer), the n-gram drafter as a trie of every earlier occurrence.

Layer: above model/ and checkpoints/. May import model/, checkpoints/ (head files), the
round's rule modules interfaces.py, sampling.py and verify/, the cost model's arithmetic (costmodel/: a
model-free drafter sizes its rounds by it), words.py (message text), and drafters/ itself;
never the samplers that use drafters, training or benchmarks (tests/test_imports.py).
"""

from __future__ import annotations

import numpy as np

from ..checkpoints.registry import shipped_heads
from ..interfaces import Drafter, Proposal
from ..model.base import CausalLM, LanguageModel
from ..model.cache import KVCache
from ..sampling import SamplingParams, draw, greedy, probabilities
from .crossvocab import CrossVocabDrafter, check_rule
from .datastore import Datastore
from .eagle import EagleDrafter
from .lookup_first import SHORTEST_MATCH, LookupFirst
from .medusa import MedusaDrafter
from .specs import MODEL_FREE, parse_draft
from .stopping import ChainGate, ConfidenceStop
from .suffix import EARLIER_CAPACITY, SuffixDrafter, SuffixIndex
from .trees import SIBLINGS, model_tree, ngram_tree, point_masses


def _draft_chain(step, new: list[int], k: int, params: SamplingParams, rng: np.random.Generator,
                 stop: ConfidenceStop | None = None) -> Proposal:  # fmt: skip
    """Up to k autoregressive draft steps. step(tokens) feeds tokens, returns the last row's logits.
    stop: end the chain before a position where the draft's path confidence falls below its bar."""
    tokens, q_rows, gate = [], [], ChainGate(stop)
    for _ in range(k):
        logits = step(new)  # [n_vocab]
        q = None if params.greedy else probabilities(logits[None], params)[0]  # [n_vocab], filtered like the target
        if not gate.opens(logits, q):
            break  # decided from q, before drawing (stopping.py)
        token = greedy(logits) if q is None else draw(q, rng)
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
    """A draft GPT-2: k autoregressive steps, each drawn from its filtered distribution.

    NOTE: the token is drawn from exactly the q that the acceptance test later
    reads; testing against any other q (say, an unfiltered one) breaks
    exactness. Filtering q like the target (temperature, top-k, top-p) is not
    needed for exactness, but it makes q closer to p and raises acceptance.

        speculative_sample(target, ModelDrafter(load_model("124M")), ids, 40)
    """

    def __init__(self, model: CausalLM, tree_width: int = 2, siblings: str = "without replacement",
                 stop: ConfidenceStop | None = None):  # fmt: skip
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
        # Catch up on the text the cache has not seen: the last emitted token, and
        # after a fully accepted round also the last draft token (never fed in).
        if nodes is not None:
            pending = ids[self.cache.length :]
            tree, calls = model_tree(self.model, self.cache, pending, k, nodes, self.tree_width, params, rng,
                                     siblings=self.siblings)  # fmt: skip
            self.calls += calls
            return Proposal(*tree)

        def step(new):
            self.calls += 1
            return self.model.forward(new, self.cache, last_only=True)[0]

        return _draft_chain(step, ids[self.cache.length :], k, params, rng, self.stop)

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

    def __init__(self, target: CausalLM, n_layer: int, tree_width: int = 2, siblings: str = "without replacement",
                 stop: ConfidenceStop | None = None):  # fmt: skip
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
            tree, calls = model_tree(self.model, self.cache, ids[start:], k, nodes, self.tree_width, params, rng,
                                     n_layer=self.n_layer, siblings=self.siblings)  # fmt: skip
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


class NgramDrafter:
    """Prompt lookup: propose what followed the most recent earlier match of the text's tail.

    For n from `n_max` down to `n_min`, look for the last n tokens of the text
    earlier in the text; at the most recent match, propose the (up to k) tokens
    that followed it. No match: no proposal, and the round is a plain target step.

    The proposal is deterministic, so its distribution q is a point mass on the
    proposed token x. Leviathan et al.'s rule then reads:
        accept x with probability min(1, p(x) / q(x)) = min(1, p(x) / 1) = p(x)
        on rejection draw from norm(max(0, p - q)):
            for y != x: max(0, p(y) - 0) = p(y);  for x: max(0, p(x) - 1) = 0
        i.e. from p with x removed, renormalised by 1 - p(x).
    The output is still exactly p: P(x) = p(x) (accepted), and for y != x,
    P(y) = (1 - p(x)) * p(y) / (1 - p(x)) = p(y). The same general code in
    verify/ handles it, with q given as one-hot rows.
    """

    def __init__(self, n_vocab: int, n_max: int = 3, n_min: int = 1):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"n-gram sizes need 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
        self.n_vocab = n_vocab
        self.n_max, self.n_min = n_max, n_min
        self.n_ctx = None  # no context limit of its own
        self.calls = 0

    def lookup(self, ids: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the tail of ids.

        The copy may run past the end of the text into its own output, as in
        LZ77: in a loop of period P the latest match starts P tokens back, and
        copying on continues the loop for all k tokens instead of stopping after P.

        >>> NgramDrafter(10).lookup([7, 1, 2, 1, 2], 5)  # tail [1, 2] last seen at 1, period 2
        [1, 2, 1, 2, 1]
        """
        text = np.asarray(ids)
        for n in range(min(self.n_max, len(ids) - 1), self.n_min - 1, -1):
            tail = text[-n:]
            # Windows starting at 0 .. len-n-1 (the tail itself excluded).
            windows = np.lib.stride_tricks.sliding_window_view(text[:-1], n)  # [len-n, n]
            hits = np.flatnonzero((windows == tail).all(axis=1))
            if len(hits):
                follow = int(hits[-1]) + n  # the token after the most recent match
                out: list[int] = []
                for i in range(k):
                    j = follow + i
                    out.append(int(text[j]) if j < len(text) else out[j - len(text)])
                return out
        return []

    def fresh(self) -> NgramDrafter:
        """A drafter for another sequence (a batch gives each row one): the same n-gram sizes."""
        return NgramDrafter(self.n_vocab, self.n_max, self.n_min)

    def begin(self, target: CausalLM, cache: KVCache, prompt: list[int]) -> None:
        pass  # stateless: the text itself is the table

    def propose(self, ids, k, params, rng, nodes=None) -> Proposal:
        # A chain: the latest occurrence; a tree: a trie of them all. Either is deterministic,
        # so q is a point mass on each token (see above).
        if nodes is None:
            tokens, parents = self.lookup(ids, k), None
        else:
            tokens, parents = ngram_tree(ids, k, nodes, self.n_max, self.n_min)
        q = None if params.greedy or not tokens else point_masses(tokens, self.n_vocab)
        return Proposal.chain(tokens, q) if parents is None else Proposal(tokens, parents, q)

    def commit(self, ids, features) -> None:
        pass


def make_drafter(draft, target: CausalLM, cross_vocab: str | None = None, siblings: str | None = None,
                 confidence: float | None = None) -> Drafter:  # fmt: skip
    """Turn what a caller passed as `draft` into a drafter for `target`.

    A GPT2 or a Llama becomes a ModelDrafter; "ngram" or "ngram:N" an NgramDrafter with
    n_max N (default 3); "early_exit:L" an EarlyExitDrafter over the target's
    first L layers; "suffix" a SuffixDrafter over the text and its own earlier outputs, "suffix:DIR" with
    the datastore in DIR too; "ngram+X" or "suffix[:DIR]+X" (X early_exit:L, medusa:DIR or eagle[:DIR]) a
    LookupFirst: the lookup where it proposes, X elsewhere; a Drafter (interfaces.py) is used as it is.
    cross_vocab ("tli", "slem" or "slrs"): the draft model's tokenizer differs from the target's, and
    its drafts are re-spelt in the target's vocabulary by that rule (crossvocab.py).
    siblings ("iid" or "without replacement"; None: the drafter's default): how the two drafters
    that sample a tree's children (a model, early exit) draw the siblings of one node; refused
    for any other draft.
    confidence (a bar in (0, 1]; None: the papers' fixed K): a chain ends before the position where the
    draft's own confidence that the chain survives falls below the bar (stopping.py), for the drafters
    that draw from a distribution (a model, early exit, Medusa and EAGLE heads, the second drafter of
    "ngram+X"); refused for any other.
    "auto": checked the same way, built without a bar; the caller sets `drafter.stop` once the costs that
    set the bar are measured (costmodel.confidence_bar; speculative_sample and race do).
    """
    stop = None if confidence in (None, "auto") else ConfidenceStop(confidence)
    if confidence is not None and (cross_vocab is not None or not _stoppable(draft)):
        raise ValueError(f"a draft confidence bar cuts the chains of a draft model, early_exit:L, medusa:DIR or "
                         f"eagle: it does not apply to {draft if isinstance(draft, str) else type(draft).__name__}"
                         + (" with cross_vocab" if cross_vocab is not None else "")
                         + (" (a lookup's drafts are certain: their confidence is always 1)"
                            if isinstance(draft, str) and parse_draft(draft).kind in MODEL_FREE else "")
                         + (" (a drafter object: build it with stop=ConfidenceStop(bar); a LookupFirst: its "
                            "second drafter)" if isinstance(draft, Drafter) else ""))  # fmt: skip
    if siblings is not None:
        check_siblings(siblings)
        early_exit = isinstance(draft, str) and parse_draft(draft).kind == "early_exit"
        if cross_vocab is not None or not (isinstance(draft, LanguageModel) or early_exit):
            raise ValueError(f"siblings applies to a draft model or early_exit:L, which sample a tree's children; "
                             f"not to {draft if isinstance(draft, str) else type(draft).__name__}"
                             + (" with cross_vocab" if cross_vocab is not None else ""))  # fmt: skip
    if cross_vocab is not None:
        return _cross_vocab_drafter(draft, target, cross_vocab)
    drafter = _as_drafter(draft, target, siblings or "without replacement", stop)
    if isinstance(draft, LanguageModel) and draft.tokenizer and target.tokenizer and not same_tokenizer(draft, target):
        raise ValueError(f"the draft {draft.name} tokenizes text differently from the target {target.name}: pass "
                         "cross_vocab='tli' (any temperature) or 'slem' (greedy) to verify its drafts across "
                         "tokenizers (--cross_vocab tli|slem)")  # fmt: skip
    if drafter.n_vocab != target.n_vocab:
        raise ValueError(
            f"draft and target must share a vocabulary: the draft has {drafter.n_vocab} tokens, "
            f"the target {target.n_vocab}; pick a draft from the target's family (GPT-2 models all have 50257)"
        )
    return drafter


def same_tokenizer(a, b) -> bool:
    """Whether two models with tokenizers read text the same way (the same ids for the same text)."""
    if a.tokenizer is b.tokenizer:
        return a.n_vocab == b.n_vocab
    probe = "Tokenizers must agree: 123 \u00fcn\u00efcode <|endoftext|>\n\tdef f(x):  return x"
    return a.n_vocab == b.n_vocab and _spells(a.tokenizer, probe) == _spells(b.tokenizer, probe)


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
        raise ValueError(f"cross_vocab verifies a draft MODEL's tokens across tokenizers: pass a GPT2 or Llama draft, "
                         f"both with a tokenizer, not {draft!r:.60}")  # fmt: skip
    return CrossVocabDrafter(draft, target, cross_vocab)


def suffix_drafter(datastore: str, target: CausalLM) -> SuffixDrafter:
    """What "suffix" and "suffix:DIR" build: suffix decoding over the text and the drafter's own earlier outputs
    (kept across its runs: a bounded SuffixIndex), and the datastore in DIR (loaded and checked) if one is given."""
    store = Datastore.load(datastore, target.n_vocab) if datastore else None
    return SuffixDrafter(target.n_vocab, earlier=SuffixIndex(EARLIER_CAPACITY), datastore=store)


def _stoppable(draft) -> bool:
    """Whether `draft` names a drafter that make_drafter builds with a confidence stop."""
    return isinstance(draft, LanguageModel) or (isinstance(draft, str) and parse_draft(draft).kind not in MODEL_FREE)


def _as_drafter(draft, target: CausalLM, siblings: str, stop: ConfidenceStop | None = None) -> Drafter:
    if isinstance(draft, LanguageModel):
        return ModelDrafter(draft, siblings=siblings, stop=stop)  # even draft is target works: it gets its own cache
    if isinstance(draft, str):
        spec = parse_draft(draft)
        if spec.kind == "ngram":
            return NgramDrafter(target.n_vocab, n_max=spec.arg)
        if spec.kind == "suffix":
            return suffix_drafter(spec.arg, target)
        if spec.kind == "lookup_first":
            lookup, then = spec.parts()
            if lookup.kind == "suffix":
                looker = suffix_drafter(lookup.arg, target)
            else:
                looker = NgramDrafter(target.n_vocab, lookup.arg, min(SHORTEST_MATCH, lookup.arg))
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
