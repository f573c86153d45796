"""A load run against a real `edgespec serve` on 127.0.0.1: 4 concurrent clients × 10 mixed requests
(chat, streamed chat, tools, completions, fill in the middle, a few hung up mid-answer, a few malformed),
each in a conversation of its own. Every valid request is answered, every malformed one gets a 4xx, none
is lost, the queue empties, and the server's memory stays bounded (its prompt cache within --cache-ram,
its resident memory within a margin of where it started). p50/p95 latencies are printed.

The quick tier serves the tiny random GGUF (the real llama.cpp; no FIM tokens, so fill in the middle is
a clear 400 there); ``EDGESPEC_LOAD_BUNDLED=1`` runs the same load on the bundled pair (model tier).
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time

import httpx
import pytest

from tests.support.hostile import Served
from tests.support.scripts import load

R = load("randomgguf")

CLIENTS, REQUESTS = 4, 10
BUNDLED = bool(os.environ.get("EDGESPEC_LOAD_BUNDLED"))
TIMEOUT = 900.0 if BUNDLED else 120.0  # a request waits behind the other clients' (bundled: ~30 s each here)
CACHE_RAM_MIB = 64 if BUNDLED else 1
# bytes the server may grow by over a run: its prompt cache's budget and allocator noise
RSS_MARGIN = (CACHE_RAM_MIB + 64) * 1024 * 1024


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    pytest.importorskip("llama_cpp")
    home = tmp_path_factory.mktemp("serve-load")
    if BUNDLED:
        from tests.support.realmodels import bundled_paths

        bundled_paths()
        flags, fim = ["--threads", "2", "--ctx", "2048", "--max-tokens", "8"], True
        flags += [
            "--strategy",
            "chain",
            "--max-tree-nodes",
            "8",
            "--queue",
            "16",
            "--cache-ram",
            str(CACHE_RAM_MIB),
        ]
        server = Served(flags, home, own_home=False)
    else:
        model = str(R.write_tiny_gguf(home / "tiny.gguf"))
        flags = [
            "--target",
            model,
            "--draft",
            model,
            "--strategy",
            "chain",
            "--ctx",
            "1024",
            "--threads",
            "1",
        ]
        flags += [
            "--max-tree-nodes",
            "8",
            "--max-tokens",
            "8",
            "--queue",
            "16",
            "--cache-ram",
            str(CACHE_RAM_MIB),
        ]
        server, fim = Served(flags, home), False
    server.fim = fim
    yield server
    server.stop()


def requests_of(client: int, fim: bool) -> list[tuple[str, str, object, int | None]]:
    """(kind, route, body, expected status) — None: hung up mid-answer."""
    history = [{"role": "user", "content": f"client {client}: tell me about number {client * 7}"}]
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    chat = "/v1/chat/completions"
    out = []
    for i in range(REQUESTS):
        ask = [
            *history,
            {"role": "assistant", "content": f"answer {i}"},
            {"role": "user", "content": f"more {i}"},
        ]
        kind = (client + i) % 7
        if kind == 0:
            out.append(("chat", chat, {"messages": ask, "max_tokens": 6}, 200))
        elif kind == 1:
            out.append(("stream", chat, {"messages": ask, "max_tokens": 6, "stream": True}, 200))
        elif kind == 2:
            out.append(("tools", chat, {"messages": ask, "tools": tools, "max_tokens": 6}, 200))
        elif kind == 3:
            out.append(
                ("completion", "/v1/completions", {"prompt": f"def f{client}_{i}(x):", "max_tokens": 6}, 200)
            )
        elif kind == 4:
            body = {"prompt": "def add(a, b):\n    return ", "suffix": "\n", "max_tokens": 6}
            out.append(("fim", "/v1/completions", body, 200 if fim else 400))
        elif kind == 5:
            out.append(("cancel", chat, {"messages": ask, "max_tokens": 200, "stream": True}, None))
        else:
            bad = [b'{"messages": [', {"messages": ask, "max_tokens": -1}, {"messages": ask, "tools": "x"}]
            out.append(("malformed", chat, bad[(client + i) % 3], 400))
    return out


def run_client(url: str, client: int, fim: bool, results: list) -> None:
    with httpx.Client(base_url=url, timeout=TIMEOUT) as http:
        for kind, route, body, expected in requests_of(client, fim):
            start = time.monotonic()
            try:
                one_request(http, client, kind, route, body, expected, results)
            except httpx.HTTPError as exc:  # a failure of this request, recorded: the others still run
                results.append((client, kind, expected, repr(exc), time.monotonic() - start, False))


def one_request(
    http: httpx.Client, client: int, kind: str, route: str, body, expected, results: list
) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    start = time.monotonic()
    if expected is None:  # hang up after the first piece of the answer
        with http.stream("POST", route, content=content, headers=headers) as response:
            status = response.status_code
            for line in response.iter_lines():
                if '"content"' in line:
                    break
        results.append((client, kind, expected, status, time.monotonic() - start, True))
        return
    response = http.post(route, content=content, headers=headers)
    ok = response.status_code == expected
    if ok and expected == 200:
        ok = "[DONE]" in response.text if body.get("stream") else bool(response.json()["choices"])
    elif ok:
        ok = bool(response.json()["error"]["message"])
    results.append((client, kind, expected, response.status_code, time.monotonic() - start, ok))


def test_four_clients_ten_mixed_requests_each(served):
    start_rss = rss(served.proc.pid)
    results: list = []
    threads = [
        threading.Thread(target=run_client, args=(served.url, c, served.fim, results)) for c in range(CLIENTS)
    ]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT * REQUESTS)
    took = time.monotonic() - start
    assert not any(thread.is_alive() for thread in threads)
    assert len(results) == CLIENTS * REQUESTS  # none lost
    failed = [r for r in results if not r[5]]
    assert not failed, failed
    answered = [r for r in results if r[2] == 200]
    latencies = sorted(r[4] for r in answered)
    p50, p95 = statistics.median(latencies), latencies[max(0, round(0.95 * len(latencies)) - 1)]
    health = httpx.get(served.url + "/health", timeout=10).json()
    cache = health["prompt_cache"]
    grown = rss(served.proc.pid) - start_rss
    kinds = {k: sum(1 for r in results if r[1] == k) for k in sorted({r[1] for r in results})}
    print(
        f"\n{len(results)} requests in {took:.1f} s ({kinds}); answered: p50 {p50:.2f} s, p95 {p95:.2f} s; "
        f"prompt cache {cache}; resident memory grew {grown / 2**20:.1f} MiB"
    )
    assert health["status"] == "ok" and health["waiting"] == 0
    assert cache["bytes"] <= cache["budget_bytes"] and cache["saves"] > 0
    assert grown < RSS_MARGIN
    # the server still answers, promptly, after the load (cancelled answers did not keep it busy)
    start = time.monotonic()
    ask = {"messages": [{"role": "user", "content": "after"}], "max_tokens": 2}
    assert httpx.post(served.url + "/v1/chat/completions", json=ask, timeout=TIMEOUT).status_code == 200
    assert time.monotonic() - start < max(10.0, 3 * p95)


def test_many_distinct_conversations_stay_within_the_cache_budget(served):
    start_rss = rss(served.proc.pid)
    with httpx.Client(base_url=served.url, timeout=TIMEOUT) as http:
        for i in range(16):
            text = f"conversation {i}: " + " ".join(f"word{i}x{j}" for j in range(60))
            ask = {"messages": [{"role": "user", "content": text}], "max_tokens": 2}
            assert http.post("/v1/chat/completions", json=ask).status_code == 200
        cache = http.get("/health").json()["prompt_cache"]
    print(f"\nafter 16 distinct conversations: {cache}")
    assert cache["saves"] >= 15 and cache["bytes"] <= cache["budget_bytes"]
    if not served.fim:  # the tiny model: 16 conversations are more than 1 MiB of KV, so some were dropped
        assert cache["conversations"] < 15
    assert rss(served.proc.pid) - start_rss < RSS_MARGIN
