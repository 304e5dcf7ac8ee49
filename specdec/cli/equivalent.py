"""`specdec --equivalent ENGINE`: the experiment the other flags describe, written for an engine people deploy.

    specdec --target_model_size smollm2-135m --draft ngram --chat --prompt "Name two planets." --equivalent vllm

prints the Python snippet (transformers, vLLM) or the commands (SGLang, llama.cpp) that run the same
target, drafter, K, sampling and prompt on that engine, then ONE line, `# no counterpart in ENGINE: ...`,
naming what the engine cannot express. Where an engine has the idea under other semantics, a comment
beside the line says how it differs. Nothing here imports or installs an engine: this writes text.

Every engine name written here is checked against that engine's own source in docs/engines.md, which
cites the file and the version: transformers 5.24.0, vLLM 0.33.0, SGLang 0.5.23, llama.cpp 0c1e570
(as vendored by llama-cpp-python 0.3.36). `equivalent(args, engine)` is a pure function of the parsed
flags (__main__.parse_args) and the models folder; it downloads and loads nothing. The flags as one
experiment, and where each engine finds the weights: cli/experiment.py.
"""

from __future__ import annotations

import json
import shlex
import textwrap
from pathlib import Path

from ..model.tokenizer import DEFAULT_SYSTEM
from .experiment import Checkpoint, Experiment, experiment

ENGINES = ("transformers", "vllm", "sglang", "llama.cpp")
NAMES = {"transformers": "transformers", "vllm": "vLLM", "sglang": "SGLang", "llama.cpp": "llama.cpp"}
SGLANG_URL = "http://127.0.0.1:30000"  # launch_server's default --port (fields/serving.py)


def equivalent(args, engine: str, models_dir: Path | None = None) -> str:
    """The snippet or commands for `engine`, then one line naming what has no counterpart there."""
    if engine not in ENGINES:
        raise ValueError(f"--equivalent must be one of {', '.join(ENGINES)}, got {engine!r}")
    e = experiment(args, models_dir)
    if e.target is None:
        lines, gaps = [], [f"the target {args.target_model_size} (specdec's own format)"]
    else:
        lines, gaps = WRITERS[engine](e)
    gaps = e.common_gaps() + gaps
    if engine != "transformers":
        shipped = [c.name for c in (e.target, e.draft) if c is not None and c.shipped]
        gaps += [f"{name}'s folder as shipped (its config.json names no architecture and no n_ctx)" for name in shipped]
    return "\n".join(
        lines + [f"# no counterpart in {NAMES[engine]}: {'; '.join(gaps) or 'none, every setting above maps'}"]
    )


