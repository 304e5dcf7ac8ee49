"""Time specdec and transformers + PyTorch on the same GPT-2-shaped weights.

Not part of specdec, its tests or its requirements: run it in a throwaway
virtual environment that has torch and transformers as well as specdec.

    python -m venv torchvenv
    torchvenv/bin/pip install torch==2.13.0 transformers -e .
    torchvenv/bin/python docs/compare_torch.py --sizes 124M,355M

It writes random-weight checkpoints (the Hub's file layout; a forward pass's
cost depends only on the shapes) under --models-dir, then times each engine in
its own fresh process, alternating engines `--rounds` times, and prints the
median of each figure:

    load       specdec.load_model(folder) / GPT2LMHeadModel.from_pretrained(folder) (specdec's
               first load, which also writes its kept layout, is done untimed beforehand)
    step       one KV-cached 1-token step at context 256, ms
    r(m)       a pass over m new tokens at context 256 / one step, m = 2..16
    greedy     ms per token of greedy decoding, 128 tokens after an 8-token prompt
    lookup     speedup of prompt-lookup speculative decoding (4 drafts per round)
               over the same engine's greedy decoding, same 128 tokens
    prompt     one pass over a 600-token prompt, s

Separate processes keep one engine's threads (PyTorch's OpenMP workers spin
after each call) from slowing the other.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONTEXT, M_MAX, N_TOKENS, PROMPT_PASS = 256, 16, 128, 600


def timed(fn, repeats: int) -> list[float]:
    fn()  # warm-up
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def measure_specdec(folder: Path, repeats: int) -> dict:
    import numpy as np

    from specdec import load_model
    from specdec.autoregressive import autoregressive_sample
    from specdec.speculative import speculative_sample

    start = time.perf_counter()
    model = load_model(str(folder), progress=False)
    load = time.perf_counter() - start
    ids = [int(t) for t in np.random.default_rng(0).integers(0, model.n_vocab, PROMPT_PASS)]
    cache = model.new_cache()
    model.forward(ids[:CONTEXT], cache, last_only=True)

    def pass_over(m):
        model.forward(ids[CONTEXT : CONTEXT + m], cache)
        cache.rollback(CONTEXT)

    passes = {m: statistics.median(timed(lambda m=m: pass_over(m), repeats)) for m in range(1, M_MAX + 1)}
    prompt = ids[:8]
    greedy = statistics.median(timed(lambda: autoregressive_sample(model, prompt, N_TOKENS), 3))
    lookup = statistics.median(timed(lambda: speculative_sample(model, "ngram", prompt, N_TOKENS, K=4), 3))
    prompt_pass = statistics.median(timed(lambda: model.forward(ids, model.new_cache(), last_only=True), 3))
    return result(load, passes, greedy, lookup, prompt_pass)


def measure_torch(folder: Path, repeats: int) -> dict:
    import numpy as np
    import torch
    from transformers import DynamicCache, GPT2LMHeadModel

    torch.set_grad_enabled(False)
    start = time.perf_counter()
    model = GPT2LMHeadModel.from_pretrained(folder, dtype=torch.float32).eval()
    load = time.perf_counter() - start
    n_vocab = model.config.vocab_size
    ids = torch.tensor(np.random.default_rng(0).integers(0, n_vocab, PROMPT_PASS))[None]
    cache = DynamicCache()
    model(ids[:, :CONTEXT], past_key_values=cache, use_cache=True)

    def pass_over(m):
        model(ids[:, CONTEXT : CONTEXT + m], past_key_values=cache, use_cache=True)
        cache.crop(-m)  # transformers 5: a negative count of tokens to drop

    passes = {m: statistics.median(timed(lambda m=m: pass_over(m), repeats)) for m in range(1, M_MAX + 1)}
    prompt = ids[:, :8]
    settings = dict(max_new_tokens=N_TOKENS, min_new_tokens=N_TOKENS, do_sample=False, pad_token_id=0)
    greedy = statistics.median(timed(lambda: model.generate(prompt, **settings), 3))
    lookup = statistics.median(timed(lambda: model.generate(prompt, prompt_lookup_num_tokens=4, **settings), 3))
    # The last position's logits only, as specdec's last_only=True: no LM head over all 600 rows.
    prompt_pass = statistics.median(timed(lambda: model(ids, use_cache=True, logits_to_keep=1), 3))
    return result(load, passes, greedy, lookup, prompt_pass)


def result(load: float, passes: dict, greedy: float, lookup: float, prompt_pass: float) -> dict:
    return {
        "load_s": load,
        "step_ms": passes[1] * 1e3,
        "r": [passes[m] / passes[1] for m in sorted(passes)],
        "greedy_ms_per_token": greedy / N_TOKENS * 1e3,
        "lookup_speedup": greedy / lookup,
        "prompt_pass_s": prompt_pass,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="124M,355M", help="GPT-2 shapes (default %(default)s)")
    p.add_argument(
        "--models-dir",
        default=str(Path(tempfile.gettempdir()) / "specdec-compare"),
        help="where the checkpoints go (default %(default)s)",
    )
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per engine (default %(default)s)")
    p.add_argument("--repeats", type=int, default=10, help="timed passes per m in each process (default %(default)s)")
    p.add_argument("--engine", choices=["specdec", "torch"], help=argparse.SUPPRESS)  # one child process
    p.add_argument("--folder", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.engine:
        measure = measure_specdec if args.engine == "specdec" else measure_torch
        print(json.dumps(measure(Path(args.folder), args.repeats)))
        return

    root = Path(args.models_dir)
    subprocess.run(
        [sys.executable, "-m", "specdec.bench", "--write-checkpoints", str(root), "--sizes", args.sizes], check=True
    )
    for size in args.sizes.split(","):
        # A first load writes specdec's kept transposed layout beside the checkpoint (specdec/layoutcache.py);
        # every timed load is a later one, as every load after a model's first is.
        first_load = f"import specdec; specdec.load_model({str(root / size)!r}, progress=False)"
        subprocess.run([sys.executable, "-c", first_load], check=True)
        runs = {"specdec": [], "torch": []}
        for _ in range(args.rounds):
            for engine in runs:
                cmd = [
                    sys.executable,
                    __file__,
                    "--engine",
                    engine,
                    "--folder",
                    str(root / size),
                    "--repeats",
                    str(args.repeats),
                ]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                runs[engine].append(json.loads(out.strip().splitlines()[-1]))
        print(f"\n{size} (medians of {args.rounds} fresh processes per engine)")
        print(f"{'':24} {'specdec':>9} {'torch':>9}")
        for key, label in [
            ("load_s", "load, s"),
            ("step_ms", "1-token step, ms"),
            ("greedy_ms_per_token", "greedy, ms/token"),
            ("lookup_speedup", "prompt lookup, x"),
            ("prompt_pass_s", f"{PROMPT_PASS}-token prompt, s"),
        ]:
            a, b = (statistics.median(run[key] for run in runs[e]) for e in ("specdec", "torch"))
            print(f"{label:24} {a:9.3f} {b:9.3f}")
        for m in (2, 3, 5, 9, 16):
            a, b = (statistics.median(run["r"][m - 1] for run in runs[e]) for e in ("specdec", "torch"))
            print(f"{f'r({m})':24} {a:9.2f} {b:9.2f}")


if __name__ == "__main__":
    main()
