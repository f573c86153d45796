"""Shared helpers for tests on the real bundled GGUF pair (marked ``model``).

Batch numerics: llama.cpp's CPU backend computes a batch of ≥ 4–5 tokens on another matmul path
than a single token, so logits differ by up to ~0.5 and exact near-ties can flip. ``batch_noise``
measures that bound on this machine; a divergence from plain decoding is accepted only where plain
decoding's top-2 logit gap is within twice of it (each of the two logits may move by the bound).
"""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.decoding.chat import ChatSettings, Message, prompt_tokens
from edgespec.decoding.decoder import Request, generate
from edgespec.decoding.sampling import SamplingParams
from edgespec.engine.ports import Joined
from edgespec.engine.rows import target_probs
from edgespec.measure.prompts import ENGINE_PROMPTS
from edgespec.planner.tree import ChildRule, chain_tree

BUNDLED_PAIR = "qwen2.5-coder-1.5b+0.5b"
MAX_TOKENS = 64  # plain decoding runs this long; strategies compare on a prefix of it


def bundled_paths() -> tuple[str, str]:
    """Paths of the installed bundled pair; skips when llama_cpp or the models are missing."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from edgespec.models.store import ModelStore

    store = ModelStore()
    spec = store.registry.pair(BUNDLED_PAIR)
    for model in (spec.target, spec.draft):
        if not store.is_installed(model.name):
            pytest.skip(
                f"bundled model {model.name} is not installed: run `edgespec models pull {BUNDLED_PAIR}`"
            )
    return str(store.path_for(spec.target.name)), str(store.path_for(spec.draft.name))


def chat_prompt(pair, text: str) -> list[int]:
    tokens, _ = prompt_tokens(pair, [Message("user", text)], ChatSettings(max_tokens=MAX_TOKENS))
    return tokens


def steps_with_rows(pair, planner, request: Request, keep=np.copy) -> tuple[list, list]:
    """Every step of ``request`` with ``keep`` of its verify rows (one row per tree node; ``keep`` reduces
    them before the next decode reuses the buffer), or None for a step that verified nothing: the
    first token, chosen from the row of the prompt's last token."""
    kept: list = []
    events: list = []
    rows: list = []
    original = pair.target.start_verify

    def record(out):
        kept.append(keep(_rows(out)))
        return out

    def recording_verify(tree, *args):
        return original(tree, *args).then(record)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pair.target, "start_verify", recording_verify)
        for event in generate(pair, planner, request):
            if event.verified_nodes:
                events.append(event)
                rows.append(kept.pop() if kept else None)
    assert not kept and rows[0] is None
    return events, rows


def _rows(out) -> np.ndarray:
    """The logits rows behind the engine's ``Verified`` (a committed root's row first, when joined)."""
    if isinstance(out, Joined):
        return np.vstack([_rows(out.root), _rows(out.rest)])
    return out.rows


def greedy_steps(pair, planner, text: str, max_tokens: int = MAX_TOKENS) -> list:
    """Greedy generation of ``text`` with ``planner``, checking the structural exactness of every step:
    token k of a step is the argmax of the verify row of the k-th node of its accepted path (lossless
    planners only). Returns the steps that verified a tree."""
    request = Request(prompt=chat_prompt(pair, text), max_tokens=max_tokens)
    events, rows_argmax = steps_with_rows(pair, planner, request, keep=lambda rows: rows.argmax(axis=1))
    for event, argmax in zip(events, rows_argmax):
        if argmax is None:  # nothing verified: the first token, or a step that drafted nothing
            continue
        for k, token in enumerate(event.tokens):
            assert token.id == argmax[event.accepted_path[k]]
    return events


def assert_sampled_in_nucleus(events: list, rows: list, params, note: str = "") -> None:
    """Every step's children were sampled (residual rule) and every emitted token has p > 0 under the
    target's sampling distribution at its verify row."""
    for event, logits in zip(events, rows):
        if logits is None:  # nothing verified: the first token, or a step that drafted nothing
            continue
        assert set(event.tree.child_rule.tolist()) <= {ChildRule.NONE, ChildRule.SAMPLED}
        for k, token in enumerate(event.tokens):
            assert target_probs(logits[event.accepted_path[k]], params)[token.id] > 0.0, note


