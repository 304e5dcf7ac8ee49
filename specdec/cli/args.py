"""The command line's flags: parsed and checked, every one that needs no model, before anything is downloaded.

Flags are strict (cli/flags.py): no abbreviations, `--k-max` and `--k_max` alike. A flag that
contradicts the others (`--draft_confidence` with --draft ngram, `--k_max 2` with --K 4) is refused
with one line saying why; one that is merely redundant (`--seed` or `--top_k` at temperature 0) is
accepted with a note on standard error, so that a script passing it still runs: those rules are
cli/rules.py's. With no --target_model_size the run is the embedded default (cli/defaults.py).
"""

from __future__ import annotations

import argparse
import textwrap

from .. import __version__
from ..checkpoints import draft as shipped_draft
from ..checkpoints import names, registry
from ..checkpoints.hub import default_models_dir, resolve_model
from ..checkpoints.pins import WHEELS
from ..checkpoints.sizes import human_size as human
from ..config import Config, check_seed, parse_k, whole_number
from ..costmodel import K_LIMIT
from ..drafters.crossvocab import check_rule
from ..drafters.specs import DraftSpec, parse_draft
from ..drafters.stopping import parse_confidence
from ..sampling import SamplingParams
from ..model.fast import tuning
from . import flags
from .rules import check_cli_verification, check_models_dir, check_names, note_redundant, refuse_ignored
from .defaults import DEFAULT_RUN, GPT2_DRAFT, GPT2_PAIR, GPT2_PROMPT
from .equivalent import ENGINES

GPT2_FOOTPRINT = names.footprint(["355M", "124M"])  # (download, kept layout) bytes of the GPT-2 pair