# ---------------------------------------------------------------------------
# transformers: model.generate() (generation/utils.py, generation/candidate_generator.py)
# ---------------------------------------------------------------------------
def _transformers(e: Experiment) -> tuple[list[str], list[str]]:
    gaps: list[str] = []
    lines = ["import torch", "from transformers import AutoModelForCausalLM, AutoTokenizer", ""]
    lines += _hf_loads("model", "tok", e.target, "torch.float64" if e.float64 else "torch.float32")
    generate = {"max_new_tokens": str(e.n_tokens)}
    settings: list[str] = []  # lines that set the drafter's own generation_config
    k = e.K if isinstance(e.K, int) else 4  # adaptive / auto: start where specdec's AdaptiveK starts
    schedule = "constant" if isinstance(e.K, int) else "heuristic"
    if e.draft_kind == "model" and e.draft is not None:
        lines += _hf_loads("assistant", "assistant_tok" if e.cross_vocab else None, e.draft, "torch.float32")
        generate["assistant_model"] = "assistant"
        owner = "assistant"
        if e.cross_vocab:
            generate["tokenizer"], generate["assistant_tokenizer"] = "tok", "assistant_tok"
            if e.cross_vocab == "slrs":
                gaps.append("--cross_vocab slrs (string-level rejection sampling)")
            elif (e.cross_vocab == "tli") == e.greedy:  # transformers picks the rule by do_sample
                rule = "string-level (UAG)" if e.greedy else "token-level intersection"
                gaps.append(f"--cross_vocab {e.cross_vocab} at this temperature (transformers uses {rule} here)")
    elif e.draft_kind == "early_exit":
        generate["assistant_early_exit"] = str(e.draft_arg)
        owner = "model"
    elif e.draft_kind == "ngram":
        generate["prompt_lookup_num_tokens"] = str(k)
        generate["max_matching_ngram_size"] = f"{e.draft_arg},  # the earliest match (specdec: the latest)"
        owner = None
        if not isinstance(e.K, int):
            gaps.append(f"--K {e.K} with prompt lookup (it drafts a fixed number of tokens)")
    else:
        owner = None
        if e.draft_kind in ("eagle", "medusa"):
            gaps.append(f"--draft {e.draft_text} (no EAGLE or Medusa heads in generate())")
    if owner is not None:  # transformers reads these from the drafter's generation_config, not generate()'s
        how = "" if isinstance(e.K, int) else "  # +2 after a round that accepted all, else -1"
        settings += [
            f"{owner}.generation_config.num_assistant_tokens = {k}",
            f"{owner}.generation_config.num_assistant_tokens_schedule = {schedule!r}{how}",
        ]
        bar = e.confidence if isinstance(e.confidence, float) else 0
        note = "  # the draft's probability of each token (specdec: of the chain)" if bar else "  # 0: never cut"
        settings.append(f"{owner}.generation_config.assistant_confidence_threshold = {bar}{note}")
    if isinstance(e.confidence, float) and owner is None:
        gaps.append("--draft_confidence (a bar for a draft model's chains)")
    if e.tree is not None:
        gaps.append("--tree (assisted generation verifies chains)")
    if e.verification == "block":
        gaps.append("--verification block")
    if len(e.prompts) > 1:
        gaps.append("--batch (assisted generation takes one sequence, batch_size = 1)")
    if e.chat:
        lines.append(f"messages = {[{'role': 'user', 'content': e.prompts[0]}]!r}")
        lines.append(
            "inputs = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors='pt', "
            "return_dict=True)"
        )
    else:
        lines.append(f"inputs = tok({e.prompts[0]!r}, return_tensors='pt')")
    lines += settings
    if e.greedy:
        generate["do_sample"] = "False"
    else:
        lines.append(f"torch.manual_seed({e.seed})  # torch's generator: other draws than specdec's")
        generate.update(
            do_sample="True", temperature=repr(e.temperature), top_k=str(e.top_k or 0), top_p=repr(e.top_p or 1.0)
        )
    arguments = [f"    {key}={value}" + ("" if "#" in value else ",") for key, value in generate.items()]
    lines += ["out = model.generate(", "    **inputs,", *arguments]
    lines += [")", "print(tok.decode(out[0, inputs['input_ids'].shape[1]:], skip_special_tokens=True))"]
    return lines, gaps


def _hf_loads(model: str, tok: str | None, c: Checkpoint, dtype: str) -> list[str]:
    """from_pretrained lines for a checkpoint: a GGUF file (transformers dequantizes it), a Hub repo or a folder."""
    lines = []
    if c.gguf is not None:
        if c.hub:
            lines += _comment(
                f"{c.name}: {c.hub} quantized, the GGUF file specdec runs (the Hub repo holds the unquantized weights)"
            )
        lines.append(f"{model}_dir, {model}_gguf = {str(c.gguf.parent)!r}, {c.gguf.name!r}")
        source = f"{model}_dir, gguf_file={model}_gguf"
    else:
        source = repr(c.hub or str(c.folder))
    lines += [f"{tok} = AutoTokenizer.from_pretrained({source})"] if tok else []
    return lines + [f"{model} = AutoModelForCausalLM.from_pretrained({source}, dtype={dtype})"]


