"""One forward pass over m new tokens, for m around kernels.MAX_SPLIT_ROWS (64), on a model by name.

    python docs/measure_prefill.py smollm2-135m 1 16 17 64 65 95 400

Prints the best of 3 passes for each m, and the load average before and after. Above 64 tokens
`kernels.linear` hands each product to OpenBLAS's own threads: fast on an idle machine, but on a
2-core machine where one other job is running, that product waits for the busy core (see
docs/notes/performance.md, "Prompts on a busy machine").
"""

import os
import sys
import time

import specdec


def main(argv: list[str]) -> None:
    name, sizes = argv[0], [int(m) for m in argv[1:]] or [1, 16, 17, 32, 95, 400]
    model = specdec.load_model(name) if not name.startswith("shape:") else specdec.random_model(name[6:])
    print(f"load average {os.getloadavg()[0]:.2f}")
    for m in sizes:
        times = []
        for _ in range(3):
            cache = model.new_cache()
            start = time.perf_counter()
            model.forward(list(range(100, 100 + m)), cache)
            times.append(time.perf_counter() - start)
        print(f"{m:4d} tokens: {min(times) * 1000:7.0f} ms", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
