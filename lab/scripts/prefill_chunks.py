"""A prompt's decode in chunks of 512 tokens (one n_batch) against chunks of 128 (runners.CANCEL_CHUNK,
so that a client who leaves frees the model within a chunk): the bundled target, ABAB rounds.

    python lab/scripts/prefill_chunks.py [--rounds 4] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from edgespec.engine import EngineSettings, ModelPair, runners
from edgespec.models.store import ModelStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    store = ModelStore()
    target = str(store.path_for(store.registry.default_pair.target.name))
    with ModelPair(target, None, EngineSettings(n_ctx=4096, max_tree_nodes=8, threads=args.threads)) as pair:
        words = " ".join(f"word{i}" for i in range(260))
        prompt = pair.target.model.tokenize(f"Summarise: {words}", add_special=True, parse_special=False)
        seconds: dict[int, list[float]] = {512: [], 128: []}
        for _ in range(args.rounds):
            for chunk in (512, 128):
                runners.CANCEL_CHUNK = chunk
                pair.forget()
                start = time.perf_counter()
                pair.target.start_prefill(prompt, cancel=threading.Event()).result()
                seconds[chunk].append(time.perf_counter() - start)
                print(f"{len(prompt)} tokens in chunks of {chunk}: {seconds[chunk][-1]:.2f} s", flush=True)
        ratios = [b / a for a, b in zip(seconds[512], seconds[128])]
        medians = {chunk: statistics.median(times) for chunk, times in seconds.items()}
        print(f"median 512: {medians[512]:.2f} s, 128: {medians[128]:.2f} s")
        print(f"paired ratios 128/512: {', '.join(f'{r:.2f}' for r in ratios)}")


if __name__ == "__main__":
    main()