def _comment(text: str) -> list[str]:
    """`text` as comment lines of at most 100 characters."""
    return textwrap.wrap(text, 98, initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False)


# ---------------------------------------------------------------------------
# vLLM: LLM(..., speculative_config={...}) (vllm/config/speculative.py)
# ---------------------------------------------------------------------------
def _vllm(e: Experiment) -> tuple[list[str], list[str]]:
    gaps: list[str] = []
    config: dict[str, object] = {}
    k = e.K if isinstance(e.K, int) else 4
    if e.draft_kind == "model" and e.draft is not None:
        config = {"method": "draft_model", "model": _served(e.draft), "num_speculative_tokens": k}
        if not e.greedy:  # specdec draws drafts from q and tests them with min(1, p/q)
            config["draft_sample_method"] = "probabilistic"
        if e.cross_vocab == "tli":
            config["use_heterogeneous_vocab"] = True
        elif e.cross_vocab:
            gaps.append(f"--cross_vocab {e.cross_vocab} (vLLM's other vocabularies: token-level intersection only)")
    elif e.draft_kind == "ngram":
        config = {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_max": e.draft_arg,
            "prompt_lookup_min": 1,
        }
    elif e.draft_kind == "eagle":
        gaps.append(f"--draft {e.draft_text} (method 'eagle' reads EAGLE heads in vLLM's checkpoint format)")
    elif e.draft_kind in ("early_exit", "medusa"):
        gaps.append(f"--draft {e.draft_text}")
    if config and e.verification == "block":
        config["rejection_sample_method"] = "block"
    if config and not isinstance(e.K, int):
        gaps.append(f"--K {e.K} (num_speculative_tokens is fixed per run)")
    if e.tree is not None:
        gaps.append("--tree")
    if e.confidence is not None:
        gaps.append("--draft_confidence")
    if e.float64:
        gaps.append("--float64 (vLLM's widest dtype is float32)")
    lines = ["from vllm import LLM, SamplingParams", ""] + _gguf_note(e.target, "vllm")
    lines += ["llm = LLM(", f"    model={_served(e.target)!r},", "    dtype='float32',"]
    if config:
        lines += (
            ["    speculative_config={"]
            + [f"        {key!r}: {value!r}," for key, value in config.items()]
            + ["    },"]
        )
    lines.append(")")
    params = {"temperature": e.temperature, "max_tokens": e.n_tokens}
    if not e.greedy:
        params.update(top_k=e.top_k or 0, top_p=e.top_p or 1.0, seed=e.seed)
    lines.append("params = SamplingParams(" + ", ".join(f"{key}={value!r}" for key, value in params.items()) + ")")
    if e.chat:
        conversations = [[{"role": "user", "content": p}] for p in e.prompts]
        lines.append(f"outputs = llm.chat({conversations if len(e.prompts) > 1 else conversations[0]!r}, params)")
    else:
        lines.append(f"outputs = llm.generate({e.prompts!r}, params)")
    lines += ["for output in outputs:", "    print(output.outputs[0].text)"]
    return lines, gaps


def _served(c: Checkpoint) -> str:
    """What a serving engine loads: the Hub repo (for smollm2-135m, the unquantized one), else the file or folder."""
    return c.hub or str(c.folder or c.gguf)


def _gguf_note(c: Checkpoint, engine: str) -> list[str]:
    if c.gguf is None or c.hub is None:
        return []
    return _comment(
        f"{c.name} is {c.hub} quantized to the GGUF file {c.gguf}; {NAMES[engine]} loads the "
        "unquantized weights here, so a float near-tie can make the texts differ"
    )


