"""The same greedy decode of SmolLM2-135M-Instruct in specdec (NumPy) and in transformers + torch, timed.

Both engines load the same GGUF file, dequantized to float32, and write 48 tokens
greedily after the same chat prompt, one token per forward pass through their KV
caches. Each measurement runs in a fresh process, and the two engines alternate,
so a burst of load from elsewhere hits both. Only the decode loop is timed
(after the prompt pass), and both must write the same tokens.

    python3 -m venv ref && ref/bin/pip install torch==2.13.0 transformers gguf accelerate
    ref/bin/python docs/compare_torch_smollm2.py PATH/TO/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --specdec-python .venv/bin/python --rounds 3

Not part of the library or its tests (they never import torch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

QUESTION = "Explain in a few sentences why the sky is blue."
N_TOKENS = 48

TORCH_CHILD = """
import json, sys, time, torch
from pathlib import Path
from transformers import AutoModelForCausalLM, AutoTokenizer
torch.set_num_threads(2)
path = Path(sys.argv[1]); ids = json.loads(sys.argv[2]); n = int(sys.argv[3])
model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
with torch.no_grad():
    step = model(torch.tensor([ids]), use_cache=True)
    past, token, out = step.past_key_values, int(step.logits[0, -1].argmax()), []
    start = time.perf_counter()
    for _ in range(n):
        out.append(token)
        step = model(torch.tensor([[token]]), past_key_values=past, use_cache=True)
        past, token = step.past_key_values, int(step.logits[0, -1].argmax())
    seconds = time.perf_counter() - start
print(json.dumps({"tokens": out, "seconds": seconds}))
"""

SPECDEC_CHILD = """
import json, sys, time
from specdec.checkpoints.gguf import load_gguf
model = load_gguf(sys.argv[1]); ids = json.loads(sys.argv[2]); n = int(sys.argv[3])
cache = model.new_cache()
token, out = int(model.forward(ids, cache, last_only=True)[0].argmax()), []
start = time.perf_counter()
for _ in range(n):
    out.append(token)
    token = int(model.forward([token], cache, last_only=True)[0].argmax())
seconds = time.perf_counter() - start
print(json.dumps({"tokens": out, "seconds": seconds}))
"""


def run(python: str, child: str, gguf: str, ids: list[int]) -> dict:
    done = subprocess.run([python, "-c", child, gguf, json.dumps(ids), str(N_TOKENS)], capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"child failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("gguf")
    p.add_argument("--specdec-python", required=True, help="a Python with specdec installed")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    prompt = subprocess.run(
        [
            args.specdec_python,
            "-c",
            "import json, sys\nfrom specdec.checkpoints.gguf import load_gguf\n"
            "from specdec.model.tokenizer import chat_prompt\nfrom specdec.checkpoints.gguf import GGUFFile\n"
            "from specdec.model.tokenizer import gguf_encoding\n"
            "tok = gguf_encoding(GGUFFile(sys.argv[1]).metadata, sys.argv[1])\n"
            "print(json.dumps(chat_prompt(tok, sys.argv[2])))",
            args.gguf,
            QUESTION,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    ids = json.loads(prompt.stdout)
    times = {"specdec": [], "torch": []}
    tokens = {}
    for _ in range(args.rounds):
        for name, python, child in (
            ("specdec", args.specdec_python, SPECDEC_CHILD),
            ("torch", sys.executable, TORCH_CHILD),
        ):
            out = run(python, child, args.gguf, ids)
            times[name].append(N_TOKENS / out["seconds"])
            tokens[name] = out["tokens"]
    same = tokens["specdec"] == tokens["torch"]
    for name, rates in times.items():
        print(
            f"{name:8s} {statistics.median(rates):6.1f} tokens/s (median of {len(rates)}; {min(rates):.1f}-{max(rates):.1f})"
        )
    print(f"same {N_TOKENS} greedy tokens: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
