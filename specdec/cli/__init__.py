"""The command line: `python -m specdec`, `specdec` and `python main.py`.

    main.py        loads the models, runs the race (specdec/race/) and prints it, as text or JSON
    args.py        the flags, parsed and checked before anything is downloaded; the embedded default run
                   (defaults.py)
    rules.py       the rules between flags: a redundant flag noted, a contradiction refused, the names checked
    flags.py       the strict parser the command line, `python -m specdec.bench` and `python -m specdec.train`
                   share: no abbreviations, --k-max and --k_max alike, refusals in one line
    cache.py       `specdec cache`: what is stored on disk, with sizes, and removing it
    batch.py       `--batch N`: the prompts of a file decoded together by both batched decoders
    terminal.py    the status line and the text streamed as it is decided
    equivalent.py  `--equivalent ENGINE`: the run's flags written for transformers, vLLM, SGLang or llama.cpp
    experiment.py  what equivalent.py writes: the flags as one experiment, the weights as each engine finds them

Layer: the top. May import anything in specdec but bench/ and train/; nothing in specdec imports it but
__main__.py, and bench/ and train/, which take flags.py.
"""