def parse_args(argv=None, prog: str = "specdec") -> argparse.Namespace:
    """Parse and check every flag that needs no model, before anything is downloaded.

    With no --target_model_size the run is the embedded default (cli/defaults.py: DEFAULT_RUN) for every flag
    left out; a named target gets GPT-2's draft and prompt instead. A flag that contradicts the others is
    refused (refuse_ignored); one that is merely redundant is accepted with a note (note_redundant).
    """
    p = flags.Parser(
        prog=prog,
        usage="%(prog)s [flags]   or   %(prog)s cache [--remove NAME]",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"specdec {__version__}")
    run = p.add_argument_group("the run").add_argument
    run(
        "--prompt",
        metavar="TEXT",
        help="the text to continue (with --chat, the user's message); - reads standard input; control strings "
        "typed in it (<|endoftext|>) stay text (default: a chat request, or GPT-2's prompt for a named model)",
    )
    run("--prompt_file", metavar="PATH", help="the prompt from a file or pipe (UTF-8; with --batch, one per line)")
    run(
        "--chat",
        action="store_true",
        help="send the prompt as a user message in the chat template (on with the default model)",
    )
    run(
        "--n_tokens_to_generate",
        "--max_new_tokens",
        type=int,
        default=40,
        metavar="N",
        help="new tokens (default: %(default)s; 64 on the default request)",
    )
    run(
        "--target_model_size",
        metavar="MODEL",
        help=f"the model whose output we want (default: {DEFAULT_RUN.target}): {model_names()}; a Hub repo id, a "
        "local folder or a Llama GGUF file",
    )
    run("--batch", type=int, metavar="N", help="decode the first N lines of --prompt_file together")
    run("--only", choices=["autoregressive", "speculative"], help="run one decoder only")
    run("--repeats", type=int, default=3, metavar="N", help="timed runs per decoder, interleaved (default: 3)")
    run("--no_warmup", action="store_true", help="skip the short untimed warm-up run")
    run("--float64", action="store_true", help="the target in float64: greedy outputs agree even at near-ties")
    draft = p.add_argument_group("the drafter").add_argument
    draft(
        "--draft_model_size",
        "--draft",
        dest="draft",
        metavar="DRAFT",
        help=f"a model as for --target_model_size; ngram[:N] (prompt lookup of suffixes of up to N tokens); "
        f"early_exit:L (the target's first L layers); eagle (the EAGLE head shipped for {shipped_heads()}); "
        f"{shipped_draft.NAME} (for {shipped_draft.TARGET}); medusa:DIR, eagle:DIR (trained heads); ngram+X "
        f"(the lookup first, X where it finds nothing) (default: {DEFAULT_RUN.draft} for the default model, "
        f"else {GPT2_DRAFT})",
    )
    draft("--K", help="drafts per round: 1..32, auto or adaptive (default 4; suffix sizes its own, up to 32)")
    draft("--k_max", type=int, default=8, metavar="N", help="the largest K of auto and adaptive (default: 8)")
    draft(
        "--draft_confidence",
        metavar="P|auto",
        help="end a chain where the draft's confidence in it falls below P in (0, 1]; auto: the bar the measured "
        "costs set (default: auto for the default model's drafter, else none)",
    )
    draft(
        "--ngram_max",
        "--prompt_lookup_max",
        type=int,
        default=3,
        metavar="N",
        help="the longest suffix --draft ngram matches (default: 3)",
    )
    draft(
        "--prompt_lookup_min",
        "--draft_min",
        type=int,
        metavar="N",
        help="the shortest suffix prompt lookup matches, in tokens (default: 1 for ngram, 2 for ngram+X)",
    )
    draft("--tree", metavar="N|auto", help="draft a tree of up to N tokens a round (auto: the cost model picks)")
    draft(
        "--verification",
        choices=["token", "block", "spectr", "traversal"],
        default="token",
        help="how the target judges drafts, all exact (default: token; spectr and traversal judge trees)",
    )
    draft(
        "--siblings",
        choices=["without_replacement", "iid"],
        help="how a draft model samples a tree node's children (default: without_replacement)",
    )
    draft(
        "--cross_vocab",
        choices=["tli", "slem", "slrs"],
        help="a draft model with another tokenizer, verified exactly (Timor et al. 2025)",
    )
    sample = p.add_argument_group("sampling").add_argument
    sample("--temperature", type=float, default=0.0, metavar="T", help="0 is greedy decoding (default: 0)")
    sample("--top_k", type=int, metavar="K", help="keep only the K most likely tokens")
    sample("--top_p", type=float, metavar="P", help="keep the most likely tokens holding P of the probability")
    sample("--seed", type=int, default=0, metavar="N", help="random seed, >= 0 (default: 0)")
    output = p.add_argument_group("output").add_argument
    output("--json", action="store_true", help="print the measurements as one JSON object instead of text")
    output("--equivalent", choices=ENGINES, metavar="ENGINE", help=f"print this run for {'/'.join(ENGINES)}; exit")
    storage = p.add_argument_group("models and storage").add_argument
    storage("--models_dir", metavar="DIR", help=f"where models are kept (default: {default_models_dir()})")
    args = p.parse_args(argv)
    typed = flags.given(args)
    args.default_run = "target_model_size" not in typed  # the embedded default for what was left out
    if args.default_run:
        args.target_model_size, args.chat = DEFAULT_RUN.target, args.chat or DEFAULT_RUN.chat
    if "draft" not in typed:
        args.draft = DEFAULT_RUN.draft if args.default_run else GPT2_DRAFT

    try:  # the API's own checks (autoregressive.py, sampling.py, ...), so both refuse alike
        whole_number(args.n_tokens_to_generate, "--n_tokens_to_generate", 1)
        whole_number(args.repeats, "--repeats", 1)
        whole_number(args.k_max, "--k_max", 1, K_LIMIT)
        whole_number(args.ngram_max, "--ngram_max", 1)
        check_seed(args.seed, "--seed")
        args.tree = parse_tree(args.tree)
        if args.draft_confidence is not None:
            args.draft_confidence = parse_confidence(args.draft_confidence)  # "auto" or a bar in (0, 1]
        if args.siblings is not None:
            args.siblings = args.siblings.replace("_", " ")
        args.draft_spec = DraftSpec("ngram", args.ngram_max) if args.draft == "ngram" else parse_draft(args.draft)
        if args.prompt_lookup_min is not None:
            args.draft_spec = shortest_match(args)
        args.K = parse_k(args.K if args.K is not None else K_LIMIT if sizes_itself(args.draft_spec) else 4)
        if default_bar(args):
            args.draft_confidence = DEFAULT_RUN.draft_confidence
        check_cli_verification(args)
        params = SamplingParams(args.temperature, args.top_k, args.top_p)
        if args.cross_vocab is not None:
            check_rule(args.cross_vocab, params)
        check_names(args)  # by the names alone: nothing is fetched yet
        check_models_dir(args.models_dir)
        if args.batch is not None:
            whole_number(args.batch, "--batch", 1)
            if args.draft_spec.kind == "lookup_first" and args.draft_spec.parts()[1].kind == "early_exit":
                raise ValueError(
                    f"--batch gives each row its own lookup and drafter, and early exit drafts a batch in "
                    f"batched passes instead: use --draft ngram+eagle or ngram+medusa:DIR, or "
                    f"{args.draft_spec.parts()[1]} alone, with --batch"
                )
            if args.tree is not None or args.K == "auto":
                raise ValueError(
                    "--batch drafts chains with an integer K or --K adaptive: leave out --tree and "
                    "--K auto (the best K per batch size: python -m specdec.bench --only batch)"
                )
        for name in (args.target_model_size, args.draft_spec.arg if args.draft_spec.kind == "model" else None):
            if name is not None and name not in (*WHEELS, shipped_draft.NAME) and not name.lower().endswith(".gguf"):
                resolve_model(name, args.models_dir)
        tuning.kernels_mode()  # SPECDEC_KERNELS, before anything is loaded
    except ValueError as e:
        p.error(f"--{e}" if str(e).startswith(("K ", "draft_confidence ")) else str(e))
    refuse_ignored(p, args)
    try:  # last: reading a pipe may wait for its writer, and every flag is checked by then
        if args.batch is not None:
            args.prompts = flags.read_prompts(args.prompt_file, args.batch)
            args.prompt = args.prompts[0]
        else:
            args.prompt = flags.read_prompt(args.prompt, args.prompt_file)
    except ValueError as e:
        p.error(str(e))
    if args.prompt is None:
        args.prompt = DEFAULT_RUN.prompt if args.default_run else GPT2_PROMPT
        if args.default_run and "n_tokens_to_generate" not in typed:
            args.n_tokens_to_generate = DEFAULT_RUN.n_tokens  # the default request's whole reply
    note_redundant(p, args)
    return args


