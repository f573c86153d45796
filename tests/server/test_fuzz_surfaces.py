"""Fuzzing the second round's surfaces with Hypothesis against a real `edgespec serve` (127.0.0.1):
text completions with token-array prompts and fill in the middle, /infill, stop strings, tools and tool
calls, and every output path under any token sequence — a tiny model that writes arbitrary bytes
(lone continuation bytes, broken characters, `<tool_call>` fragments), streamed and whole. No 5xx, no
stream without its end, no traceback in the log. Examples are derandomized: every run tries the same."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from tests.support.hostile import Served
from tests.support.scripts import load

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

R = load("randomgguf")

FUZZ = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
TIMEOUT = 30.0

ODD = st.sampled_from(
    ["<tool_call>", "</tool_call>", "<|im_end|>", "\ufffd", "\x00", "é", "\n\n", "```", "{"]
)
TEXT = st.one_of(st.text(max_size=30), ODD, st.lists(ODD, max_size=4).map("".join))
TOKEN_IDS = st.lists(
    st.one_of(st.integers(0, 400), st.integers(-(2**63), 2**63), st.sampled_from([0, 127, 128, 255, 372])),
    max_size=12,
)
STOP = st.one_of(
    st.none(), TEXT, st.lists(TEXT, max_size=5), st.integers(), st.lists(st.integers(), max_size=2)
)
COMMON = {
    "max_tokens": st.one_of(st.integers(1, 12), st.sampled_from([0, -1, "4", None])),
    "temperature": st.one_of(st.sampled_from([0, 0.7, 2.0, 3.0, -1, None])),
    "seed": st.one_of(st.none(), st.integers(0, 2**64)),
    "stop": STOP,
    "stream": st.one_of(st.booleans(), st.none(), st.just("yes")),
    "logprobs": st.one_of(st.none(), st.booleans(), st.integers(0, 3)),
    "prompt_cache_key": st.one_of(st.none(), TEXT, st.integers()),
}


def body_of(required: dict) -> st.SearchStrategy:
    return st.fixed_dictionaries(required, optional=COMMON)


# Bodies the server answers (so that the output paths run): valid settings, any text and token ids
WORDS = st.one_of(ODD, st.lists(ODD, min_size=1, max_size=4).map("".join), st.text(min_size=1, max_size=20))
ANSWERED = st.fixed_dictionaries(
    {
        "prompt": st.one_of(WORDS, st.lists(st.integers(0, 255), min_size=1, max_size=12)),
        "max_tokens": st.integers(1, 12),
        "stream": st.booleans(),
    },
    optional={
        "stop": st.lists(WORDS, max_size=4),
        "seed": st.integers(0, 2**32),
        "prompt_cache_key": st.text(max_size=8),
    },
)


COMPLETION = body_of(
    {
        "prompt": st.one_of(TEXT, TOKEN_IDS, st.lists(TOKEN_IDS, max_size=2), st.lists(TEXT, max_size=2)),
    }
).flatmap(
    lambda b: st.fixed_dictionaries({}, optional={"suffix": st.one_of(TEXT, st.integers())}).map(
        lambda s: {**b, **s}
    )
)
INFILL = body_of({"input_prefix": TEXT, "input_suffix": TEXT})
FUNCTION = st.fixed_dictionaries(
    {"name": st.one_of(st.sampled_from(["get_weather", "rm", "f"]), TEXT)},
    optional={"parameters": st.one_of(st.just({"type": "object"}), st.dictionaries(TEXT, TEXT, max_size=2))},
)
TOOL = st.one_of(
    st.fixed_dictionaries({"type": st.just("function"), "function": FUNCTION}), st.dictionaries(TEXT, TEXT)
)
CALL = st.fixed_dictionaries(
    {
        "id": TEXT,
        "type": st.just("function"),
        "function": st.fixed_dictionaries({"name": TEXT, "arguments": TEXT}),
    }
)
MESSAGES = st.lists(
    st.one_of(
        st.fixed_dictionaries({"role": st.just("user"), "content": TEXT}),
        st.fixed_dictionaries(
            {"role": st.just("assistant"), "content": TEXT, "tool_calls": st.lists(CALL, max_size=2)}
        ),
        st.fixed_dictionaries({"role": st.just("tool"), "content": TEXT, "tool_call_id": TEXT}),
    ),
    min_size=1,
    max_size=4,
).map(lambda m: [*m, {"role": "user", "content": "go"}])
CHAT = body_of(
    {
        "messages": MESSAGES,
        "tools": st.lists(TOOL, max_size=3),
        "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required"]), TEXT, st.none()),
    }
)


def check(served: Served, path: str, body: dict) -> int:
    """Answered or refused with a 4xx; a stream ends with [DONE] or carries its error as an event.
    Returns the status."""
    if body.get("stream") is True:
        with httpx.stream("POST", served.url + path, json=body, timeout=TIMEOUT) as response:
            if response.status_code != 200:
                response.read()
                assert response.status_code < 500, response.text
                return response.status_code
            events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
        assert events and (events[-1] == "[DONE]" or "error" in json.loads(events[-1])), events[-3:]
        for event in events[:-1]:
            assert "error" not in json.loads(event) or json.loads(event)["error"]["type"] != "server_error"
        return 200
    response = httpx.post(served.url + path, json=body, timeout=TIMEOUT)
    assert response.status_code < 500, response.text
    if response.status_code == 200:
        json.dumps(response.json(), ensure_ascii=False).encode()  # valid JSON of valid text
    return response.status_code


def serve(home, model: str, *flags: str) -> Served:
    return Served(["--target", model, "--ctx", "1024", "--threads", "1", "--max-tokens", "8", *flags], home)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pytest.importorskip("llama_cpp")
    home = tmp_path_factory.mktemp("fuzz2")
    model = str(R.write_tiny_gguf(home / "tiny.gguf"))
    served = serve(home, model, "--draft", model, "--strategy", "chain", "--max-tree-nodes", "8")
    yield served
    assert "Traceback" not in served.log_text()
    served.stop()


@pytest.fixture(scope="module")
def any_bytes(tmp_path_factory):
    """A tiny model whose output rows are those of the 256 byte tokens only: it writes any byte
    sequence, valid UTF-8 or not (and never its end-of-turn)."""
    pytest.importorskip("llama_cpp")
    home = tmp_path_factory.mktemp("fuzz2-bytes")
    original = R.printable_ids
    R.printable_ids = lambda tokenizer: np.arange(256)
    try:
        model = str(R.write_tiny_gguf(home / "bytes.gguf", seed=7))
    finally:
        R.printable_ids = original
    served = serve(home, model, "--draft", model, "--strategy", "chain", "--max-tree-nodes", "8")
    yield served
    assert "Traceback" not in served.log_text()
    served.stop()


@FUZZ
@given(body=COMPLETION)
def test_completions_with_any_prompt_and_stops(tiny, body):
    check(tiny, "/v1/completions", body)


@FUZZ
@given(body=INFILL)
def test_infill_with_any_fields(tiny, body):
    check(tiny, "/infill", body)


@FUZZ
@given(body=CHAT)
def test_chat_with_any_tools_and_calls(tiny, body):
    check(tiny, "/v1/chat/completions", body)


@FUZZ
@given(body=ANSWERED, temperature=st.sampled_from([0.0, 1.0, 2.0]))
def test_any_token_sequence_reaches_the_client_intact(any_bytes, body, temperature):
    assert check(any_bytes, "/v1/completions", {**body, "temperature": temperature}) == 200


@FUZZ
@given(body=CHAT, temperature=st.sampled_from([0.0, 1.0, 2.0]))
def test_any_token_sequence_through_the_tool_call_reader(any_bytes, body, temperature):
    check(any_bytes, "/v1/chat/completions", {**body, "temperature": temperature, "max_tokens": 12})
