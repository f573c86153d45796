"""`edgespec serve` on the real bundled pair, driven by the official `openai` client.

One server process for the module (the pair loads once), started like a user would: `python -m
edgespec serve --port 0` on loopback, with a small context and few tokens per answer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.support.realmodels import BUNDLED_PAIR, bundled_paths

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.model

KEY = "test-key"
FLAGS = ["--ctx", "1024", "--threads", "1", "--strategy", "chain", "--max-tree-nodes", "16"]
PROMPT = "Write a Python function that adds two numbers."
MAX_TOKENS = 12
STARTUP_LOG: list[str] = []  # what the server wrote to stderr until it listened


def _edgespec(*argv: str, **kwargs):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen([sys.executable, "-m", "edgespec", *argv], env=env, text=True, **kwargs)


@pytest.fixture(scope="module")
def server():
    bundled_paths()  # skips when the bundled pair is not installed
    # fresh caches per answer (answers equal `generate`'s bit for bit) and model names checked; the
    # prompt cache and any-model-name serving: tests/test_serve_cache.py
    serve = ["serve", "--port", "0", "--api-key", KEY, "--no-prompt-cache", "--strict-model"]
    proc = _edgespec(*serve, *FLAGS, stderr=subprocess.PIPE)
    try:
        for line in proc.stderr:  # "edgespec: serving <pair> (chain) on http://127.0.0.1:PORT/v1"
            STARTUP_LOG.append(line)
            if "serving" in line:
                url = line.split(" on ")[-1].strip()
                break
        else:
            pytest.fail("edgespec serve exited before listening")
        threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep its log pipe from filling
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server, api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def generated() -> dict:
    """`edgespec generate --json` on the same prompt, flags and seed (greedy)."""
    bundled_paths()
    argv = ["generate", PROMPT, "--json", "--max-tokens", str(MAX_TOKENS), "--seed", "1", *FLAGS]
    out, _ = _edgespec(*argv, stdout=subprocess.PIPE).communicate(timeout=300)
    return json.loads(out)


def test_a_server_started_with_its_log_in_a_file_says_it_is_starting(server):
    """Loading (and the first time, measuring the pair) takes a while: a log shows it began and ended."""
    lines = [line for line in STARTUP_LOG if line.startswith("starting the server")]
    assert lines[0] == "starting the server: started\n"
    assert lines[-1].startswith("starting the server: done in ")
    assert STARTUP_LOG.index(lines[-1]) == len(STARTUP_LOG) - 2  # then "serving …"


def test_answers_equal_generate(client, generated):
    ask = {"model": BUNDLED_PAIR, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": MAX_TOKENS}
    reply = client.chat.completions.create(**ask, seed=1)
    assert reply.choices[0].message.content == generated["text"]
    assert reply.usage.completion_tokens == len(generated["tokens"])
    timings = reply.model_extra["timings"]
    assert timings["predicted_n"] == len(generated["tokens"])
    assert timings["prompt_n"] == reply.usage.prompt_tokens == generated["stats"]["prompt_tokens"]
    assert timings["strategy"] == "chain"
    assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
    # MAL × target calls = tokens committed ≥ tokens shown (end-of-turn and cut tokens count too)
    assert timings["mean_accepted_length"] * timings["target_calls"] >= timings["predicted_n"] - 1e-9
    assert timings["predicted_per_second"] == pytest.approx(
        timings["predicted_n"] * 1000 / timings["predicted_ms"]
    )
    stream = client.chat.completions.create(**ask, seed=1, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == generated["text"]
    assert chunks[-1].usage.completion_tokens == len(generated["tokens"])
    assert chunks[-1].model_extra["timings"]["predicted_n"] == len(generated["tokens"])


def test_disconnect_frees_the_server_and_leaves_no_trace(server, client, generated):
    count = [{"role": "user", "content": "Count from 1 to 200."}]
    body = {"messages": count, "stream": True, "max_tokens": 400}
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", server + "/chat/completions", json=body, headers=headers, timeout=60) as r:
        lines = r.iter_lines()
        while "content" not in next(lines):  # hang up after the first answer text
            pass
    start = time.monotonic()
    reply = client.chat.completions.create(
        model=BUNDLED_PAIR, messages=[{"role": "user", "content": PROMPT}], max_tokens=MAX_TOKENS, seed=1
    )
    took = time.monotonic() - start
    assert reply.choices[0].message.content == generated["text"]  # the cancelled answer changed nothing
    # the abandoned answer (400 tokens) would take far longer: it stopped within a step
    assert took < 3 * reply.model_extra["timings"]["predicted_ms"] / 1000 + 10


def test_mixed_good_and_bad_requests(server, client):
    auth = {"Authorization": f"Bearer {KEY}"}
    url = server + "/chat/completions"
    good = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    cases = [
        (b"{oops", auth, 400),
        (json.dumps({**good, "max_tokens": -1}), auth, 400),
        (json.dumps({**good, "max_tokens": "two"}), auth, 400),
        (json.dumps({**good, "temperature": [1]}), auth, 400),
        (json.dumps({**good, "messages": [{"role": "user", "content": "word " * 3000}]}), auth, 400),
        (json.dumps({**good, "model": "llama-70b"}), auth, 404),
        (json.dumps(good), {"Authorization": "Bearer nope"}, 401),
        (json.dumps(good), {}, 401),
        (json.dumps({**good, "messages": []}), auth, 400),
        (json.dumps(good), auth, 200),
    ] * 2
    for body, headers, status in cases:
        response = httpx.post(url, content=body, headers=headers, timeout=120)
        assert response.status_code == status, response.text
        if status != 200:
            assert response.json()["error"]["message"]
    oversized = httpx.post(url, content=cases[4][0], headers=auth).json()["error"]
    assert oversized["code"] == "context_length_exceeded" and "--ctx" in oversized["message"]
    assert client.chat.completions.create(**good, model=BUNDLED_PAIR).choices[0].message.content
