"""The real llama.cpp on a tiny random model that needs no model file (quick tier): 2 layers 64 wide, F32,
with a synthetic byte-level BPE tokenizer and a ChatML template (``randomgguf.write_tiny_gguf``), written
once per session in well under a second.

Target and draft are the same file, so every strategy accepts. The row reductions on llama.cpp's own
logits buffer equal a full sort and a float64 softmax of the same rows, and greedy speculation equals
plain decoding: the seed's greedy choices win by ≥ 0.013 logits, where a batch's rows and single-token
rows differ by ≤ 5e-4."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgespec.decoding.decoder import Request, generate
from edgespec.engine import EngineSettings, ModelPair
from edgespec.engine import draft as draft_module
from edgespec.engine import rows as row_module
from edgespec.measure.prompts import ENGINE_PROMPTS
from edgespec.planner.strategies import build as make_planner
from tests.support.realmodels import chat_prompt
from tests.support.sampling_reference import full_vocabulary_top_k
from tests.support.scripts import load

R = load("randomgguf")

TOKENS = 24
STRATEGIES = ("chain", "dyspec", "opt-tree", "tsd")
PROMPTS = ENGINE_PROMPTS


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


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_rows_read_from_llama_cpp_reduce_as_the_full_vocabulary_reference(tiny_pair, strategy):
    """Every ``draft_dists`` call of a generation (the draft's levels, the target's root candidates), on
    the rows as llama.cpp's logits buffer holds them: the ids and probabilities of a full sort and a
    float64 softmax of the same rows."""
    calls, draft_dists = [], row_module.draft_dists

    def recording(logits_rows, k, temperature, vocab_limit, exclude=()):
        found = draft_dists(logits_rows, k, temperature, vocab_limit, exclude)
        calls.append((np.array(logits_rows), k, temperature, vocab_limit, found))
        return found

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(draft_module, "draft_dists", recording)
        patch.setattr(row_module, "draft_dists", recording)
        for text in PROMPTS:
            list(
                generate(
                    tiny_pair,
                    make_planner(strategy, {"budget": 12}),
                    Request(chat_prompt(tiny_pair, text), TOKENS),
                )
            )
    assert calls
    for rows, k, temperature, vocab_limit, found in calls:
        ids, probs = full_vocabulary_top_k(rows, k, temperature, vocab_limit)
        for r, dist in enumerate(found):
            np.testing.assert_array_equal(dist.ids, ids[r])
            np.testing.assert_allclose(dist.probs, probs[r], rtol=0, atol=1e-6)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_greedy_speculation_equals_plain_decoding(tiny_pair, strategy):
    for text in PROMPTS:
        request = Request(chat_prompt(tiny_pair, text), TOKENS)
        plain = [t for e in generate(tiny_pair, None, request) for t in e.tokens]
        assert min(t.margin for t in plain) > 0.01  # decisive: far above the batch noise (≤ 5e-4)
        events = list(generate(tiny_pair, make_planner(strategy, {"budget": 12}), request))
        assert [t.id for e in events for t in e.tokens] == [t.id for t in plain]
        assert sum(e.accepted for e in events) > 0



def test_the_first_token_waits_for_the_target_alone_and_the_draft_reads_the_reply_between_replies(
    tiny_pair,
):
    """A reply's first step decodes nothing on the draft (the prompt's new part is read with the second
    step's first level), and ``Draft.absorb`` between replies leaves only the new message for the next
    one: with or without it, the next reply's tokens are plain decoding's."""
    planner = make_planner("chain", {"budget": 6})
    draft = tiny_pair.draft
    first = chat_prompt(tiny_pair, PROMPTS[0])
    for absorb in (False, True):
        tiny_pair.forget()  # a new conversation
        events = list(generate(tiny_pair, planner, Request(first, TOKENS)))
        assert events[0].draft_decodes == 0 and len(events[0].tokens) == 1
        assert events[1].draft_decodes > 0 and sum(e.accepted for e in events) > 0
        reply = [t.id for e in events for t in e.tokens]
        while absorb and draft.absorb(2):
            pass
        assert len(draft.pending) <= 1 or not absorb
        follow_up = first + reply + chat_prompt(tiny_pair, PROMPTS[1])[1:]
        lag = len(follow_up) - 1 - len(draft.committed)
        events = list(generate(tiny_pair, planner, Request(follow_up, TOKENS)))
        assert events[0].draft_decodes == 0 and events[1].draft_decodes > 0
        plain = [t.id for e in generate(tiny_pair, None, Request(follow_up, TOKENS)) for t in e.tokens]
        assert [t.id for e in events for t in e.tokens] == plain
        if absorb:
            assert lag < len(chat_prompt(tiny_pair, PROMPTS[1]))  # only the new message was left to read
