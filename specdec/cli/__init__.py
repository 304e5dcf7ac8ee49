"""The command line's rooms besides its flags and the race (specdec/__main__.py):

    cache.py     `python -m specdec cache`: what is stored on disk, with sizes, and removing it
    batch.py     `--batch N`: the prompts of a file decoded together by both batched decoders
    terminal.py  the status line and the text streamed as it is decided
    equivalent.py  `--equivalent ENGINE`: the run's flags written for transformers, vLLM, SGLang or llama.cpp

Layer: the top, beside __main__.py. May import anything in specdec but bench/ and train/;
nothing in specdec imports it but __main__.py.
"""
