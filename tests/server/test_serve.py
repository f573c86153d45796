"""`edgespec serve` without models: request validation, SSE framing, auth, errors, the queue, cancelling.

The real Starlette app and uvicorn on a loopback port, with the worker thread driving the chat app's
fake engine (tests/support/tui_fakes.py). The same server on the real bundled pair:
tests/real/test_serve_real.py.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from edgespec.errors import ContextFullError
from edgespec.server.app import create_app
from edgespec.server.protocol import ApiError, Defaults, chat_request, sse
from edgespec.server.worker import Worker
from edgespec.session import ChatSession
from tests.support.tui_fakes import FakeEngine, FakePlanner, canned_answer

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

MODEL = "fake-pair"
KEY = "sekrit"


class ServeFake(FakeEngine):
    """The chat app's fake engine, plus what the server needs: forget(), and a record of each answer's
    end (to see that a disconnect cancelled it)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.forgotten = 0
        self.finishes: list[str] = []

    def forget(self) -> None:
        self.forgotten += 1
        super().forget()

    def stream(self, planner, messages, settings, cancel, stats):
        for event in super().stream(planner, messages, settings, cancel, stats):
            if event.finish_reason:
                self.finishes.append(event.finish_reason)
            yield event


class Running:
    def __init__(self, engine: ServeFake, max_queue: int, api_key: str | None):
        self.engine = engine
        self.worker = Worker(lambda: ChatSession(engine, FakePlanner("chain"), "chain", MODEL), max_queue)
        self.worker.start()
        app = create_app(self.worker, Defaults(model=MODEL), "chain", api_key=api_key)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    def client(self, key: str = KEY):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=20)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.worker.stop()


@pytest.fixture
def serve():
    started: list[Running] = []

    def start(max_queue: int = 8, api_key: str | None = None, **engine) -> Running:
        started.append(Running(ServeFake(**engine), max_queue, api_key))
        return started[-1]

    yield start
    for running in started:
        running.stop()


ASK = [{"role": "user", "content": "add two numbers"}]


def test_non_streaming_answer_has_usage_and_timings(serve):
    run = serve()
    reply = run.client().chat.completions.create(model=MODEL, messages=ASK, max_tokens=200)
    assert reply.choices[0].message.content == canned_answer("add two numbers")
    assert reply.choices[0].finish_reason == "stop"
    extra = reply.model_extra["timings"]
    assert extra["predicted_n"] == reply.usage.completion_tokens > 0
    assert extra["draft_n_accepted"] <= extra["draft_n"]
    assert extra["strategy"] == "chain" and extra["target_calls"] > 0
    assert run.engine.forgotten == 0  # the prompt cache is on: nothing is forgotten between answers


def test_stream_framing_ends_with_usage_then_done(serve):
    run = serve()
    with httpx.stream(
        "POST", run.url + "/v1/chat/completions", json={"messages": ASK, "stream": True, "max_tokens": 5}
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    assert chunks[-1]["timings"]["predicted_n"] == 5
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1])
    assert canned_answer("add two numbers").startswith(text) and text


def test_openai_client_streams_the_same_text(serve):
    run = serve()
    stream = run.client().chat.completions.create(model=MODEL, messages=ASK, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == canned_answer("add two numbers")


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (json.dumps({"messages": "hi"}).encode(), 400, "messages"),
        (json.dumps({"messages": ASK, "max_tokens": -3}).encode(), 400, "max_tokens"),
        (json.dumps({"messages": ASK, "max_tokens": "9"}).encode(), 400, "max_tokens"),
        (json.dumps({"messages": ASK, "max_tokens": True}).encode(), 400, "max_tokens"),
        (json.dumps({"messages": ASK, "temperature": "hot"}).encode(), 400, "temperature"),
        (json.dumps({"messages": ASK, "top_p": 0}).encode(), 400, "top_p"),
        (json.dumps({"messages": ASK, "stop": [1]}).encode(), 400, "stop"),
        (json.dumps({"messages": [{"role": "robot", "content": "x"}]}).encode(), 400, "messages[0].role"),
        (json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(), 400, "messages[0].content"),
        (json.dumps({"messages": ASK, "model": 5}).encode(), 400, "model"),
    ],
)
def test_bad_requests_get_openai_errors(serve, body, status, param):
    run = serve()
    response = httpx.post(run.url + "/v1/chat/completions", content=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["param"] == param and error["message"] and error["type"]
    assert httpx.get(run.url + "/health").json()["status"] == "ok"


def test_validation_reads_fields_and_defaults():
    defaults = Defaults(model=MODEL, max_tokens=7)
    body = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
        ],
        "temperature": 1,
        "seed": 3,
        "stop": "\n",
    }
    request = chat_request(body, defaults)
    assert request.settings.system_prompt == "be brief"
    assert [m.content for m in request.messages] == ["hi there"]
    assert request.settings.max_tokens == 7 and request.settings.stop == ("\n",)
    assert request.settings.sampling.temperature == 1.0 and request.settings.sampling.seed == 3
    with pytest.raises(ApiError, match="last non-system message"):
        chat_request({"messages": [{"role": "assistant", "content": "x"}]}, defaults)
    assert sse("[DONE]") == b"data: [DONE]\n\n"


