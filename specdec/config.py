"""One set-up for a decoding run: the settings grouped in a Config, the request checked, the drafter built.

Every entry point (speculative_sample, autoregressive_sample, the batch samplers, the race, the
command line) builds its run here, so each rule is written once and says the same thing everywhere.

A `Config` holds every setting but the models, the prompt and the length (as transformers groups
them in a GenerationConfig). The samplers take its fields by name (`K=6, top_p=0.9, chat=True`) or
as one object (`config=Config(...)`):

    K                 drafts per round: an int in 1..32, "adaptive" (one more after a round that kept
                      all, one fewer after a rejection), "auto" (the cost model's best k each round, from
                      costs timed once per process: timing.costs_for), or a KPolicy. Left out: 4, or for
                      a drafter that sizes its own rounds (suffix decoding) the most it may draft, 32
    temperature, top_k, top_p
                      the target's sampling (sampling.SamplingParams); temperature 0 is greedy
    chat              the prompt is a user message to a chat model, wrapped in its template once;
                      decoding stops after the token that ends the reply
    allow_special     control strings typed in the prompt ("<|im_end|>") become control tokens;
                      by default they stay plain text (model/tokenizer.encode_text)
    tree              None drafts a chain of K tokens; N a tree of up to N tokens and depth K per
                      round; "auto" lets the tree cost model (costmodel/trees.py) pick N each round
    verification      how drafts are judged: "token" (draft by draft, the papers' rule) or "block"
                      (jointly, Sun et al.: exact too, never fewer tokens per round in expectation)
                      for a chain; "token" (SpecInfer), "spectr" (SpecTr's k-sequential selection,
                      needing siblings drawn i.i.d.) or "traversal" (Weng et al.) for a tree
    acceptance        "exact", or Medusa's "typical": faster, LOSSY, opt-in only
    draft_confidence  a bar in (0, 1]: each chain ends where the draft's own confidence that it
                      survives falls below it (drafters/stopping.py); "auto": the bar the measured
                      costs set, c + r(2) - 1 (costmodel.confidence_bar). Chains only.
    cross_vocab       a draft model with ANOTHER tokenizer, verified exactly by Timor et al.'s
                      rules (drafters/crossvocab.py): "tli", "slem" (greedy only) or "slrs"
    siblings          how a draft model or early exit draws a sampled tree's siblings: "without
                      replacement" (the default) or "iid" (what "spectr" needs)
    k_max             the most drafts "adaptive" and "auto" may ask for

`setup(target, draft, prompt, n_tokens, config)` checks all of it against the models and returns
a `Setup`: the checked `Request` (the prompt as the model reads it, its settings), the drafter
(drafters.make_drafter), and K and the tree as the round asks for them. The rules a request obeys:
- text is plain text: a control string typed in it stays text unless allow_special;
- an empty prompt (text or ids) starts from the model's end-of-text token, as GPT-2 samples
  unconditionally; with chat, empty text is an empty user message;
- n_tokens is at least 1, and prompt + n_tokens fit the context window;
- the verification rule is one that is exact for this drafter and shape (check_verification).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, replace

import numpy as np

from .costmodel import K_LIMIT, K_NAMES, AdaptiveK, CostModelK, TreePolicy, confidence_bar
from .costmodel.trees import make_tree_policy
from .drafters import make_drafter
from .drafters.stopping import ConfidenceStop
from .interfaces import Drafter, KPolicy
from .model.base import CausalLM
from .model.tokenizer import ENDOFTEXT, chat_prompt, encode_text
from .sampling import SamplingParams
from .timing import costs_for
from .verify import ACCEPTANCE, TREE_VERIFICATION, VERIFICATION

TREES_REFUSED = (
    "a draft confidence bar (draft_confidence=, --draft_confidence) cuts chains; a tree is already "
    "grown by its draft's confidence (EAGLE-2's expansion): give one or the other"
)


NO_TOKENIZER = (
    "the prompt is text but this model has no tokenizer: pass token ids (encode the text with the "
    "tokenizer the model was trained with)"
)
BAD_ID = "prompt token ids must be whole numbers in 0..{0}; got {1!r:.40} at position {2}"


@dataclass(frozen=True)
class Config:
    """Every setting of a run but the models, the prompt and the length (the module docstring says each)."""

    K: int | str | KPolicy | None = None  # an int, "adaptive", "auto" or a KPolicy; None: the drafter's (4, or 32)
    temperature: float = 0.0  # 0: greedy
    top_k: int | None = None
    top_p: float | None = None
    chat: bool = False
    allow_special: bool = False
    tree: int | str | object | None = None  # None: a chain; N; "auto"; or a tree policy
    verification: str = "token"  # "token" or "block" (chains); "token", "spectr" or "traversal" (trees)
    acceptance: str = "exact"  # or "typical" (lossy)
    draft_confidence: float | str | None = None  # a bar in (0, 1], or "auto"
    cross_vocab: str | None = None  # "tli", "slem" or "slrs"
    siblings: str | None = None  # "iid" or "without replacement" (None: the drafter's default)
    k_max: int = 8

    def __post_init__(self):
        if self.K is not None and not isinstance(self.K, KPolicy):
            object.__setattr__(self, "K", parse_k(self.K))
        whole_number(self.k_max, "k_max", 1, K_LIMIT)

    @property
    def params(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)


def make_config(config: Config | None = None, K=None, temperature: float | None = None, **settings) -> Config:
    """`config` (default Config()) with these settings by name; K and temperature None: as the config has them."""
    given = {name: value for name, value in (("K", K), ("temperature", temperature)) if value is not None}
    return replace(config or Config(), **given, **settings)


def parse_k(spec) -> int | str:
    """K as a round asks for it, from a string, an int or a NumPy int: an int in 1..K_LIMIT, "adaptive" or "auto"."""
    if isinstance(spec, str):
        if spec in K_NAMES:
            return spec
        spec = int(spec) if spec.strip().lstrip("-").isdigit() else spec
    if isinstance(spec, bool) or not isinstance(spec, numbers.Integral):
        raise ValueError(f"K must be an integer >= 1, 'adaptive' or 'auto', not {spec!r}")
    if spec < 1:
        raise ValueError(f"K must be at least 1 (it is the number of draft tokens per round), got {spec}")
    if spec > K_LIMIT:
        raise ValueError(f"K must be at most {K_LIMIT} (a verification pass over K+1 tokens), got {spec}")
    return int(spec)


@dataclass
class Setup:
    """A run, built once by `setup`: decode_speculative runs it, the race many times over."""

    target: CausalLM
    drafter: Drafter | None  # None: no speculative decoder runs (draft=None)
    request: Request
    config: Config
    costs: object | None = None  # timing.Costs where "auto" (K or the bar) needed them, or the race asked

    def k_policy(self) -> KPolicy | None:
        """A fresh K policy for one run; None for a fixed K, which every round drafts (the papers' setting)."""
        K, k_max = self.config.K, self.config.k_max
        if K == "adaptive":
            return AdaptiveK(min(4, k_max), 1, k_max)
        if K == "auto":
            return CostModelK(self.costs.c, self.costs.r, k_max=k_max)
        return None if isinstance(K, int) else K  # a fixed K needs no policy; a KPolicy is used as it is

    def tree_policy(self):
        """A fresh tree policy for one run (None for chains): a node budget, or "auto" priced by the costs."""
        tree = self.config.tree
        if tree == "auto" and self.costs is not None:
            return TreePolicy(self.costs.c, self.costs.r)
        return None if tree is None else make_tree_policy(tree, self.drafter, self.target)

    def request_for(self, prompt) -> Request:
        """Another prompt, checked with this run's n_tokens and settings (a batch's other rows)."""
        return make_request(self.target, prompt, self.request.n_tokens, self.config, self.drafter)


def setup(target: CausalLM, draft, prompt, n_tokens: int, config: Config, request=None, costs=False, say=None) -> Setup:
    """A run checked against the models and built once: the drafter (None for draft None), the request (or `request`,
    made already), K, the tree, and the costs where needed or asked (costs=True; say(line) is told when timed)."""
    c = config
    drafter = None if draft is None else make_drafter(draft, target, c.cross_vocab, c.siblings, c.draft_confidence)
    c = c if c.K is not None else replace(c, K=getattr(drafter, "k_default", 4))  # left out: the drafter's own
    if request is None:
        request = make_request(target, prompt, n_tokens, c, drafter)
    else:
        request = with_settings(same_request(request, n_tokens, c.chat), c, drafter)
    if c.tree is not None:
        check_tree(c, drafter, target)
    run = Setup(target, drafter, request, c)
    sizes_itself = getattr(drafter, "r", 0) is None  # suffix decoding without an r(m) of its own: the target's
    if drafter is not None and (costs or sizes_itself or "auto" in (c.K, c.draft_confidence)):
        run.costs = costs_for(target, draft, drafter, request.prompt, widest_pass(c), say)
    if sizes_itself:
        drafter.r = run.costs.r
    if c.draft_confidence == "auto":
        drafter.stop = ConfidenceStop(confidence_bar(run.costs.c, run.costs.r))
    return run


def same_request(request: Request, n_tokens: int, chat: bool) -> Request:
    """A request made already, refused unless made for this n_tokens and chat."""
    if request.n_tokens != n_tokens or (request.stop is not None) != bool(chat):
        raise ValueError(
            f"request= was made for {request.n_tokens} tokens with chat={request.stop is not None}, the "
            f"run asks {n_tokens} with chat={chat}: make it from the same prompt, n_tokens and chat"
        )
    return request


def check_tree(config: Config, drafter, target: CausalLM) -> None:
    """A tree's setting checked: a budget, "auto" or a policy, and no draft confidence bar beside it."""
    if drafter is None or config.draft_confidence is not None:
        raise ValueError(TREES_REFUSED if drafter is not None else "tree= shapes the drafts: it needs a draft")
    make_tree_policy(config.tree, drafter, target)  # refuses what is neither


def widest_pass(config: Config) -> int:
    """The most tokens a verification pass of this run can hold: what the costs' r(m) must reach."""
    m_max = max(config.k_max, config.K if isinstance(config.K, int) else 0) + 1
    tree = config.tree
    return m_max if tree is None else max(m_max, (tree if isinstance(tree, int) else TreePolicy(0.0).n_max) + 1)


@dataclass(frozen=True)
class Request:
    """A checked request: build it with make_request, which applies every rule below once."""

    prompt: list[int]  # token ids as the model reads them (text encoded, the chat template applied)
    n_tokens: int  # new tokens wanted, >= 1 (a chat reply may end sooner)
    params: SamplingParams
    stop: int | None = None  # the token ending a chat reply (decoding stops after it); None when not chatting
    acceptance: str = "exact"  # or "typical" (lossy)
    verification: str = "token"  # how drafts are judged (check_verification)
    template_tokens: int = 0  # how many of the prompt's tokens are the chat template (0 when not chatting)


def make_request(model: CausalLM, prompt, n_tokens: int, config: Config | None = None, drafter=None) -> Request:
    """The prompt as the model reads it, n_tokens and config's settings, checked (the module docstring's rules)."""
    config = config or Config()
    ids = check_request(model, prompt, n_tokens, config.chat, config.allow_special)
    stop = end_of_reply(model) if config.chat else None
    template = len(ids) - len(encode_text(model.tokenizer, prompt, config.allow_special)) if config.chat else 0
    return with_settings(Request(ids, int(n_tokens), config.params, stop, template_tokens=template), config, drafter)


def with_settings(request: Request, config: Config, drafter=None) -> Request:
    """A made request (its prompt not read again) with config's sampling and verification, checked for the drafter."""
    if hasattr(drafter, "check"):  # a drafter serving only some settings (cross-vocabulary SLEM: greedy only)
        drafter.check(config.params)
    if config.acceptance not in ACCEPTANCE:
        raise ValueError(f"acceptance must be 'exact' or 'typical' (lossy), got {config.acceptance!r}")
    if config.verification != "token":
        check_verification(config.verification, config.tree, config.acceptance, getattr(drafter, "siblings", None))
    if config.tree is not None and getattr(drafter, "stop", None) is not None:
        raise ValueError(TREES_REFUSED)
    return replace(request, params=config.params, acceptance=config.acceptance, verification=config.verification)


def check_request(model: CausalLM, prompt, n_tokens: int, chat: bool = False, allow_special: bool = False) -> list[int]:
    """The prompt as the model reads it, a list of ints: the rules of the module docstring, checked."""
    if chat:
        prompt = chat_text(model, prompt, allow_special)
    if isinstance(prompt, str):
        if model.tokenizer is None:
            raise ValueError(NO_TOKENIZER)
        prompt = encode_text(model.tokenizer, prompt, allow_special)
    prompt = check_token_ids(prompt, model.n_vocab) or start_token(model)
    n_tokens = whole_number(n_tokens, "n_tokens", 1)
    if len(prompt) + n_tokens > model.n_ctx:
        raise ValueError(too_long(len(prompt), n_tokens, model.n_ctx))
    return prompt


def chat_text(model: CausalLM, prompt, allow_special: bool) -> str:
    """A user message wrapped in the model's chat template (ChatML), refused unless text to a chat model."""
    end_of_reply(model)  # checks that the model has a chat template
    if not isinstance(prompt, str):
        raise ValueError("chat=True wraps a text prompt as a user message: pass text, not token ids")
    return chat_prompt(model.tokenizer, prompt, allow_special=allow_special)


def start_token(model: CausalLM) -> list[int]:
    """What an empty prompt starts from: the model's end-of-text token, as GPT-2 samples unconditionally."""
    if ENDOFTEXT not in getattr(model.tokenizer, "special_tokens_set", ()):
        raise ValueError(
            "the prompt is empty and this model has no end-of-text token to start from: give the "
            "model at least one token to condition on"
        )
    return [model.tokenizer.eot_token]


def too_long(n_prompt: int, n_tokens: int, n_ctx: int) -> str:
    """What to do when a prompt and n_tokens do not fit the context window, in one line."""
    room = n_ctx - n_prompt
    if room >= 1:
        advice = f"shorten the prompt or ask for at most {room} tokens"
    elif n_tokens < n_ctx:
        advice = f"shorten the prompt to at most {n_ctx - n_tokens} tokens"
    else:
        advice = f"shorten the prompt and ask for fewer than {n_ctx} tokens"
    return f"prompt ({n_prompt} tokens) + n_tokens ({n_tokens}) exceeds the context window of {n_ctx}: {advice}"


def end_of_reply(model: CausalLM) -> int:
    """The token that ends a chat model's reply (<|im_end|>), after which decoding stops."""
    special = getattr(model.tokenizer, "_special_tokens", {}) if model.tokenizer is not None else {}
    if "<|im_start|>" not in special or "<|im_end|>" not in special:
        raise ValueError(
            f"chat needs a chat model (one whose tokenizer has <|im_start|> and <|im_end|>, such as "
            f"smollm2-135m); {model.name} has none"
        )
    return special["<|im_end|>"]


def check_token_ids(ids, n_vocab: int) -> list[int]:
    """A flat list, tuple or 1-D integer array of token ids in 0..n_vocab-1, as a list of ints. NOTE: checked one
    by one as Python values: np.asarray would overflow on 2**70, truncate 2.7, flatten [[1, 2], [3]], take True as 1."""
    if isinstance(ids, np.ndarray):
        ids = array_ids(ids)
    elif not isinstance(ids, (list, tuple, range)):
        raise ValueError(f"the prompt must be text or a flat list of token ids, got {type(ids).__name__}")
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < n_vocab:
            raise ValueError(BAD_ID.format(n_vocab - 1, t, i))
    return [int(t) for t in ids]


def array_ids(ids: np.ndarray) -> list:
    """A 1-D integer array's token ids as Python values (check_token_ids checks each)."""
    if ids.ndim != 1:
        raise ValueError(f"the prompt must be text or a flat list of token ids, got a {ids.ndim}-D array")
    if ids.size and ids.dtype.kind not in "iu":
        raise ValueError(f"the prompt must be text or a flat list of token ids, got an array of {ids.dtype}")
    return ids.tolist()


def whole_number(value, name: str, low: int = 0, high: int | None = None) -> int:
    """value as an int if a whole number in low..high (int or NumPy integer, no bool), else a ValueError naming it."""
    ok = not isinstance(value, bool) and isinstance(value, numbers.Integral)
    if ok and value >= low and (high is None or value <= high):
        return int(value)
    limits = f">= {low}" if high is None else f"in {low}..{high}"
    raise ValueError(f"{name} must be {limits} (a whole number), got {value!r:.80}")


def check_seed(seed, name: str = "seed") -> int | None:
    """None (fresh randomness) or a whole number >= 0."""
    return None if seed is None else whole_number(seed, name)


def make_rng(seed: int | None, rng: np.random.Generator | None) -> np.random.Generator:
    if seed is not None and rng is not None:
        raise ValueError("pass either seed or rng, not both")
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy.random.Generator (np.random.default_rng(seed)), got {rng!r:.80}")
    return rng if rng is not None else np.random.default_rng(check_seed(seed))


def check_verification(verification: str, tree, acceptance: str = "exact", siblings: str | None = None) -> None:
    """Refuse, in one line each, the verification settings that are unknown or would not be exact.

    siblings: how the drafter draws a sampled tree's children of one node, "iid" or "without
    replacement" (a model or early-exit drafter's `siblings`), None for drafters that do not draw
    them (n-gram tries, heads, cross-vocabulary). The API, race and the command line all ask here;
    the messages name both spellings (tree=N / --tree N).
    """
    if verification not in VERIFICATION + TREE_VERIFICATION:
        raise ValueError(f"verification must be 'token', 'block', 'spectr' or 'traversal', got {verification!r}")
    if verification in ("block", "spectr", "traversal") and acceptance != "exact":
        raise ValueError(f"verification {verification!r} is an exact rule: leave out acceptance='typical' (lossy)")
    if verification == "block" and tree is not None:
        raise ValueError(
            "verification 'block' judges a chain jointly: leave out tree= (--tree), or judge the tree "
            "with 'traversal' (block verification read along every path)"
        )
    if verification in ("spectr", "traversal") and tree is None:
        chain_rule = "block" if verification == "traversal" else "token"
        raise ValueError(
            f"verification {verification!r} judges trees: pass tree=N (--tree N); on a chain it is "
            f"verification {chain_rule!r}"
        )
    if verification == "spectr" and siblings != "iid":
        raise ValueError(
            "verification 'spectr' needs a tree's siblings drawn i.i.d. (SpecTr's proof): a draft "
            "model or early exit with siblings='iid' (--siblings iid), or verification 'token'"
        )
