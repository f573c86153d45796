"""`edgespec serve` for the clients that use it, on the real bundled pair through the official `openai`
client: a 6-turn coding conversation sent whole every turn (the prompt cache decodes only its new part),
two conversations taking turns (both stay cached), tools (two functions, streamed and not, the result
sent back, a cut call returned as text) and fill in the middle on a function whose body is missing.

One server for the module (prompt cache on, as by default), on loopback with a free port; answers are
short and every request has a timeout. Cached answers against fresh-start ones:
tests/test_prompt_cache_real.py.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from edgespec.measure.bench_client import CONVERSATION as TURNS
from edgespec.measure.bench_client import TOOLS
from tests.support.hostile import Served
from tests.support.realmodels import bundled_paths

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.model

FLAGS = [
    "--ctx",
    "4096",
    "--threads",
    "2",
    "--strategy",
    "chain",
    "--max-tree-nodes",
    "8",
    "--cache-ram",
    "256",
]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    bundled_paths()  # skips when the bundled pair is not installed
    server = Served(FLAGS, tmp_path_factory.mktemp("serve-clients"), own_home=False)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0, timeout=300)


def ask_streamed(client, messages: list[dict]) -> dict:
    """One streamed turn: the text, time to the first text, usage and timings."""
    start = time.monotonic()
    first, text, last = None, [], None
    for chunk in client.chat.completions.create(
        model="whatever-the-client-says", messages=messages, max_tokens=MAX_TOKENS, temperature=0, stream=True
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.monotonic() - start
            text.append(chunk.choices[0].delta.content)
        last = chunk
    timings = last.model_extra["timings"]
    return {
        "text": "".join(text),
        "ttft": first,
        "wall": time.monotonic() - start,
        "prompt": last.usage.prompt_tokens,
        "completion": last.usage.completion_tokens,
        "cache_n": timings["cache_n"],
        "prompt_n": timings["prompt_n"],
    }


def converse(client, turns: list[str], history: list[dict] | None = None) -> tuple[list[dict], list[dict]]:
    history = [] if history is None else history
    replies = []
    for text in turns:
        history.append({"role": "user", "content": text})
        reply = ask_streamed(client, history)
        history.append({"role": "assistant", "content": reply["text"]})
        replies.append(reply)
    return replies, history


def assert_only_the_new_part(replies: list[dict], label: str) -> None:
    """From the second turn on, the prompt tokens decoded are at most the prompt less the last prompt
    and answer (the cache held them), and a token where the answer's end and the template's meet.
    Fewer when the answer's last step committed the end of turn (and what follows it in the template)
    besides the tokens shown: the cache holds those too."""
    for before, now in zip(replies, replies[1:]):
        new_part = now["prompt"] - before["prompt"] - before["completion"]
        assert now["prompt_n"] + now["cache_n"] == now["prompt"]
        assert new_part - 4 <= now["prompt_n"] <= new_part + 1, (label, before, now)


def test_a_six_turn_conversation_decodes_only_its_new_part(client):
    start = time.monotonic()
    replies, _ = converse(client, TURNS)
    whole = time.monotonic() - start
    print(f"\n6-turn conversation, cached: {whole:.1f} s")
    for i, r in enumerate(replies, 1):
        print(
            f"turn {i}: prompt {r['prompt']} tokens, decoded {r['prompt_n']} (cached {r['cache_n']}), "
            f"TTFT {r['ttft']:.2f} s, {r['completion']} tokens in {r['wall']:.1f} s"
        )
    assert all(r["text"] for r in replies)
    assert replies[0]["prompt_n"] >= replies[0]["prompt"] - 4  # at most the chat markup's first tokens
    assert_only_the_new_part(replies, "one conversation")
    assert replies[-1]["prompt_n"] < replies[-1]["prompt"] / 4


def test_two_conversations_taking_turns_both_stay_cached(served, client):
    a_turns = ["Write a Python function that reverses a string.", "Add a docstring.", "Add type hints."]
    b_turns = ["What does HTTP status 418 mean? One sentence.", "And 451?", "And 503?"]
    a_history: list[dict] = []
    b_history: list[dict] = []
    a_replies, b_replies = [], []
    for a_text, b_text in zip(a_turns, b_turns):
        a_replies += converse(client, [a_text], a_history)[0]
        b_replies += converse(client, [b_text], b_history)[0]
    assert_only_the_new_part(a_replies, "conversation A")
    assert_only_the_new_part(b_replies, "conversation B")
    cache = httpx.get(served.url + "/health", timeout=10).json()["prompt_cache"]
    assert cache["restores"] >= 4 and cache["bytes"] <= cache["budget_bytes"]
    print(f"\nprompt cache after two alternating conversations: {cache}")


def test_tools_called_answered_and_cut(client):
    ask = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    reply = client.chat.completions.create(
        model="gpt-4o", messages=ask, tools=TOOLS, max_tokens=48, temperature=0
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] == "Paris"
    stream = client.chat.completions.create(
        model="gpt-4o", messages=ask, tools=TOOLS, max_tokens=48, temperature=0, stream=True
    )
    chunks = list(stream)
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert [tc.function.name for tc in calls] == ["get_weather"]
    assert json.loads(calls[0].function.arguments) == json.loads(call.function.arguments)
    history = [
        *ask,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 18, "sky": "sunny"}'},
    ]
    # tool_choice "none" for the answer: under "auto" this 1.5B model calls the same tool again
    final = client.chat.completions.create(
        model="gpt-4o", messages=history, tools=TOOLS, tool_choice="none", max_tokens=48, temperature=0
    )
    print(f"\nfinal answer after the tool's result: {final.choices[0].message.content!r}")
    assert final.choices[0].message.content and "18" in final.choices[0].message.content
    assert not final.choices[0].message.tool_calls
    # a call cut short (max_tokens) is not valid JSON: it comes back as the model's text, not an error
    named = {"type": "function", "function": {"name": "get_time"}}
    cut = client.chat.completions.create(
        model="gpt-4o", messages=ask, tools=TOOLS, tool_choice=named, max_tokens=2, temperature=0
    )
    assert cut.choices[0].finish_reason == "length" and not cut.choices[0].message.tool_calls
    assert cut.choices[0].message.content.startswith('<tool_call>\n{"name": "get_time", "arguments": ')


def test_fill_in_the_middle_writes_the_missing_body(client):
    prefix = 'def fibonacci(n):\n    """Return the n-th Fibonacci number (fibonacci(0) == 0)."""\n'
    suffix = "\n\n\nassert fibonacci(10) == 55\n"
    reply = client.completions.create(
        model="code", prompt=prefix, suffix=suffix, max_tokens=64, temperature=0
    )
    middle = reply.choices[0].text
    print(f"\nthe middle: {middle!r} ({reply.choices[0].finish_reason})")
    assert reply.choices[0].finish_reason == "stop"
    scope: dict = {}
    exec(prefix + middle + suffix, scope)  # noqa: S102 - the model's code, checked by its own assert
    assert scope["fibonacci"](12) == 144
