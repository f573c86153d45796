"""Logits rows read on two cores (``decoding/_row_split.h``): the helper thread reads a row's second half
(and runs the compiled calls' decodes on its core), and every result is the same, bit for bit, as one core
doing everything — for the row kernels alone, under concurrent callers, in a forked child, and for whole
generations of the compiled and Python drafters."""

from __future__ import annotations

import argparse
import dataclasses
import os
import pickle
import threading
import time

import numpy as np
import pytest
from realmodels import chat_prompt

from edgespec import options
from edgespec.decoding import _rows
from edgespec.decoding.decoder import Request, generate
from edgespec.decoding.sampling import SamplingParams, argmax_margin, draft_dists
from edgespec.engine.pair import EngineSettings
from edgespec.measure.prompts import ENGINE_PROMPTS
from edgespec.planner.chain import ChainPlanner
from edgespec.planner.costmodel import CostModel
from edgespec.planner.dyspec import DySpecPlanner
from edgespec.planner.opt_tree import OptTreePlanner
from edgespec.planner.tsd import TSDPlanner

WIDTHS = [151_936, 151_665, 1000, 129, 100, 64]  # the bundled vocabulary, its real ids, odd and tiny rows


def _rows_of(width: int, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = rng.normal(0.0, 2.5, size=(n, width)).astype(np.float32)
    rows[:, rng.integers(0, width, size=3)] += 12.0  # peaks, as a model's rows have
    return rows


def _reduce(rows: np.ndarray, temperature: float) -> list:
    dists = draft_dists(rows, 32, temperature, rows.shape[1], exclude=[7, 3])
    margins = [argmax_margin(row) for row in rows]
    return [(d.ids.tobytes(), d.probs.tobytes()) for d in dists] + margins


def _on_two_cores(work, *args):
    """``work(*args)`` with the helper armed and polling (it wakes in well under 20 ms)."""
    _rows.row_helper_arm()
    try:
        time.sleep(0.02)
        return work(*args)
    finally:
        _rows.row_helper_disarm()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_two_cores_give_the_same_bits_as_one(temperature):
    for width in WIDTHS:
        rows = _rows_of(width, 24, seed=width)
        alone = _reduce(rows, temperature)
        before = _rows.row_helper_halves()
        helped = _on_two_cores(_reduce, rows, temperature)
        assert helped == alone, width  # ids, probabilities (as bytes) and margins
        if width > 64:  # a row of one block has no second half
            assert _rows.row_helper_halves() > before, width  # the helper did read halves


def test_concurrent_callers_share_the_helper_safely():
    rows = [_rows_of(151_936, 6, seed=s) for s in range(4)]
    alone = [_reduce(r, 1.0) for r in rows]
    results: dict[int, list] = {}

    def caller(i: int) -> None:
        results[i] = [_reduce(rows[i], 1.0) for _ in range(5)]

    def all_callers() -> None:
        threads = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "a caller hung"

    _on_two_cores(all_callers)
    for i in range(4):
        assert all(result == alone[i] for result in results[i])


def test_a_forked_child_gets_a_helper_of_its_own():
    rows = _rows_of(151_936, 8, seed=5)
    alone = _reduce(rows, 1.0)
    _on_two_cores(lambda: _reduce(rows, 1.0))  # the parent's helper exists (and may be polling)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            before = _rows.row_helper_halves()
            helped = _on_two_cores(lambda: _reduce(rows, 1.0))
            os.write(write, pickle.dumps((helped, _rows.row_helper_halves() - before)))
        finally:
            os._exit(0)
    os.close(write)
    deadline = time.monotonic() + 60
    while os.waitpid(child, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(child, 9)
            pytest.fail("the forked child hung")
        time.sleep(0.05)
    with os.fdopen(read, "rb") as pipe:
        helped, halves = pickle.loads(pipe.read())
    assert helped == alone and halves > 0


def test_the_helper_runs_only_where_a_core_is_spare():
    cores = len(os.sched_getaffinity(0))
    assert EngineSettings(threads=1).context().row_helper == (cores > 1)
    assert EngineSettings(threads=cores).context().row_helper is False
    assert EngineSettings().context().row_helper is False  # threads=0: llama.cpp takes every core
    assert EngineSettings(threads=1, row_helper=False).context().row_helper is False
    assert EngineSettings(row_helper=True).context().row_helper is True
    parser = argparse.ArgumentParser()
    options.add_model_args(parser)
    parser.add_argument("--max-tree-nodes-unused", default=None)
    assert options.engine_settings(parser.parse_args(["--threads", "1"])).row_helper is None
    assert options.engine_settings(parser.parse_args(["--no-row-helper"])).row_helper is False


def _opt_tree() -> OptTreePlanner:
    planner = OptTreePlanner(budget=16)
    planner.use_costs(CostModel.from_functions(lambda n: 1.0 + 0.05 * n, lambda m: 0.33 * m))  # a CPU's shape
    return planner


@pytest.mark.model
@pytest.mark.parametrize(
    "make_planner, sampling",
    [
        (lambda: ChainPlanner(gamma=4), SamplingParams()),  # compiled chain and verify
        (lambda: DySpecPlanner(budget=16), SamplingParams()),  # compiled tree
        (_opt_tree, SamplingParams(temperature=0.8, seed=4)),  # compiled levels, sampled (Python verify)
        (lambda: TSDPlanner(budget=16), SamplingParams()),  # levels through Draft.expand (draft_dists)
    ],
    ids=["chain", "dyspec", "opt-tree-sampled", "tsd"],
)
def test_generations_are_identical_with_the_helper(pair, make_planner, sampling):
    import llama_cpp

    prompt = chat_prompt(pair, ENGINE_PROMPTS[2])
    contexts = [pair.target.ctx, pair.draft.ctx]

    def steps() -> list:
        request = Request(prompt=prompt, max_tokens=32, sampling=sampling)
        return [
            ([(t.id, t.provenance, t.margin) for t in e.tokens], e.verified_nodes, e.draft_decodes,
             e.accepted, e.expected_accept)
            for e in generate(pair, make_planner(), request)
        ]  # fmt: skip

    alone = steps()
    before, jobs_before = _rows.row_helper_halves(), _rows.row_helper_jobs()
    with pytest.MonkeyPatch.context() as patch:
        for ctx in contexts:  # llama.cpp on one thread, so that the helper has a core to itself
            patch.setattr(ctx, "settings", dataclasses.replace(ctx.settings, row_helper=True))
            llama_cpp.llama_set_n_threads(ctx.ptr, 1, 1)
        try:
            helped = steps()
        finally:
            for ctx in contexts:
                threads = ctx.settings.n_threads or os.cpu_count() or 1
                llama_cpp.llama_set_n_threads(ctx.ptr, threads, threads)
    assert helped == alone  # every token, provenance, margin, tree size, decode count and E[A]
    assert _rows.row_helper_halves() > before
    assert _rows.row_helper_jobs() > jobs_before  # decodes ran on the helper's core
    assert any(verified > 2 for _, verified, _, _, _ in alone)