# ---------------------------------------------------------------------------
# SGLang: python -m sglang.launch_server --speculative-* (srt/arg_groups/fields/spec.py)
# ---------------------------------------------------------------------------
def _sglang(e: Experiment) -> tuple[list[str], list[str]]:
    gaps: list[str] = []
    flags = ["--model-path", _served(e.target), "--dtype", "float32"]
    k = e.K if isinstance(e.K, int) else 4
    # A chain of k drafts: k draft steps, one candidate per step, k + 1 tokens in the verification pass.
    width, nodes = (1, k) if not isinstance(e.tree, int) else (2, e.tree)  # specdec's trees: 2 children a node
    if e.draft_kind == "model" and e.draft is not None:
        flags += [
            "--speculative-algorithm",
            "STANDALONE",
            "--speculative-draft-model-path",
            _served(e.draft),
            "--speculative-num-steps",
            str(k),
            "--speculative-eagle-topk",
            str(width),
            "--speculative-num-draft-tokens",
            str(nodes + 1),
        ]
        if not e.greedy:
            gaps.append("drafts drawn from the draft's distribution (STANDALONE drafts its top tokens)")
    elif e.draft_kind == "ngram":
        flags += [
            "--speculative-algorithm",
            "NGRAM",
            "--speculative-num-draft-tokens",
            str(nodes + 1),
            "--speculative-ngram-max-bfs-breadth",
            str(width),
        ]
        gaps.append(f"--draft {e.draft_text}'s n-gram sizes (NGRAM matches suffixes in a trie of all requests' text)")
    elif e.draft_kind == "eagle":
        gaps.append(f"--draft {e.draft_text} (--speculative-algorithm EAGLE reads heads in SGLang's format)")
    elif e.draft_kind in ("early_exit", "medusa"):
        gaps.append(f"--draft {e.draft_text}")
    if e.tree == "auto":
        gaps.append("--tree auto (a node budget chosen each round)")
    if e.verification == "block":
        gaps.append("--verification block (--speculative-use-block-verification takes EAGLE and DFLASH drafts)")
    if e.K == "adaptive":
        gaps.append("--K adaptive (--speculative-adaptive takes EAGLE drafts only)")
    if e.cross_vocab:
        gaps.append(f"--cross_vocab {e.cross_vocab}")
    if e.confidence is not None:
        gaps.append("--draft_confidence")
    if e.float64:
        gaps.append("--float64")
    lines = _gguf_note(e.target, "sglang")
    lines.append(_wrap(["python", "-m", "sglang.launch_server", *flags]))
    sampling: dict[str, object] = {"temperature": e.temperature}
    if not e.greedy:
        sampling.update(top_k=e.top_k or -1, top_p=e.top_p or 1.0)
    if e.chat:  # the OpenAI-compatible route applies the model's chat template
        for prompt in e.prompts:
            body = {
                "model": _served(e.target),
                "messages": [{"role": "user", "content": prompt}],
                **sampling,
                "max_tokens": e.n_tokens,
                **({} if e.greedy else {"seed": e.seed}),
            }
            lines.append(_curl(f"{SGLANG_URL}/v1/chat/completions", body))
    else:
        sampling["max_new_tokens"] = e.n_tokens
        if not e.greedy:
            sampling["sampling_seed"] = e.seed
        text = e.prompts if len(e.prompts) > 1 else e.prompts[0]
        lines.append(_curl(f"{SGLANG_URL}/generate", {"text": text, "sampling_params": sampling}))
    return lines, gaps


def _curl(url: str, body: dict) -> str:
    return _wrap(
        ["curl", "-s", url, "-H", "Content-Type: application/json", "-d", json.dumps(body, ensure_ascii=False)]
    )


