"""The models: transformer forward passes in NumPy, with an explicit KV cache. The bottom layer.

    base.py       the seam: `CausalLM` (what samplers, drafters and the cost model may ask of
                  a model) and `LanguageModel` (the plumbing every architecture shares)
    gpt2.py       GPT-2's embedding, block and final norm       llama.py  Llama's (SmolLM2)
    qwen2.py      Qwen2: a Llama whose q, k and v projections have biases
    attention.py  softmax, masked attention, the tree mask      cache.py  the KV cache
    packing.py    a ragged batch in one matrix; long prompts in chunks
    kernels.py, threads.py   the matrix products and the workers that split them
    tokenizer.py  GPT-2's and Llama's byte-level BPE (tiktoken)
    restricted.py a draft vocabulary (FR-Spec's top N) and models whose LM head scores only it
    shapes.py     GPT-2's sizes, and random models of them for tests and benchmarks

May import: NumPy, tiktoken, the modules of model/ itself and safe_io.py (the one
way to read and write a file); nothing else of specdec (tests/test_imports.py
checks this). No file I/O but reading a tokenizer and the kernel plan (tuning.py).
"""
