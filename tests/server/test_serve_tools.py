"""Tools, text completions, model names and the queue's order without a model: the real app on a
loopback port with a scripted engine, driven by the official `openai` client (the pure parts:
tests/test_tools.py; on the real bundled pair: tests/test_serve_clients.py)."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from edgespec.decoding.completion import CompletionPrompt
from edgespec.decoding.events import EmittedToken, Provenance, StepEvent, StepTimings
from edgespec.errors import PromptError
from edgespec.server.protocol import ApiError, Defaults, chat_request
from tests.server.test_serve import MODEL, Running
from tests.unit.test_tools import CALL, TOOLS

openai = pytest.importorskip("openai")


# -- the server, with a scripted engine --------------------------------------------------------------------
class Scripted:
    """A ChatEngine that answers with the next scripted text, in pieces of a few characters."""

    n_ctx, has_draft = 4096, True

    def __init__(self):
        self.script: list[str] = []
        self.seen: list = []  # (what, messages or prompt, settings) per request

    def piece(self, token):
        return ""

    def context_used(self):
        return 0

    def cache_info(self) -> dict:
        return {}

    def prepare(self, planner, on_progress):
        pass

    def idle(self) -> bool:
        return False

    def measure(self, stop, on_progress) -> bool:
        return True

    def forget(self):
        pass

    def close(self):
        pass

    def stream(self, planner, messages, settings, cancel, stats):
        self.seen.append(("chat", messages, settings))
        return self._steps(settings, stats)

    def complete(self, planner, prompt, settings, cancel, stats):
        self.seen.append(("complete", prompt, settings))
        if prompt.suffix is not None and prompt.text == "no fim":
            raise PromptError("this model has no fill-in-the-middle tokens")
        return self._steps(settings, stats)

    def _steps(self, settings, stats):
        text = self.script.pop(0) if self.script else "Hello there."
        stats.prompt_tokens = 10
        pieces = [text[i : i + 4] for i in range(0, len(text), 4)]
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            token = (EmittedToken(i, Provenance.TARGET, 1.0),)
            event = StepEvent(
                token, piece, 0, 0, StepTimings(verify=0.001), finish_reason="stop" if last else None
            )
            stats.add(event)
            yield event


@pytest.fixture
def scripted():
    engine = Scripted()
    running = Running(engine, 8, None)
    yield engine, running
    running.stop()


def test_tool_calls_through_the_openai_client(scripted):
    engine, running = scripted
    client = running.client()
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    engine.script = ["Checking.\n" + CALL]
    reply = client.chat.completions.create(model="any-name", messages=ask, tools=TOOLS)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert reply.model == MODEL  # any name: this pair, and the answer says which
    assert engine.seen[-1][2].tools == tuple(TOOLS)
    engine.script = [CALL]
    chunks = list(client.chat.completions.create(model=MODEL, messages=ask, tools=TOOLS, stream=True))
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert [tc.function.name for tc in calls] == ["get_weather"] and calls[0].index == 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    # the result goes back; the final answer is text
    history = [
        *ask,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18 C"},
    ]
    engine.script = ["It is 18 C in Paris."]
    final = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS)
    assert (
        final.choices[0].message.content == "It is 18 C in Paris."
        and final.choices[0].finish_reason == "stop"
    )
    assert engine.seen[-1][1][-1].role == "tool" and engine.seen[-1][1][1].tool_calls[0].name == "get_weather"
    # malformed JSON from the model: its text, not an error
    broken = CALL.replace("Paris", 'Par"is')
    engine.script = [broken, broken]
    reply = client.chat.completions.create(model=MODEL, messages=ask, tools=TOOLS)
    assert reply.choices[0].message.content == broken and not reply.choices[0].message.tool_calls
    chunks = list(client.chat.completions.create(model=MODEL, messages=ask, tools=TOOLS, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == broken
    # tool_choice "required" starts the call for the model
    engine.script = ['get_time", "arguments": {}}\n</tool_call>']
    reply = client.chat.completions.create(model=MODEL, messages=ask, tools=TOOLS, tool_choice="required")
    assert reply.choices[0].message.tool_calls[0].function.name == "get_time"
    assert engine.seen[-1][2].prefill == '<tool_call>\n{"name": "'


def test_completions_and_infill(scripted):
    engine, running = scripted
    client = running.client()
    engine.script = ["a + b", "a + b"]
    reply = client.completions.create(
        model="code", prompt="def add(a, b):\n    return ", suffix="\n", max_tokens=8
    )
    assert reply.choices[0].text == "a + b" and reply.object == "text_completion" and reply.model == MODEL
    assert reply.usage.prompt_tokens == 10 and reply.model_extra["timings"]["predicted_n"] == 2
    assert engine.seen[-1][1] == CompletionPrompt("def add(a, b):\n    return ", None, "\n")
    stream = client.completions.create(model="code", prompt="x", max_tokens=8, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == "a + b"
    engine.script = ["42"]
    response = httpx.post(running.url + "/infill", json={"input_prefix": "x = ", "input_suffix": "\n"})
    assert response.status_code == 200 and response.json()["choices"][0]["text"] == "42"
    with pytest.raises(openai.BadRequestError, match="fill-in-the-middle"):
        client.completions.create(model="code", prompt="no fim", suffix="\n")
    response = httpx.post(running.url + "/v1/completions", json={"prompt": ["a", "b"]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"


def test_any_model_name_gets_the_pair_unless_strict(scripted):
    engine, running = scripted
    ask = {"messages": [{"role": "user", "content": "hi"}], "model": "gpt-4o"}
    assert httpx.post(running.url + "/v1/chat/completions", json=ask).json()["model"] == MODEL
    with pytest.raises(ApiError) as caught:
        chat_request(ask, Defaults(model=MODEL, strict_model=True))
    assert caught.value.status == 404 and caught.value.code == "model_not_found"
    assert chat_request({**ask, "model": MODEL}, Defaults(model=MODEL, strict_model=True))


def test_waiting_requests_keep_each_clients_order(scripted):
    engine, running = scripted
    client = running.client()
    engine.script = [f"answer {i}" for i in range(12)]
    got: dict[int, list[str]] = {0: [], 1: [], 2: []}

    def ask(who: int) -> None:
        for _ in range(4):
            text = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": str(who)}]
            )
            got[who].append(text.choices[0].message.content)

    threads = [threading.Thread(target=ask, args=(who,)) for who in got]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    answers = [a for texts in got.values() for a in texts]
    assert sorted(answers, key=lambda a: int(a.split()[1])) == [f"answer {i}" for i in range(12)]
    for texts in got.values():  # each client's answers in the order it asked
        assert [int(t.split()[1]) for t in texts] == sorted(int(t.split()[1]) for t in texts)
