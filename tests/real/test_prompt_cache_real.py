"""The prompt cache on the real bundled pair: greedy answers with the cache equal the fresh-start ones
(``serve --no-prompt-cache``) up to near-ties, and a conversation put back from host memory answers
bit for bit as before it left.

Why near-ties: with the cache, a turn's prompt is decoded as the new part on top of cells decoded by
earlier turns; from empty caches it is decoded in one piece. llama.cpp's CPU kernels compute a batch's
rows on another path than a short one (tests/realmodels.py, ``measure_batch_noise``), so logits differ
by up to ~0.6 and an exact near-tie can flip. Plain decoding here (the cache's effect alone): every
token carries its top-2 margin, and a divergence is accepted only where the fresh answer's margin is
within twice the measured bound.
"""

from __future__ import annotations

import threading
import time

import pytest

from edgespec.decoding.chat import ChatSettings, Message
from edgespec.decoding.events import GenerationStats
from edgespec.measure.bench_client import CONVERSATION as TURNS
from tests.support.realmodels import bundled_paths, measure_batch_noise

pytestmark = pytest.mark.model

SETTINGS = ChatSettings(max_tokens=16)


@pytest.fixture(scope="module")
def engine():
    from edgespec.engine.pair import EngineSettings, ModelPair
    from edgespec.session import PairEngine

    target, draft = bundled_paths()
    pair = ModelPair(target, draft, EngineSettings(n_ctx=4096, threads=2, max_tree_nodes=8))
    yield PairEngine(pair, cache_ram=128 * 1024 * 1024)
    pair.close()


def answer(engine, messages: list[Message]) -> tuple[list[int], list[float], str, GenerationStats, float]:
    """Plain greedy decoding: tokens, their margins, text, stats, seconds to the first token."""
    stats, start, first = GenerationStats(), time.monotonic(), None
    tokens, margins, text = [], [], []
    for event in engine.stream(None, messages, SETTINGS, threading.Event(), stats):
        first = first or time.monotonic() - start
        tokens += [t.id for t in event.tokens]
        margins += [t.margin for t in event.tokens]
        text.append(event.text)
    return tokens, margins, "".join(text), stats, first


def test_cached_answers_equal_fresh_ones_up_to_near_ties(engine):
    history: list[Message] = []
    cached = []
    for text in TURNS:
        history.append(Message("user", text))
        run = answer(engine, history)
        cached.append(run)
        history.append(Message("assistant", run[2]))
    fresh = []
    for turn in range(len(TURNS)):
        engine.forget()  # what --no-prompt-cache does before every answer
        fresh.append(answer(engine, history[: 2 * turn + 1]))
    noise = None
    for turn, (c, f) in enumerate(zip(cached, fresh), 1):
        print(
            f"\nturn {turn}: prompt {f[3].prompt_tokens} tokens; cached: decoded "
            f"{c[3].prompt_tokens - c[3].cached_tokens}, first token {c[4]:.2f} s; fresh: decoded "
            f"{f[3].prompt_tokens}, first token {f[4]:.2f} s"
        )
        assert c[3].prompt_tokens == f[3].prompt_tokens and f[3].cached_tokens == 0
        index = next((i for i, (a, b) in enumerate(zip(c[0], f[0])) if a != b), None)
        if index is None:
            assert c[0] == f[0]
            continue
        noise = noise if noise is not None else measure_batch_noise(engine.pair)
        print(f"turn {turn}: token {index} differs; fresh margin {f[1][index]:.3f}, bound {2 * noise:.3f}")
        assert f[1][index] <= 2 * noise + 1e-6, f"turn {turn}: token {index} is no near-tie"
    assert all(c[3].cached_tokens > 0 for c in cached[1:])


def test_a_conversation_put_back_from_host_memory_answers_bit_for_bit(engine):
    engine.forget()
    first = [Message("user", TURNS[0])]
    tokens, margins, text, _, _ = answer(engine, first)
    conversation = [*first, Message("assistant", text), Message("user", TURNS[1])]
    answer(engine, conversation)
    answer(engine, [Message("user", "Name three sorting algorithms.")])  # the conversation is saved
    info = engine.cache.info()
    assert info["conversations"] == 1 and 0 < info["bytes"] <= info["budget_bytes"]
    again = answer(engine, conversation)  # put back: its cells as they were
    assert engine.cache.restores >= 1
    assert again[3].cached_tokens == again[3].prompt_tokens - 1  # only the last token decoded again
    # The first answer decoded the last prompt token in one batch with the new message, `again` alone:
    # they agree up to near-ties (the test above). Put back once more, it answers bit for bit.
    answer(engine, [Message("user", "Name three sorting algorithms.")])
    twice = answer(engine, conversation)
    assert engine.cache.restores >= 2 and twice[3].cached_tokens == twice[3].prompt_tokens - 1
    assert (twice[0], twice[1]) == (again[0], again[1])
