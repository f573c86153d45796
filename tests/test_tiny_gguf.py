"""The real llama.cpp on a tiny random model that needs no model file (quick tier): 2 layers 64 wide, F32,
with a synthetic byte-level BPE tokenizer and a ChatML template (``randomgguf.write_tiny_gguf``), written
once per session in well under a second.

Target and draft are the same file, so every strategy accepts. The compiled row kernel and numpy
(``EDGESPEC_ROW_KERNEL=numpy``) take the same steps on it — tokens, trees, accepted paths, and the
draft distributions the planners saw — and greedy speculation equals plain decoding: the seed's greedy
choices win by ≥ 0.013 logits, where a batch's rows and single-token rows differ by ≤ 5e-4."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import randomgguf as R
from realmodels import chat_prompt

from edgespec.decoding import decoder
from edgespec.decoding.decoder import Request, generate
from edgespec.engine import EngineSettings, ModelPair
from edgespec.engine import draft as draft_module
from edgespec.engine import rows as row_module
from edgespec.measure.prompts import ENGINE_PROMPTS
from edgespec.planner.strategies import build as make_planner

TOKENS = 24
STRATEGIES = ("chain", "dyspec", "opt-tree", "tsd")
PROMPTS = ENGINE_PROMPTS


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> str:
    return str(R.write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf"))


@pytest.fixture(scope="module")
def tiny_pair(tiny_gguf, tmp_path_factory):
    probes = tmp_path_factory.mktemp("probes")  # the backend probe runs once for both loads of the file
    settings = EngineSettings(n_ctx=256, max_tree_nodes=16, threads=1, probe_dir=probes)
    with ModelPair(tiny_gguf, tiny_gguf, settings) as pair:
        yield pair


def test_the_synthetic_tokenizer_round_trips_text_and_renders_chats(tiny_pair):
    model = tiny_pair.target.model
    text = "def is_prime(n):\n    return n > 1  # wörld ✓"
    ids = model.tokenize(text, add_special=False)
    assert b"".join(model.piece(i) for i in ids).decode() == text
    assert len(ids) < len(text.encode())  # the merges apply
    chat = model.apply_chat_template([{"role": "user", "content": "hi"}])
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    specials = [model.tokenize(s, add_special=False)[0] for s in R.SPECIALS]
    assert model.tokenize(chat).count(specials[1]) == 2  # <|im_start|>: one control token each
    assert model.turn_tokens() == frozenset(specials) and model.is_eog(specials[2])


def test_the_command_line_writes_the_same_file(tiny_gguf, tmp_path):
    assert R.main(["--tiny", "--out", str(tmp_path / "cli.gguf")]) == 0
    assert (tmp_path / "cli.gguf").read_bytes() == Path(tiny_gguf).read_bytes()  # the seed decides all


def steps(pair, strategy: str, prompt: list[int]) -> tuple[list, list, list]:
    """A greedy generation: each step's exact facts and its floats (compared within 1e-6), and every
    distribution ``draft_dists`` gave (the draft's, and the target's root candidates)."""
    dists = []

    def recording(*args, **kwargs):
        found = row_module.draft_dists(*args, **kwargs)
        dists.extend(found)
        return found

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(draft_module, "draft_dists", recording)
        patch.setattr(decoder, "draft_dists", recording)
        events = list(generate(pair, make_planner(strategy, {"budget": 12}), Request(prompt, TOKENS)))
    exact = [
        (
            [(t.id, t.provenance) for t in e.tokens],
            e.accepted_path,
            e.tree and (e.tree.token_ids, e.tree.parent_ids),
            e.verified_nodes,
            e.draft_decodes,
            e.accepted,
        )
        for e in events
    ]
    floats = [([t.margin for t in e.tokens], e.expected_accept) for e in events]
    return exact, floats, dists


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_compiled_kernel_and_numpy_take_the_same_steps(tiny_pair, strategy, monkeypatch):
    runs = {}
    for which in ("kernel", "numpy"):
        row_module.kernel.cache_clear()
        monkeypatch.setenv("EDGESPEC_ROW_KERNEL", which)
        assert (row_module.kernel() is None) == (which == "numpy"), "the compiled row kernel was not built"
        runs[which] = [steps(tiny_pair, strategy, chat_prompt(tiny_pair, text)) for text in PROMPTS]
    row_module.kernel.cache_clear()
    for (exact_c, floats_c, dists_c), (exact_n, floats_n, dists_n) in zip(runs["kernel"], runs["numpy"]):
        assert exact_c == exact_n
        assert sum(len(e[0]) for e in exact_c) == TOKENS and sum(e[5] for e in exact_c) > 0
        for (margins_c, expected_c), (margins_n, expected_n) in zip(floats_c, floats_n):
            np.testing.assert_allclose(margins_c, margins_n, rtol=0, atol=1e-6)
            assert expected_c == pytest.approx(expected_n, abs=1e-5)
        assert len(dists_c) == len(dists_n) > 0
        for c, n in zip(dists_c, dists_n):
            np.testing.assert_array_equal(c.ids, n.ids)
            np.testing.assert_allclose(c.probs, n.probs, rtol=0, atol=1e-6)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_greedy_speculation_equals_plain_decoding(tiny_pair, strategy):
    for text in PROMPTS:
        request = Request(chat_prompt(tiny_pair, text), TOKENS)
        plain = [t for e in generate(tiny_pair, None, request) for t in e.tokens]
        assert min(t.margin for t in plain) > 0.01  # decisive: far above the batch noise (≤ 5e-4)
        events = list(generate(tiny_pair, make_planner(strategy, {"budget": 12}), request))
        assert [t.id for e in events for t in e.tokens] == [t.id for t in plain]
        assert sum(e.accepted for e in events) > 0