DEFAULT_DOWNLOAD = human(registry.card(DEFAULT_RUN.target).download)
DESCRIPTION = f"""\
Race plain autoregressive decoding against speculative decoding on one request, and explain the
result: the speedup, its noise, and what the passes and the cost model allow.

  %(prog)s                 {DEFAULT_RUN.target} answers a chat request, drafted by {DEFAULT_RUN.draft}
                          ({DEFAULT_DOWNLOAD} fetched once with pip: no Hugging Face Hub needed)
  %(prog)s {GPT2_PAIR}
                          the original project's GPT-2 pair, from the Hub
  %(prog)s cache           what is stored on disk, with sizes; --remove NAME frees it"""

EPILOG = textwrap.fill(
    "Environment: SPECDEC_HOME moves the models folder; HF_ENDPOINT (a mirror), HF_HUB_OFFLINE=1 and HF_TOKEN work "
    f"as for huggingface_hub. Disk: the GPT-2 pair is a {human(GPT2_FOOTPRINT[0])} download plus "
    f"{human(GPT2_FOOTPRINT[1])} of kept layout (transposed weights beside each GPT-2 checkpoint, so that later "
    "loads copy nothing; SPECDEC_NO_LAYOUT_CACHE=1 keeps none). The first load on a machine times its matrix "
    "products and keeps the fastest threads beside the models (SPECDEC_KERNELS=measure times them again, "
    "SPECDEC_KERNELS=rules keeps fixed rules).",
    width=96,
)


def shipped_heads() -> str:
    """The targets an EAGLE head is shipped for (registry.SHIPPED_HEADS), for --help."""
    return ", ".join(sorted(target for target, kind in registry.SHIPPED_HEADS if kind == "eagle"))


def model_names() -> str:
    """The names --target_model_size takes, by where each comes from (registry.py), for --help."""
    by_source = {}
    for name, card in registry.MODELS.items():
        if card.base is None:
            by_source.setdefault(card.source, []).append(name)
    where = {registry.WHEEL: "fetched with pip", registry.HUB: "from the Hub", registry.SHIPPED: "shipped"}
    return "; ".join(f"{', '.join(names)} ({where[source]})" for source, names in by_source.items())


def sizes_itself(spec: DraftSpec) -> bool:
    """Whether the drafter sizes its own rounds (suffix decoding, alone or first): its K is the most, 32."""
    return (spec.parts()[0] if spec.kind == "lookup_first" else spec).kind == "suffix"


def shortest_match(args) -> DraftSpec:
    """--prompt_lookup_min N: the draft spec's lookup matching suffixes of N tokens or more."""
    spec, n_min = args.draft_spec, args.prompt_lookup_min
    lookup = spec.parts()[0] if spec.kind == "lookup_first" else spec
    if lookup.kind != "ngram":
        raise ValueError(
            f"--prompt_lookup_min sets the shortest suffix prompt lookup matches, for --draft ngram or "
            f"ngram+X; the draft here is {args.draft}: add --draft ngram+eagle (or ngram) to use it"
        )
    if lookup.n_min is not None and lookup.n_min != n_min:
        raise ValueError(f"--prompt_lookup_min {n_min} and --draft {args.draft} both set the shortest n-gram; give one")
    if not 1 <= n_min <= lookup.arg:
        raise ValueError(
            f"--prompt_lookup_min must be 1..{lookup.arg} (the longest suffix matched, --ngram_max or "
            f"ngram:N), got {n_min}"
        )
    return spec.with_shortest(n_min)


def default_bar(args) -> bool:
    """Whether the default run's draft confidence bar applies: its drafter, untouched, where a bar is offered."""
    typed = flags.given(args)
    return (
        args.default_run
        and DEFAULT_RUN.draft_confidence is not None
        and "draft" not in typed
        and "draft_confidence" not in typed
        and args.tree is None
        and args.batch is None
        and args.only != "autoregressive"
    )


def parse_tree(text: str | None):
    """--tree: None (a chain), a node budget 1..64, or 'auto'."""
    if text is None or text == "auto":
        return text
    if not text.isdigit() or not 1 <= int(text) <= 64:
        raise ValueError(f"--tree must be a node budget 1..64 or 'auto', got {text!r}")
    return int(text)


def config_of(args) -> Config:
    """The run's settings, as the samplers and the race take them (config.py), from the parsed flags."""
    return Config(
        K=args.K,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        chat=args.chat,
        tree=args.tree,
        verification=args.verification,
        draft_confidence=args.draft_confidence,
        cross_vocab=args.cross_vocab,
        siblings=args.siblings,
        k_max=args.k_max,
    )
