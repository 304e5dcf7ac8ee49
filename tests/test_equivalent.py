"""`specdec --equivalent ENGINE`: the engines' argument names and values for a set of runs, valid Python and
shell, the one line naming what has no counterpart, and the refusal of an engine it does not know."""

import ast
import shlex
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT))
from specdec.cli import main  # noqa: E402
from specdec.cli.defaults import GPT2_PROMPT  # noqa: E402
from specdec.cli.equivalent import ENGINES  # noqa: E402
from specdec.model.tokenizer import DEFAULT_SYSTEM  # noqa: E402

GAP = "# no counterpart in "
GPT2 = ["--target_model_size", "355M"]  # a named target: GPT-2's pair, draft 124M, and GPT-2's prompt


@pytest.fixture
def printed(capsys, monkeypatch, tmp_path):
    """equivalent(*flags) -> what `specdec FLAGS` prints, with every way to load a model made to fail."""

    def fail(*args, **kwargs):
        raise AssertionError("--equivalent loaded a model")

    monkeypatch.setattr(main, "load", fail)
    monkeypatch.setattr(main, "ensure_files", fail)

    def run(*argv):
        code = main.main([*argv, "--models_dir", str(tmp_path)])
        out, err = capsys.readouterr()
        assert code == 0 and not err, err
        lines = out.splitlines()
        assert [line for line in lines if line.startswith(GAP)] == [lines[-1]], "one line of gaps, the last"
        return out

    run.models = tmp_path
    return run


def gaps(out: str) -> str:
    return out.splitlines()[-1].partition(": ")[2]


def shell_words(out: str) -> list[list[str]]:
    """Each command of a printed shell block, split as a shell would (comments and continuations handled)."""
    commands = out.replace("\\\n", " ").splitlines()
    return [shlex.split(c) for c in commands if c.strip() and not c.startswith("#")]


def flag_value(words: list[str], flag: str) -> str:
    return words[words.index(flag) + 1]


def test_the_gpt2_pair(printed):
    out = printed(*GPT2, "--equivalent", "transformers")
    ast.parse(out)
    for token in (
        "from_pretrained('openai-community/gpt2-medium', dtype=torch.float32)",
        "assistant = AutoModelForCausalLM.from_pretrained('openai-community/gpt2'",
        "assistant.generation_config.num_assistant_tokens = 4",
        "assistant.generation_config.num_assistant_tokens_schedule = 'constant'",
        "assistant_confidence_threshold = 0",
        "assistant_model=assistant,",
        "max_new_tokens=40,",
        "do_sample=False,",
        repr(GPT2_PROMPT),
    ):
        assert token in out, token
    assert gaps(out).startswith("none")

    out = printed(*GPT2, "--equivalent", "vllm")
    ast.parse(out)
    for token in (
        "model='openai-community/gpt2-medium'",
        "'method': 'draft_model'",
        "'model': 'openai-community/gpt2'",
        "'num_speculative_tokens': 4",
        "temperature=0.0",
        "max_tokens=40",
        "llm.generate(",
    ):
        assert token in out, token
    assert "draft_sample_method" not in out  # greedy: vLLM's default greedy drafts are specdec's

    server, request = shell_words(printed(*GPT2, "--equivalent", "sglang"))
    assert server[:3] == ["python", "-m", "sglang.launch_server"]
    assert flag_value(server, "--model-path") == "openai-community/gpt2-medium"
    assert flag_value(server, "--speculative-algorithm") == "STANDALONE"
    assert flag_value(server, "--speculative-draft-model-path") == "openai-community/gpt2"
    steps, topk, tokens = (
        flag_value(server, f"--speculative-{f}") for f in ("num-steps", "eagle-topk", "num-draft-tokens")
    )
    assert (steps, topk, tokens) == ("4", "1", "5")  # a chain of 4 drafts: 4 steps of 1, 5 tokens verified
    assert request[0] == "curl" and request[2].endswith("/generate")
    assert '"max_new_tokens": 40' in flag_value(request, "-d") and '"temperature": 0.0' in flag_value(request, "-d")

    convert_target, convert_draft, run = shell_words(printed(*GPT2, "--equivalent", "llama.cpp"))
    assert convert_target[:2] == ["python", "convert_hf_to_gguf.py"] and "--outfile" in convert_target
    assert flag_value(run, "-m") == flag_value(convert_target, "--outfile") == "gpt2-medium.gguf"
    assert flag_value(run, "-md") == flag_value(convert_draft, "--outfile") == "gpt2.gguf"
    assert run[0] == "llama-speculative-simple" and flag_value(run, "--spec-type") == "draft-simple"
    assert flag_value(run, "--spec-draft-n-max") == "4" and flag_value(run, "-n") == "40"
    assert flag_value(run, "-p") == GPT2_PROMPT and float(flag_value(run, "--temp")) == 0


