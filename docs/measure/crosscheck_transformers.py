"""specdec's prompt lookup against transformers' on SmolLM2-135M-Instruct: the same greedy tokens, or a float tie.

For each prompt, this runs the snippet that `specdec --equivalent transformers` prints for

    specdec --target_model_size smollm2-135m --draft ngram --K 4 --chat --n_tokens_to_generate 64 --prompt P

as printed (its model-loading lines once, its generate lines once per prompt), then specdec's own
speculative and plain decoding of the same request, and compares the new token ids. Both engines load the
same GGUF file (Q4_1, dequantized to float32), and greedy speculative decoding writes the target's
greedy text whatever it drafts, so the texts must agree token for token. Where they do not, the script
shows the first differing position with both models' two best logits there: a gap near float32's
rounding (a tie) explains a difference; a clear gap would be a bug in one of them.

A throwaway environment, outside the repository (torch is never a dependency of specdec):

    python3 -m venv ../torchvenv
    ../torchvenv/bin/pip install torch==2.13.0 transformers gguf accelerate numpy tiktoken tqdm requests
    PYTHONPATH=. nice -n 10 ../torchvenv/bin/python docs/measure/crosscheck_transformers.py

The GGUF file is the one specdec fetched (`specdec --target_model_size smollm2-135m --draft ngram --chat`
fetches it once). docs/engines.md records a run of this script.
"""

import specdec  # noqa: F401  (first: sets OpenBLAS's thread spin before NumPy loads)

import argparse
import platform
import sys

import numpy as np

from specdec.cli.args import parse_args
from specdec.autoregressive import autoregressive_sample
from specdec.checkpoints.load import load_model
from specdec.config import Config, make_request
from specdec.cli.equivalent import equivalent
from specdec.speculative import speculative_sample

# One prompt per kind of reply: copying from the prompt, code, a list, an explanation, a short answer.
PROMPTS = [
    "Repeat this sentence twice: The quick brown fox jumps over the lazy dog.",
    "Write a Python function that returns the squares of a list of numbers.",
    "List the planets of the solar system in order from the Sun.",
    "Explain in a few sentences why the sky is blue.",
    "What is the capital of France? Answer in one sentence.",
]


def flags(prompt: str, n_tokens: int, k: int) -> list[str]:
    return [
        "--target_model_size",
        "smollm2-135m",
        "--draft",
        "ngram",
        "--K",
        str(k),
        "--chat",
        "--n_tokens_to_generate",
        str(n_tokens),
        "--prompt",
        prompt,
    ]


def split_snippet(snippet: str) -> tuple[str, str]:
    """(the imports and model loads, the per-prompt lines): the snippet's lines before and from `messages = `."""
    lines = [line for line in snippet.splitlines() if not line.startswith("# no counterpart")]
    cut = next(i for i, line in enumerate(lines) if line.startswith("messages = "))
    return "\n".join(lines[:cut]), "\n".join(lines[cut:])


def top2(logits: np.ndarray) -> tuple[list[int], float]:
    """The two best token ids and the gap between their logits."""
    best = np.argsort(logits)[::-1][:2]
    return best.tolist(), float(logits[best[0]] - logits[best[1]])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n_tokens", type=int, default=64, help="new tokens per prompt (default: 64)")
    parser.add_argument("--K", type=int, default=4, help="drafted tokens per round (default: 4)")
    args = parser.parse_args()

    import torch
    import transformers

    print(
        f"transformers {transformers.__version__}, torch {torch.__version__}, numpy {np.__version__}, "
        f"specdec {specdec.__version__}, Python {platform.python_version()}, {platform.machine()}"
    )
    snippets = [equivalent(parse_args(flags(p, args.n_tokens, args.K)), "transformers") for p in PROMPTS]
    heads = {split_snippet(s)[0] for s in snippets}
    assert len(heads) == 1, "the printed snippets should load the model the same way for every prompt"
    print("the snippet, as `specdec --equivalent transformers` prints it for the first prompt:\n")
    print(snippets[0] + "\n")

    namespace: dict = {}
    exec(heads.pop(), namespace)  # the printed loading lines, run as printed
    model = namespace["model"]
    target = load_model("smollm2-135m")

    same = 0
    for prompt, snippet in zip(PROMPTS, snippets):
        print(f"--- {prompt!r}\n    transformers: ", end="", flush=True)
        exec(split_snippet(snippet)[1], namespace)  # prints the text transformers wrote
        ids = namespace["inputs"]["input_ids"][0].tolist()
        theirs = namespace["out"][0, len(ids) :].tolist()
        request = make_request(target, prompt, args.n_tokens, Config(chat=True))
        speculative = speculative_sample(target, "ngram:3", prompt, args.n_tokens, K=args.K, chat=True)
        plain = autoregressive_sample(target, prompt, args.n_tokens, chat=True)
        print(f"    prompt ids identical: {request.prompt == ids} ({len(ids)} tokens); specdec: {speculative.text!r}")
        print(
            f"    specdec speculative: {speculative.rounds} rounds, alpha {speculative.alpha:.2f}, "
            f"tau {speculative.tau:.2f}; tokens identical to specdec's plain decoding: "
            f"{speculative.tokens == plain.tokens}"
        )
        if theirs == speculative.tokens:
            same += 1
            print(f"    IDENTICAL: {len(theirs)} new tokens")
            continue
        i = next((j for j, (a, b) in enumerate(zip(theirs, speculative.tokens)) if a != b), None)
        if i is None:
            print(
                f"    one is a prefix of the other: transformers {len(theirs)} tokens, specdec "
                f"{len(speculative.tokens)}"
            )
            continue
        prefix = request.prompt + speculative.tokens[:i]
        ours = target.forward(prefix, target.new_cache(), last_only=True)[0]
        with torch.no_grad():
            logits = model(torch.tensor([prefix])).logits[0, -1].float().numpy()
        (a, b), gap_ours = top2(ours)
        (c, d), gap_theirs = top2(logits)
        print(f"    DIFFER at new token {i}: transformers {theirs[i]}, specdec {speculative.tokens[i]}")
        print(
            f"      specdec's two best there: {a}, {b} (gap {gap_ours:.2e}); transformers': {c}, {d} "
            f"(gap {gap_theirs:.2e})"
        )
    print(f"\n{same} of {len(PROMPTS)} prompts: identical tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
