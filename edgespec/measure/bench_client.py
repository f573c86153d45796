"""`edgespec bench --server URL`: what clients see from any OpenAI-compatible server (edgespec serve,
llama-server with `-md` and `--spec-type`, …), measured by one client on the same requests.

Three sets, greedy, every request timed from the client's side:

- ``prompts``: the bench prompts (``--prompts``), one request each: tokens/s on the wall clock and, where
  the server sends llama-server-style ``timings``, its decode speed and draft acceptance;
- ``conversation``: a 6-turn coding conversation sent whole every turn, streamed, as editors and agents
  do: time to the first token each turn, the prompt tokens the server decoded (``timings.prompt_n``;
  ``cache_n`` the ones it had cached) and the whole conversation's time;
- ``tools``: an agent's exchange with two tools: the call, the tool's result sent back, the answer.
"""

from __future__ import annotations

import argparse
import json
import sys
from time import perf_counter

import httpx

from ..errors import EdgespecError
from .prompts import load_prompts

SETS = ("prompts", "conversation", "tools")
TIMEOUT = 600.0
# The model's own default system prompt (Qwen2.5's template adds it when a chat has none), sent
# explicitly: every server renders the same prompt, whether it runs the Jinja template or not.
SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
CONVERSATION = (
    "Write a Python class Inventory that stores items with a name, a quantity and a unit price, with "
    "methods to add an item, remove an item and compute the total value.",
    "Add type hints to the whole class and show it again.",
    "Add a method low_stock(threshold) that returns the items whose quantity is below the threshold.",
    "Write pytest tests for the class.",
    "Rename the class to Stock everywhere and show the whole class again.",
    "Add a docstring to every method and show the whole class.",
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Get the current local time in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
]
TOOL_QUESTION = "What is the weather in Paris right now?"
TOOL_RESULT = '{"temperature_c": 18, "sky": "sunny"}'


REPLY_MAX_BYTES = 64 * 2**20  # one answer (or one whole stream) of --max-tokens tokens: far less


class BadReply(EdgespecError):
    """The server answered, but not the way an OpenAI-compatible server does."""


class Client:
    def __init__(self, url: str, api_key: str | None, model: str | None, max_tokens: int):
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.extra = {"model": model} if model else {}
        self.max_tokens = max_tokens

    def body(self, messages: list[dict], **fields) -> dict:
        return {"messages": messages, "max_tokens": self.max_tokens, "temperature": 0, **self.extra, **fields}

    def ask(self, messages: list[dict], **fields) -> tuple[dict, float]:
        """One answer: the reply (a JSON object with ``choices[0].message``, checked) and its wall time."""
        start = perf_counter()
        with httpx.stream(
            "POST",
            self.url + "/chat/completions",
            json=self.body(messages, **fields),
            headers=self.headers,
            timeout=TIMEOUT,
        ) as response:
            _check_status(response)
            data = b"".join(_chunks(response))
        wall = perf_counter() - start
        try:
            reply = json.loads(data)
        except (ValueError, RecursionError):
            raise BadReply(f"answered with something that is not JSON: {_preview(data)}") from None
        message(reply)
        return reply, wall

    def stream(self, messages: list[dict]) -> dict:
        """One streamed answer: its text, time to the first text, wall time, usage and timings."""
        body = self.body(messages, stream=True, stream_options={"include_usage": True})
        start, first, text, usage, timings, events = perf_counter(), None, [], {}, {}, 0
        with httpx.stream(
            "POST", self.url + "/chat/completions", json=body, headers=self.headers, timeout=TIMEOUT
        ) as response:
            _check_status(response)
            for line in _lines(response):
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                events += 1
                chunk = _event(line[5:])
                for choice in _dicts(chunk.get("choices")):
                    piece = _mapping(choice.get("delta")).get("content")
                    if isinstance(piece, str) and piece:
                        first = first if first is not None else perf_counter() - start
                        text.append(piece)
                usage = _mapping(chunk.get("usage")) or usage
                timings = _mapping(chunk.get("timings")) or timings
        if not events:
            raise BadReply("answered a streamed request without any server-sent event (`data: {…}` lines)")
        return {
            "text": "".join(text),
            "ttft": first,
            "wall": perf_counter() - start,
            "usage": usage,
            "timings": timings,
        }


def _check_status(response: httpx.Response) -> None:
    if response.is_success:
        return
    detail = b"".join(_chunks(response))
    raise BadReply(f"answered {response.status_code} {response.reason_phrase}: {_preview(detail)}")


