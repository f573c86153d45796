"""Tools (function calling) in the OpenAI shape, for models that call them the Qwen2.5 / Hermes way.

Request side: ``tools`` (function definitions), ``tool_choice`` ("auto", "none", "required" or
``{"type": "function", "function": {"name": …}}``), assistant messages carrying ``tool_calls`` and
``tool`` messages carrying their results are checked here; the model's chat template renders them
(``decoding/template.py``). "none" leaves the tools out of the prompt; "required" and a named
function start the answer for the model (``ChatSettings.prefill``) with the opening of a call, so the
model can only complete one.

Answer side: the model writes each call as ``<tool_call>{"name": …, "arguments": {…}}</tool_call>``
(small models often write the same object in a ```json code block instead: read as a call too).
``ToolStream`` turns its text into OpenAI deltas as it arrives — text outside calls as ``content``,
each complete call as one ``tool_calls`` delta — and the whole answer is the same deltas merged, so a
streamed and a non-streamed answer agree. A call that is not valid JSON, names no offered tool, or has
arguments that are not an object comes back as the text the model wrote: never an error.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

from ..decoding.chat import Message, ToolCall
from .validation import ApiError, message_text, shown

OPEN, CLOSE = "<tool_call>", "</tool_call>"
# Where calls are read: the format the template teaches, and a JSON code block, which small models
# write instead (llama.cpp's Hermes parser reads both)
MARKERS = ((OPEN, CLOSE), ("```json", "```"))
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names
MAX_TOOLS = 128


@dataclass(frozen=True)
class ToolSetup:
    """What a request's tools mean for its answer."""

    definitions: tuple[dict, ...]  # rendered into the prompt (empty for tool_choice "none")
    names: frozenset[str]  # calls the answer may hold
    prefill: str = ""  # the answer's start, written for the model

    @property
    def parses(self) -> bool:
        """Whether the answer is read for calls (tools offered and tool_choice not "none")."""
        return bool(self.definitions)


def tool_setup(body: dict) -> ToolSetup | None:
    """The request's ``tools`` and ``tool_choice``, checked; None without tools."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise ApiError(400, "tool_choice needs tools: send the functions in tools.", "tool_choice")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise ApiError(400, f"tools must be a list of at most {MAX_TOOLS} function definitions.", "tools")
    definitions, names = [], []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type", "function") != "function"
            or not isinstance(function, dict)
        ):
            raise ApiError(400, f'{where} must be {{"type": "function", "function": {{"name", …}}}}.', where)
        name = function.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise ApiError(
                400,
                f"{where}.function.name must be 1 to 64 letters, digits, _ or -, not {shown(name)}.",
                where,
            )
        if name in names:
            raise ApiError(400, f"{where}: two tools are named {name!r}.", where)
        if not isinstance(function.get("description", ""), str):
            raise ApiError(400, f"{where}.function.description must be a string.", where)
        if not isinstance(function.get("parameters", {}), dict):
            raise ApiError(400, f"{where}.function.parameters must be a JSON Schema object.", where)
        names.append(name)
        definitions.append({"type": "function", "function": function})
    return _choice(choice, tuple(definitions), frozenset(names))


def _choice(choice, definitions: tuple[dict, ...], names: frozenset[str]) -> ToolSetup:
    if choice is None or choice == "auto":
        return ToolSetup(definitions, names)
    if choice == "none":
        return ToolSetup((), frozenset())
    if choice == "required":
        return ToolSetup(definitions, names, f'{OPEN}\n{{"name": "')
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise ApiError(
            400,
            'tool_choice must be "auto", "none", "required" or '
            '{"type": "function", "function": {"name": …}}.',
            "tool_choice",
        )
    if name not in names:
        raise ApiError(400, f"tool_choice names {shown(name)}, which is not among tools.", "tool_choice")
    return ToolSetup(definitions, names, f'{OPEN}\n{{"name": "{name}", "arguments": ')


def tool_message(message: dict, where: str) -> Message:
    """An assistant message with ``tool_calls``, or a ``tool`` message with a call's result."""
    if message.get("role") == "tool":
        ident = message.get("tool_call_id", "")
        if not isinstance(ident, str):
            raise ApiError(400, f"{where}.tool_call_id must be a string.", f"{where}.tool_call_id")
        return Message("tool", message_text(message.get("content"), f"{where}.content"), tool_call_id=ident)
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or len(calls) > MAX_TOOLS:
        raise ApiError(400, f"{where}.tool_calls must be a list of calls.", f"{where}.tool_calls")
    content = message.get("content")
    text = "" if content is None else message_text(content, f"{where}.content")
    return Message(
        "assistant", text, tuple(_call(c, f"{where}.tool_calls[{i}]") for i, c in enumerate(calls))
    )