def test_context_full_is_a_400_and_unknown_routes_404(serve):
    run = serve()
    run.engine.fail = ContextFullError("the message needs more than 10 tokens")
    with pytest.raises(openai.BadRequestError) as caught:
        run.client().chat.completions.create(model=MODEL, messages=ASK)
    assert caught.value.code == "context_length_exceeded"
    assert httpx.get(run.url + "/v2/nothing").status_code == 404
    assert httpx.get(run.url + "/v1/chat/completions").status_code == 405
    run.engine.fail = None
    assert run.client().chat.completions.create(model=MODEL, messages=ASK).choices[0].message.content


def test_api_key_is_required(serve):
    run = serve(api_key=KEY)
    with pytest.raises(openai.AuthenticationError):
        run.client(key="wrong").models.list()
    assert [m.id for m in run.client().models.list()] == [MODEL]
    assert httpx.get(run.url + "/health").status_code == 200  # health checks need no key


def test_full_queue_answers_503_with_retry_after(serve):
    run = serve(max_queue=1, delay=0.05, repeat=20)
    client = run.client()
    results: list = []

    def ask() -> None:
        results.append(client.chat.completions.create(model=MODEL, messages=ASK))

    background = [threading.Thread(target=ask) for _ in range(2)]
    for thread in background:  # one answering, one waiting
        thread.start()
        time.sleep(0.2)
    response = httpx.post(run.url + "/v1/chat/completions", json={"messages": ASK})
    assert response.status_code == 503 and response.headers["retry-after"].isdigit()
    assert response.json()["error"]["code"] == "queue_full"
    for thread in background:
        thread.join(30)
    assert len(results) == 2  # both queued requests were answered, in turn


def test_disconnect_cancels_the_answer_and_frees_the_server(serve):
    run = serve(delay=0.05, repeat=50)  # a long answer: ~0.05 s per step
    with httpx.stream("POST", run.url + "/v1/chat/completions", json={"messages": ASK, "stream": True}) as r:
        next(r.iter_lines())  # the first event, then hang up
    start = time.monotonic()
    reply = run.client().chat.completions.create(model=MODEL, messages=ASK, max_tokens=3)
    assert reply.usage.completion_tokens == 3
    assert time.monotonic() - start < 2.0  # not the ~10 s the abandoned answer would take
    assert run.engine.finishes[0] == "cancelled"


def test_bench_server_measures_any_server(serve, tmp_path, capsys):
    from edgespec.cli import main

    run = serve()
    out = tmp_path / "b.json"
    argv = [
        "bench",
        "--server",
        run.url + "/v1",
        "--prompts",
        "quick",
        "--max-tokens",
        "4",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    results = json.loads(out.read_text())
    rows = results["prompts"]
    assert rows and all(r["tokens"] == 4 and r["draft_n"] is not None for r in rows)
    turns = results["conversation"]
    assert [t["turn"] for t in turns] == [1, 2, 3, 4, 5, 6]
    assert all(t["ttft"] is not None and t["tokens"] == 4 and t["prompt_n"] is not None for t in turns)
    assert results["tools"][0]["step"] == "call"  # the fake answers in text: no call, no second step
    printed = capsys.readouterr().out
    assert rows[0]["prompt"] in printed and "whole conversation" in printed


def test_work_ahead_waits_for_a_quiet_moment_and_yields_to_a_new_job():
    """Between answers the worker reads ahead (``ChatSession.idle``) only after ``IDLE_GRACE`` seconds
    without a job (a client's next request, sent at once, never waits for a chunk), a chunk at a time,
    and stops when a job arrives."""
    from types import SimpleNamespace

    from edgespec.server import worker as worker_module
    from edgespec.server.worker import DONE, Job

    chunks: list[float] = []
    answered: list[float] = []

    class Session:
        def measure(self, stop) -> bool:
            return True  # nothing to measure: straight to reading ahead

        def idle(self) -> bool:
            chunks.append(time.monotonic())
            time.sleep(0.02)
            return len(chunks) < 1000  # more work than the test waits for

        def close(self):
            pass

    ask = SimpleNamespace(run=lambda session, cancel, stats: answered.append(time.monotonic()) or iter(()))
    worker = Worker(lambda: Session())
    worker.start()
    try:
        done = threading.Event()
        worker.submit(Job(ask, lambda item: item is DONE and done.set()))
        assert done.wait(5)
        time.sleep(worker_module.IDLE_GRACE / 5)
        assert chunks == []  # a request sent at once finds the worker free
        done.clear()
        worker.submit(Job(ask, lambda item: item is DONE and done.set()))
        assert done.wait(5)
        time.sleep(worker_module.IDLE_GRACE + 0.3)
        assert chunks and chunks[0] - answered[-1] >= worker_module.IDLE_GRACE * 0.9
        done.clear()
        worker.submit(Job(ask, lambda item: item is DONE and done.set()))
        assert done.wait(5)
        assert answered[-1] - chunks[-1] < 0.2  # the job waited for one chunk at most
    finally:
        worker.stop()