PROMPT = 'Say "hi"\nand a backslash \\ please.'
CHAT = [
    "--target_model_size",
    "smollm2-135m",
    "--draft",
    "ngram:5",
    "--K",
    "6",
    "--chat",
    "--prompt",
    PROMPT,
    "--n_tokens_to_generate",
    "64",
    "--temperature",
    "0.7",
    "--top_p",
    "0.9",
    "--seed",
    "3",
]


def test_prompt_lookup_sampling_a_chat_reply(printed):
    out = printed(*CHAT, "--equivalent", "transformers")
    tree = ast.parse(out)
    assert PROMPT in [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)]
    for token in (
        "gguf_file=model_gguf",
        "'SmolLM2-135M-Instruct.Q4_1.gguf'",
        "apply_chat_template(messages",
        "prompt_lookup_num_tokens=6,",
        "max_matching_ngram_size=5,",
        "do_sample=True,",
        "temperature=0.7,",
        "top_k=0,",
        "top_p=0.9,",
        "torch.manual_seed(3)",
        "max_new_tokens=64,",
    ):
        assert token in out, token
    assert "assistant" not in out.replace("assistant\\n", "")

    out = printed(*CHAT, "--equivalent", "vllm")
    ast.parse(out)
    for token in (
        "model='HuggingFaceTB/SmolLM2-135M-Instruct'",
        "'method': 'ngram'",
        "'num_speculative_tokens': 6",
        "'prompt_lookup_max': 5",
        "'prompt_lookup_min': 1",
        "llm.chat(",
        "seed=3",
        "top_p=0.9",
        "temperature=0.7",
        "max_tokens=64",
    ):
        assert token in out, token

    server, request = shell_words(printed(*CHAT, "--equivalent", "sglang"))
    assert flag_value(server, "--speculative-algorithm") == "NGRAM"
    assert flag_value(server, "--speculative-num-draft-tokens") == "7"
    assert request[2].endswith("/v1/chat/completions") and '"seed": 3' in flag_value(request, "-d")

    (run,) = shell_words(printed(*CHAT, "--equivalent", "llama.cpp"))
    gguf = printed.models / "smollm2-135m-instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert flag_value(run, "-m") == str(gguf)
    assert flag_value(run, "--spec-type") == "ngram-simple"
    assert (flag_value(run, "--spec-ngram-simple-size-n"), flag_value(run, "--spec-ngram-simple-size-m")) == ("5", "6")
    assert [flag_value(run, f) for f in ("--temp", "--top-k", "--top-p", "--min-p", "--seed")] == [
        "0.7",
        "0",
        "0.9",
        "0",
        "3",
    ]
    # llama.cpp reads \n and \\ in -p as escapes: undone, they give specdec's chat prompt exactly
    text = flag_value(run, "-p").replace("\\\\", "\0").replace("\\n", "\n").replace("\0", "\\")
    assert text == (
        f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    )


