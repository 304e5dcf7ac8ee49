"""The models: transformer forward passes in NumPy, with an explicit KV cache. The bottom layer.

Read a pass in four files, in this order:
    gpt2.py       GPT-2's embedding, block and final norm: the maths, each projection `x @ lin`
    attention.py  masked attention, the tree mask, and attention's memory: the KV cache
    base.py       the seam: `CausalLM` (what samplers, drafters and the cost model may ask of a
                  model), and `forward`: a chain, a tree or a ragged batch packed into one pass
    linear.py     a weight matrix, and what `x @ lin` computes (exactly x @ W + b)
Then llama.py beside gpt2.py (Llama's block: RMSNorm, rotary positions, grouped-query attention,
SwiGLU), and qwen2.py (a Llama whose q, k and v have biases).

Beside them, never needed to read a pass:
    fast/         how the products run fast on a CPU (row splits over the cores, OpenBLAS's threads,
                  a plan timed once per machine); SPECDEC_KERNELS=plain switches it off
    tokenizer.py  GPT-2's and Llama's byte-level BPE (tiktoken)
    restricted.py a draft vocabulary (FR-Spec's top N) and models whose LM head scores only it
    shapes.py     GPT-2's sizes, and random models of them for tests and benchmarks

May import: NumPy, tiktoken, the modules of model/ itself and safe_io/ (the one way to
read and write a file); nothing else of specdec (tests/test_imports.py checks this).
No file I/O but reading a tokenizer and model/fast/'s plan file.
"""
