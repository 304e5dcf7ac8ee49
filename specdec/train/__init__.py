"""Train drafters for a target, GPT-2 or Llama (SmolLM2), in NumPy: Medusa and EAGLE draft heads, and a
small distilled draft model.

Layer: a tool beside the samplers. May import model/, checkpoints/, drafters/ and the
round's autoregressive.py, config.py, sampling.py, cli/flags.py and safe_io/ (the one way to
write and to read a file); nothing imports it but bench/
(tests/test_imports.py).

    python -m specdec.train medusa --model 124M --tokens 20000 --out heads/medusa-124M
    python -m specdec.train data --model smollm2-135m --out distill-data --tokens 400000
        (self-distillation shards from a chat model, batched and resumable: distill.py; their format: shards.py)
    python -m specdec.train eagle --model smollm2-135m --data distill-data --out heads/eagle-smollm2 --block llama
        (heads trained on those shards: heads_train.py; a Llama block for a Llama target: eagle_llama.py)
    python -m specdec.train draft --model smollm2-135m --data DIR --out runs/smollm2-draft --vocab-top 8192
        (a small separate draft model distilled on shards: draft_model.py, docs/draft-model.md)
    python -m specdec.train eagle  --model models/tiny --tokens 4000 --out heads/eagle-tiny --vocab-top 2000

Then draft with them: speculative_sample(target, "medusa:DIR", ...), or
`python main.py --draft medusa:DIR`.

What it does with --tokens (the data made in memory, data.py), in order:
1. Data by self-distillation (Medusa section 3.3.2; EAGLE trains on the target's
   features too): the target generates its own training text, starting from
   <|endoftext|>; each sequence starts with a few tokens sampled at T=1 (a prompt
   the model itself finds likely), then continues greedily or sampled at T=1 (the
   two decoding modes the heads will serve). While generating, the target's
   hidden state after ln_f is kept at every position: those are the features
   both heads read. No text corpus is read, so no held-out text is ever trained
   on. Tokens and features are cached in DIR/data.npz.
2. Labels: by default the target's own next-token DISTRIBUTION at each position
   (softmax of its logits, T=1): a head is trained towards what the target would
   draw, not one sampled token (`--labels tokens` uses the generated tokens).
3. Training with hand-written gradients (medusa.py, eagle_grad.py) and AdamW, a
   cosine learning rate after a warm-up; DIR/checkpoint.* after every
   `--save-every` steps, so `--resume` continues an interrupted run.
4. Held-out evaluation: teacher-forced top-1 / top-5 accuracy per head on a
   separately generated set (another seed), before and after training.
5. DIR/heads.json, naming the model the heads belong to and their weights file,
   DIR/heads-<sha256 prefix>.safetensors (the pair is replaced atomically).
"""

from .cli import main
from .data import self_distill
from .loop import train

__all__ = ["train", "self_distill", "main"]