def test_what_has_no_counterpart_is_named(printed):
    """Each engine names, in its one line, exactly the settings it cannot express."""
    tree = [*GPT2, "--temperature", "0.5", "--tree", "8", "--verification", "traversal"]
    for engine in ENGINES:
        assert "--verification traversal" in gaps(printed(*tree, "--equivalent", engine))
    assert "--tree" in gaps(printed(*tree, "--equivalent", "transformers"))
    assert "--tree" in gaps(printed(*tree, "--equivalent", "vllm"))
    server = shell_words(printed(*tree, "--equivalent", "sglang"))[0]
    assert [flag_value(server, f"--speculative-{f}") for f in ("eagle-topk", "num-draft-tokens")] == ["2", "9"]

    confident = [*GPT2, "--draft_confidence", "0.4"]
    assert "assistant_confidence_threshold = 0.4" in printed(*confident, "--equivalent", "transformers")
    assert flag_value(shell_words(printed(*confident, "--equivalent", "llama.cpp"))[-1], "--spec-draft-p-min") == "0.4"
    assert "--draft_confidence" in gaps(printed(*confident, "--equivalent", "vllm"))
    assert "--draft_confidence" in gaps(printed(*confident, "--equivalent", "sglang"))

    block = [*GPT2, "--verification", "block"]
    assert "'rejection_sample_method': 'block'" in printed(*block, "--equivalent", "vllm")
    assert "--verification block" in gaps(printed(*block, "--equivalent", "transformers"))

    auto = [*GPT2, "--K", "auto"]
    for engine in ENGINES:
        assert "--K auto" in gaps(printed(*auto, "--equivalent", engine))
    assert "num_assistant_tokens_schedule = 'heuristic'" in printed(*auto, "--equivalent", "transformers")


def test_the_shipped_family_loads_in_transformers_only(printed):
    """transformers reads the stdlib folders as they ship (config.json's model_type); convert_hf_to_gguf.py and the
    servers need the architecture (and llama.cpp n_ctx) that their config.json leaves out."""
    pair = ["--target_model_size", "stdlib-6L", "--draft", "stdlib-2L", "--prompt", "def parse(line):"]
    out = printed(*pair, "--equivalent", "transformers")
    assert "weights/stdlib-6L'" in out and "weights/stdlib-2L'" in out and gaps(out).startswith("none")
    for engine in ("vllm", "sglang", "llama.cpp"):
        missing = gaps(printed(*pair, "--equivalent", engine))
        assert "stdlib-6L's folder as shipped" in missing and "stdlib-2L's folder as shipped" in missing


def test_early_exit_and_plain_decoding(printed):
    out = printed("--draft", "early_exit:6", "--equivalent", "transformers")
    assert "assistant_early_exit=6," in out and "model.generation_config.num_assistant_tokens = 4" in out
    for engine in ("vllm", "sglang", "llama.cpp"):
        assert "--draft early_exit:6" in gaps(printed("--draft", "early_exit:6", "--equivalent", engine))

    plain = ["--only", "autoregressive"]
    out = printed(*plain, "--equivalent", "transformers")
    assert "assistant" not in out and "prompt_lookup" not in out and gaps(out).startswith("none")
    assert "speculative_config" not in printed(*plain, "--equivalent", "vllm")
    run = shell_words(printed(*plain, "--equivalent", "llama.cpp"))[-1]
    assert run[:2] == ["llama-completion", "-no-cnv"] and "-md" not in run


def test_another_vocabulary(printed):
    pair = ["--target_model_size", "smollm2-135m", "--draft", "124M", "--cross_vocab", "tli", "--temperature", "0.8"]
    out = printed(*pair, "--equivalent", "transformers")
    assert "assistant_tokenizer=assistant_tok," in out and "tokenizer=tok," in out and gaps(out).startswith("none")
    assert "'use_heterogeneous_vocab': True" in printed(*pair, "--equivalent", "vllm")
    assert "'draft_sample_method': 'probabilistic'" in printed(*pair, "--equivalent", "vllm")
    assert "--cross_vocab tli" in gaps(printed(*pair, "--equivalent", "sglang"))
    assert "--cross_vocab tli" in gaps(printed(*pair, "--equivalent", "llama.cpp"))


def test_an_unknown_engine_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main.main(["--equivalent", "tgi"])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and not out
    assert len(err.strip().splitlines()) == 1
    assert "--equivalent" in err and "'tgi'" in err and all(f"'{engine}'" in err for engine in ENGINES)