def decode_one_by_one(pair, prefix: list[int], tokens: list[int]) -> np.ndarray:
    """Rows of ``tokens`` decoded one token per llama_decode after ``prefix`` (single-token numerics)."""
    pair.target.sync(prefix)
    return np.stack([pair.target.decode_root(token).rows[0].copy() for token in tokens])


def measure_batch_noise(pair) -> float:
    """Largest |logit difference| between a token's row inside a batch (chains of 2–16 tokens, every
    row, so deeper rows whose ancestors' KV was also computed in the batch count) and the same
    token decoded alone after single-token decodes of its ancestors."""
    worst = 0.0
    for text in ENGINE_PROMPTS[:2]:
        prompt = chat_prompt(pair, text)
        pair.target.sync(prompt[:-1])
        chain = [prompt[-1]]
        for _ in range(15):  # the greedy continuation, decoded one token at a time
            chain.append(int(np.argmax(pair.target.decode_root(chain[-1]).rows[0])))
        alone = decode_one_by_one(pair, prompt[:-1], chain)
        for size in (2, 3, 4, 5, 8, 9, 12, 16):
            pair.target.sync(prompt[:-1])  # drops the speculative cells: the same KV state again
            rows = pair.target.start_verify(chain_tree(chain[:size])).result().rows
            worst = max(worst, float(np.abs(rows - alone[:size]).max()))
    print(f"\nbatch-noise bound (max |Δlogit|, rows of a batch vs single-token decoding): {worst:.4f}")
    return worst


def plain_outputs(pair) -> dict[str, tuple[list[int], list[float]]]:
    """Plain greedy decoding of the engine prompt set: tokens and each token's top-2 margin."""
    runs = {}
    for text in ENGINE_PROMPTS:
        events = list(generate(pair, None, Request(prompt=chat_prompt(pair, text), max_tokens=MAX_TOKENS)))
        runs[text] = ([t.id for e in events for t in e.tokens], [t.margin for e in events for t in e.tokens])
    return runs


def first_divergence(tokens, plain_tokens, plain_margins, noise: float, label: str) -> int | None:
    """Index where ``tokens`` leaves plain decoding (None if never); fails unless it is a near-tie."""
    index = next((i for i, (a, b) in enumerate(zip(tokens, plain_tokens)) if a != b), None)
    if index is not None:
        assert plain_margins[index] <= 2 * noise + 1e-6, (
            f"{label}: token {index} differs from plain decoding although plain decoding's top-2 gap "
            f"there is {plain_margins[index]:.3f} > 2 × batch noise {noise:.3f}"
        )
    return index


NEAR_TIE = 0.25  # logits between the top two: within what another order of the same sums can move


def part_only_at_a_near_tie(a: dict, b: dict) -> bool:
    """Two ``generate --json`` answers of one prompt, computed with kernels that sum in other orders:
    their tokens are equal, or first differ where both answers' top-2 gap was under ``NEAR_TIE``."""
    index = next((i for i, (x, y) in enumerate(zip(a["tokens"], b["tokens"])) if x != y), None)
    return index is None or max(a["margins"][index], b["margins"][index]) < NEAR_TIE


def compiled_and_by_levels(
    pair, make_planner, prompt: list[int], method: str, reference, sampling: SamplingParams | None = None
) -> list[tuple]:
    """Whole generations (40 tokens; greedy unless ``sampling`` says) with the engine's compiled
    ``Draft.<method>`` and again with ``reference`` (the level-by-level path through ``expand``) in its
    place; asserts that every step's tokens, provenances, margins, tree size, decodes, accepted count and
    E[A] are equal, and that the draft cache holds as many cells. Returns the steps (the compiled run's)."""

    def steps():
        request = Request(prompt=prompt, max_tokens=40, sampling=sampling or SamplingParams())
        events = generate(pair, make_planner(), request)
        return [
            (
                [(t.id, t.provenance, t.margin) for t in e.tokens],
                e.verified_nodes,
                e.draft_decodes,
                e.accepted,
                e.expected_accept,
            )
            for e in events
        ]

    compiled = steps()
    compiled_cells = pair.draft.ctx.seq_state_bytes(0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(pair.draft), method, reference)
        by_levels = steps()
    assert compiled == by_levels  # exactly
    assert pair.draft.ctx.seq_state_bytes(0) == compiled_cells
    return compiled
