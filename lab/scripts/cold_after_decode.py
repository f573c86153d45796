"""How much slower Python runs right after a CPU decode, and whether the decode's core matters: a fixed bit of
planner bookkeeping timed warm, right after a one-token draft decode on the same core, and right after the
same decode run by a thread pinned to the other core (the caller waiting). Needs two cores.

    OMP_NUM_THREADS=1 python scripts/cold_after_decode.py [repeats]

With llama.cpp on one thread, the decode computes on the calling thread and streams the weights through
that core's caches; what the interpreter and the planner's objects had there is gone (issue 12, twelfth pass).
"""

import os
import statistics
import sys
import threading
from time import perf_counter

import numpy as np

from edgespec.engine.pair import EngineSettings
from edgespec.models.pairs import open_pair, resolve_pair
from edgespec.planner.tree import SparseDist, TreeBuilder

REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 60
IDS = np.zeros((8, 8), np.int32)


def bookkeeping() -> list[SparseDist]:
    """What a planner does between two decodes, in small: a 16-node tree, its paths, eight distributions."""
    tree = TreeBuilder(5)
    for node in range(1, 17):
        tree.add((node - 1) // 2, 100 + node, 0.5)
    paths = {tuple(tree.path_tokens(node)): node for node in range(16)}
    return [SparseDist(ids=IDS[r, : len(paths) % 8 + 1], probs=IDS[r, :4]) for r in range(8)]


def timed() -> float:
    start = perf_counter()
    bookkeeping()
    return (perf_counter() - start) * 1e6


with open_pair(resolve_pair(), EngineSettings(threads=1, row_helper=False)) as pair:
    ctx = pair.draft.ctx
    prompt = pair.draft.model.tokenize("Write a Python function that checks whether a word is a palindrome.")
    n = len(prompt)
    ctx.decode(prompt, range(n), [(0,)] * n, [i == n - 1 for i in range(n)])

    def decode() -> None:  # one token after the prompt, then forgotten: every decode is the same
        ctx.decode([42], [n], [(0,)], [True])
        ctx.seq_rm(0, n)

    os.sched_setaffinity(0, {0})
    job, done = threading.Event(), threading.Event()

    def other_core() -> None:
        os.sched_setaffinity(0, {1})
        while True:
            job.wait()
            job.clear()
            decode()
            done.set()

    threading.Thread(target=other_core, daemon=True).start()
    times: dict[str, list[float]] = {"warm": [], "after a decode on this core": [], "after one elsewhere": []}
    for _ in range(REPEATS):
        bookkeeping()
        times["warm"].append(timed())
        bookkeeping()
        decode()
        times["after a decode on this core"].append(timed())
        bookkeeping()
        done.clear()
        job.set()
        done.wait()
        times["after one elsewhere"].append(timed())
    for label, values in times.items():
        print(f"{label:28s} {statistics.median(values):6.1f} µs (median of {len(values)})")