def _chunks(response: httpx.Response):
    """The body's bytes, refused past ``REPLY_MAX_BYTES``."""
    total = 0
    for chunk in response.iter_bytes():
        total += len(chunk)
        if total > REPLY_MAX_BYTES:
            raise BadReply(f"sent an answer larger than {REPLY_MAX_BYTES // 2**20} MiB; stopped reading")
        yield chunk


def _lines(response: httpx.Response):
    """The body's lines (UTF-8, undecodable bytes replaced), within ``REPLY_MAX_BYTES`` in all."""
    pending = b""
    for chunk in _chunks(response):
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode("utf-8", "replace")
    if pending:
        yield pending.decode("utf-8", "replace")


def _event(data: str) -> dict:
    try:
        chunk = json.loads(data)
    except (ValueError, RecursionError):
        raise BadReply(f"streamed an event that is not JSON: {_preview(data)}") from None
    if not isinstance(chunk, dict):
        raise BadReply(f"streamed an event that is not a JSON object: {_preview(data)}")
    return chunk


def message(reply) -> dict:
    """``choices[0].message`` of a chat completion, or ``BadReply`` saying what the reply is instead."""
    choices = reply.get("choices") if isinstance(reply, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(first, dict) or not isinstance(first.get("message"), dict):
        raise BadReply(
            f"answered JSON that is not a chat completion (no choices[0].message): {_preview(reply)}"
        )
    return first["message"]


def _mapping(value) -> dict:
    return value if isinstance(value, dict) else {}


def _dicts(value) -> list[dict]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _count(value) -> int | float | None:
    """A count or rate the server reported, when it is a plain non-negative number (else: not reported)."""
    plain = isinstance(value, (int, float)) and not isinstance(value, bool)
    return value if plain and 0 <= value < 2**53 else None


def _preview(data) -> str:
    """What the server sent, cut to one short line for an error message."""
    if isinstance(data, dict):
        keys = ", ".join(str(k)[:20] for k in list(data)[:5])
        return f"an object with keys {keys}" if data else "an empty object {}"
    if isinstance(data, list):
        return f"a list of {len(data)} items"
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    text = " ".join(str(data)[:1000].split())
    if not text:
        return "(nothing)"
    return repr(text) if len(text) <= 80 else repr(f"{text[:79]}…")


def run_prompts(client: Client, prompts: str) -> list[dict]:
    rows = []
    for case in load_prompts(prompts):
        reply, wall = client.ask([{"role": role, "content": text} for role, text in case.messages])
        tokens = _count(_mapping(reply.get("usage")).get("completion_tokens")) or 0
        timings = _mapping(reply.get("timings"))
        rows.append(
            {
                "prompt": case.name,
                "tokens": tokens,
                "wall_tokens_per_second": tokens / wall if wall else 0.0,
                "decode_tokens_per_second": _count(timings.get("predicted_per_second")),
                "draft_n": _count(timings.get("draft_n")),
                "draft_n_accepted": _count(timings.get("draft_n_accepted")),
            }
        )
    return rows


def run_conversation(client: Client, turns=CONVERSATION) -> list[dict]:
    history, rows = [{"role": "system", "content": SYSTEM}], []
    for i, text in enumerate(turns, 1):
        history.append({"role": "user", "content": text})
        answer = client.stream(history)
        history.append({"role": "assistant", "content": answer["text"]})
        usage, timings = answer["usage"], answer["timings"]
        rows.append(
            {
                "turn": i,
                "ttft": answer["ttft"],
                "wall": answer["wall"],
                "prompt_tokens": _count(usage.get("prompt_tokens")),
                "prompt_n": _count(timings.get("prompt_n")),
                "cache_n": _count(timings.get("cache_n")),
                "tokens": _count(usage.get("completion_tokens")),
            }
        )
    return rows


def run_tools(client: Client) -> list[dict]:
    messages = [{"role": "user", "content": TOOL_QUESTION}]
    reply, wall = client.ask(messages, tools=TOOLS)
    said = message(reply)
    calls = [
        c for c in _dicts(said.get("tool_calls")) if isinstance(_mapping(c.get("function")).get("name"), str)
    ]
    rows = [{"step": "call", "wall": wall, "tool_calls": [c["function"]["name"][:100] for c in calls]}]
    if calls:
        results = [
            {"role": "tool", "tool_call_id": str(c.get("id", ""))[:100], "content": TOOL_RESULT}
            for c in calls
        ]
        reply, wall = client.ask([*messages, said, *results], tools=TOOLS)
        answer = message(reply).get("content")
        rows.append(
            {
                "step": "answer",
                "wall": wall,
                "tool_calls": [],
                "text": answer if isinstance(answer, str) else "",
            }
        )
    return rows


def run_sets(client: Client, sets: tuple[str, ...], prompts: str) -> dict:
    out: dict = {}
    if "prompts" in sets:
        out["prompts"] = run_prompts(client, prompts)
    if "conversation" in sets:
        out["conversation"] = run_conversation(client)
    if "tools" in sets:
        out["tools"] = run_tools(client)
    return out


def parse_sets(text: str) -> tuple[str, ...]:
    sets = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [s for s in sets if s not in SETS]
    if unknown or not sets:
        raise ValueError(f"unknown set {unknown[0] if unknown else text!r}; choose from {', '.join(SETS)}")
    return sets


def print_results(results: dict, out=None) -> None:
    out = out or sys.stdout
    if "prompts" in results:
        print(
            f"{'prompt':32} {'tokens':>6} {'wall tok/s':>10} {'decode tok/s':>12} {'accepted/drafted':>17}",
            file=out,
        )
        for r in results["prompts"]:
            decode = f"{r['decode_tokens_per_second']:.1f}" if r["decode_tokens_per_second"] else "-"
            accepted = f"{r['draft_n_accepted']}/{r['draft_n']}" if r["draft_n"] is not None else "-"
            wall = f"{r['wall_tokens_per_second']:.1f}"
            print(f"{r['prompt']:32} {r['tokens']:>6} {wall:>10} {decode:>12} {accepted:>17}", file=out)
    if "conversation" in results:
        rows = results["conversation"]
        print(
            f"\n{'turn':>4} {'TTFT s':>8} {'wall s':>8} {'prompt':>7} {'decoded':>8} {'cached':>7}", file=out
        )
        for r in rows:
            ttft = f"{r['ttft']:.2f}" if r["ttft"] is not None else "-"
            counts = f"{_n(r['prompt_tokens']):>7} {_n(r['prompt_n']):>8} {_n(r['cache_n']):>7}"
            print(f"{r['turn']:>4} {ttft:>8} {r['wall']:>8.2f} {counts}", file=out)
        print(f"whole conversation: {sum(r['wall'] for r in rows):.1f} s", file=out)
    if "tools" in results:
        for r in results["tools"]:
            called = ", ".join(r["tool_calls"]) or "-"
            print(f"\ntools, {r['step']}: {r['wall']:.2f} s, calls: {called}", file=out, end="")
        print(file=out)


def _n(value) -> str:
    return "-" if value is None else str(value)


def add_args(p: argparse.ArgumentParser, url: bool = True) -> None:
    if url:
        p.add_argument("url", help="the server's base URL, e.g. http://127.0.0.1:8080/v1")
    p.add_argument(
        "--sets", default=",".join(SETS), help=f"what to measure: {', '.join(SETS)} (default: all)"
    )
    p.add_argument("--api-key", help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--model", help="model id to send (edgespec and llama-server answer any)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_args(p)
    p.add_argument("--prompts", default="quick", help="built-in sets (quick, code, chat, …, all) or a .jsonl")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    args = p.parse_args(argv)
    try:
        return measure(args.url, args)
    except EdgespecError as exc:
        print(f"edgespec: error: {exc}", file=sys.stderr)
        return 1


def measure(url: str, args) -> int:
    """Run ``args.sets`` against ``url``; print the tables, write ``args.json`` if given. What goes
    wrong (an unknown set, a bad URL, a server that fails or answers nonsense) is an ``EdgespecError``."""
    try:
        sets = parse_sets(args.sets)
    except ValueError as exc:
        raise EdgespecError(f"--sets: {exc}.") from None
    check_url(url)
    client = Client(url, args.api_key, args.model, args.max_tokens)
    try:
        results = run_sets(client, sets, args.prompts)
    except BadReply as exc:
        raise EdgespecError(f"the server at {url} {exc}; is it an OpenAI-compatible server?") from None
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        first = (str(exc) or type(exc).__name__).splitlines()[0]
        raise EdgespecError(f"the server at {url} failed: {first}") from None
    print_results(results)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


def check_url(url: str) -> None:
    """An http(s) URL with a host, or an ``EdgespecError`` with an example."""
    try:
        parsed = httpx.URL(url)
        ok = parsed.scheme in ("http", "https") and bool(parsed.host) and 0 < (parsed.port or 80) < 65536
    except (httpx.InvalidURL, ValueError, TypeError):
        ok = False
    if not ok:
        raise EdgespecError(
            f"--server {_preview(url)} is not an http:// or https:// URL; give the server's base URL, "
            "e.g. http://127.0.0.1:8080/v1."
        )


if __name__ == "__main__":
    sys.exit(main())