# ---------------------------------------------------------------------------
# llama.cpp: llama-speculative-simple (examples/speculative-simple, common/arg.cpp)
# ---------------------------------------------------------------------------
def _llama_cpp(e: Experiment) -> tuple[list[str], list[str]]:
    gaps: list[str] = []
    lines = _conversions(e.target)
    flags = ["-m", e.target.gguf_name()]
    k = e.K if isinstance(e.K, int) else 4
    if e.draft_kind == "model" and e.draft is not None:
        lines += _conversions(e.draft)
        flags += ["-md", e.draft.gguf_name(), "--spec-type", "draft-simple", "--spec-draft-n-max", str(k)]
        if isinstance(e.confidence, float):
            flags += ["--spec-draft-p-min", str(e.confidence)]  # the draft's top probability per token
        if not e.greedy:
            gaps.append("drafts drawn from the draft's distribution (llama.cpp drafts the draft's top token)")
        if e.cross_vocab:
            gaps.append(f"--cross_vocab {e.cross_vocab}")
    elif e.draft_kind == "ngram":
        flags += [
            "--spec-type",
            "ngram-simple",
            "--spec-ngram-simple-size-n",
            str(e.draft_arg),
            "--spec-ngram-simple-size-m",
            str(k),
        ]
        if int(e.draft_arg) > 1:
            gaps.append(f"matches shorter than {e.draft_arg} tokens (ngram-simple matches exactly size-n tokens)")
    elif e.draft_kind in ("early_exit", "eagle", "medusa"):
        gaps.append(f"--draft {e.draft_text}")
    if isinstance(e.confidence, float) and not (e.draft_kind == "model" and e.draft is not None):
        gaps.append("--draft_confidence (--spec-draft-p-min cuts a draft model's chains)")
    if e.draft_kind != "none" and not isinstance(e.K, int):
        gaps.append(f"--K {e.K} (--spec-draft-n-max is fixed per run)")
    if e.tree is not None:
        gaps.append("--tree (llama-speculative-simple verifies chains)")
    if e.verification == "block":
        gaps.append("--verification block")
    if len(e.prompts) > 1:
        gaps.append("--batch (one prompt per run; llama-server serves several)")
    if e.float64:
        gaps.append("--float64")
    prompt = e.prompts[0].replace("\\", "\\\\").replace("\n", "\\n")  # llama.cpp unescapes -p (its `escape`)
    flags += ["-p", _chatml(prompt) if e.chat else prompt, "-n", str(e.n_tokens), "--temp", str(e.temperature)]
    if not e.greedy:  # llama.cpp's own defaults cut with top-k 40, top-p 0.95 and min-p 0.05: turn them off
        flags += ["--top-k", str(e.top_k or 0), "--top-p", str(e.top_p or 1.0), "--min-p", "0", "--seed", str(e.seed)]
    speculative = e.draft_kind == "ngram" or e.draft_kind == "model" and e.draft is not None
    program = ["llama-speculative-simple"] if speculative else ["llama-completion", "-no-cnv"]  # plain decoding
    lines.append(_wrap([*program, *flags]))
    return lines, gaps


def _conversions(c: Checkpoint) -> list[str]:
    """llama.cpp reads GGUF: the command that writes one from a Hugging Face folder (convert_hf_to_gguf.py)."""
    if c.gguf is not None:
        return []
    folder = str(c.folder) if c.folder else f"<a local copy of {c.hub}>"
    return [_wrap(["python", "convert_hf_to_gguf.py", folder, "--outtype", "f32", "--outfile", c.gguf_name()])]


def _chatml(text: str) -> str:
    """The prompt as specdec's --chat writes it (model/tokenizer.chat_prompt: SmolLM2's template with its default
    system turn), line breaks written as llama.cpp's -p escapes."""
    turns = [f"<|im_start|>system\\n{DEFAULT_SYSTEM}<|im_end|>", f"<|im_start|>user\\n{text}<|im_end|>"]
    return "\\n".join(turns + ["<|im_start|>assistant\\n"])


def _wrap(words: list[str], width: int = 100) -> str:
    """A shell command, quoted, broken with backslashes before a flag once a line passes `width`."""
    lines, line = [], ""
    for word in map(shlex.quote, words):
        if line and word.startswith("-") and len(line) + len(word) > width:
            lines.append(line + " \\")
            line = "  "
        line += (" " if line.strip() else "") + word
    return "\n".join(lines + [line])


WRITERS = {"transformers": _transformers, "vllm": _vllm, "sglang": _sglang, "llama.cpp": _llama_cpp}