def _call(call, where: str) -> ToolCall:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise ApiError(
            400, f'{where} must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}.', where
        )
    name, arguments, ident = function.get("name"), function.get("arguments", "{}"), call.get("id", "")
    if not isinstance(name, str) or not NAME.match(name):
        raise ApiError(400, f"{where}.function.name must be a function name, not {shown(name)}.", where)
    if isinstance(arguments, dict):  # some clients send the object itself
        arguments = json.dumps(arguments, ensure_ascii=False)
    if not isinstance(arguments, str) or not isinstance(ident, str):
        raise ApiError(400, f"{where}: arguments (JSON text) and id must be strings.", where)
    message_text(arguments, f"{where}.function.arguments")  # valid Unicode, as message text must be
    return ToolCall(name, arguments, ident)


# -- the answer ----------------------------------------------------------------------------------------
class ToolStream:
    """The answer's text → OpenAI deltas: ``{"content": …}`` and ``{"tool_calls": [one call]}``."""

    def __init__(self, setup: ToolSetup):
        self.names = setup.names
        self.buffer = setup.prefill  # text not yet turned into deltas (the prefill starts a call)
        self.close = CLOSE if setup.prefill else None  # inside a call: the marker that ends it
        self.opened = len(OPEN)  # inside a call: the length of the marker that opened it
        self.held = ""  # whitespace outside calls, held back until text follows it
        self.calls = 0

    def feed(self, text: str) -> list[dict]:
        self.buffer += text
        out: list[dict] = []
        while True:
            if self.close is not None:
                end = self.buffer.find(self.close, self.opened)
                if end < 0:
                    return out
                end += len(self.close)
                block, self.buffer, self.close = self.buffer[:end], self.buffer[end:], None
                out += self._block(block)
                continue
            found = [(at, o, c) for o, c in MARKERS if (at := self.buffer.find(o)) >= 0]
            if found:
                start, open_, close = min(found)
                out += self._text(self.buffer[:start], before_call=True)
                self.buffer, self.close, self.opened = self.buffer[start:], close, len(open_)
                continue
            keep = max(_partial(self.buffer, open_) for open_, _ in MARKERS)  # an opening on its way
            out += self._text(self.buffer[: len(self.buffer) - keep])
            self.buffer = self.buffer[len(self.buffer) - keep :]
            return out

    def finish(self) -> list[dict]:
        """The rest at the end of the answer (an unclosed last call is read as a call if it can be)."""
        inside = self.close is not None
        out = self._block(self.buffer) if inside else self._text(self.buffer, before_call=True)
        self.buffer, self.close = "", None
        return out

    def _text(self, text: str, before_call: bool = False) -> list[dict]:
        """Text outside calls; whitespace at its end waits for more text (before a call or at the end
        of the answer it is dropped), so the stream and the whole answer agree."""
        self.held += text
        body = self.held.rstrip()
        self.held = "" if before_call else self.held[len(body) :]
        return [{"content": body}] if body else []

    def _block(self, block: str) -> list[dict]:
        body = block
        for open_, close in MARKERS:
            if block.startswith(open_):
                body = block[len(open_) :].removesuffix(close)
                break
        call = self._parse(body)
        if call is None:
            return self._text(block, before_call=True)  # not a call after all: the model's text
        name, arguments = call
        delta = {
            "index": self.calls,
            "id": f"call_{secrets.token_hex(12)}",
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        self.calls += 1
        return [{"tool_calls": [delta]}]

    def _parse(self, body: str) -> tuple[str, str] | None:
        try:
            value = json.loads(body)
        except (ValueError, RecursionError):
            return None
        if not isinstance(value, dict) or value.get("name") not in self.names:
            return None
        arguments = value.get("arguments", value.get("parameters", {}))
        if isinstance(arguments, str):  # some models write the arguments as JSON text
            try:
                arguments = json.loads(arguments)
            except (ValueError, RecursionError):
                return None
        if not isinstance(arguments, dict):
            return None
        return value["name"], json.dumps(arguments, ensure_ascii=False)


def _partial(text: str, marker: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def merged(deltas: list[dict]) -> tuple[str | None, list[dict]]:
    """The whole answer from its deltas: (content or None, tool calls)."""
    text = "".join(d.get("content", "") for d in deltas)
    calls = []
    for delta in deltas:
        for call in delta.get("tool_calls", ()):
            calls.append({k: v for k, v in call.items() if k != "index"})
    if calls and not text.strip():
        return None, calls
    return text, calls
