"""Chats with tools: the GGUF's Jinja chat template, run by jinja2 in its sandbox.

llama.cpp's ``llama_chat_apply_template`` recognises a template by its look and writes the known
format itself: it has no tools. A conversation with tools (function definitions, an assistant's tool
calls, ``tool`` messages answering them) is rendered here by the template itself, as Hugging Face's
``apply_chat_template`` runs it: ``messages``, ``tools``, ``add_generation_prompt`` and the usual
helpers (``raise_exception``, ``strftime_now``, a ``tojson`` that keeps non-ASCII text as it is).

Client text is data, never markup (as in ``decoding/chat.py``): every message's text goes into the
template as a placeholder, and every ``tojson`` (a tool's definition, a call's arguments) comes out
as one; the template's own text is tokenised with special-token parsing, each placeholder's text
without it (JSON as one piece, so it tokenises as the model saw JSON in training). Tool names must be
identifiers (``server/tools.py`` checks them) and go in as they are.

The answer may be started for the model (``ChatSettings.prefill``: ``tool_choice`` "required" or a
named function start the call themselves): the prefill is template text after the generation prompt.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from datetime import datetime

from ..errors import ContextFullError, EdgespecError


class TemplateError(EdgespecError):
    """The GGUF's chat template cannot render this conversation."""


def _compiled(source: str, tojson):
    """The template in a sandbox of its own, with its own ``tojson`` (set before compiling: Jinja
    decides at compile time what a filter is passed)."""
    from jinja2 import TemplateError as JinjaError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except JinjaError as exc:
        raise TemplateError(f"the model's chat template does not compile ({exc}); tools need it.") from None


def _raise(message: str):
    raise TemplateError(f"the model's chat template refused the conversation: {message}")


class JinjaRenderer:
    """Renders with placeholders, tokenises piece by piece (see the module's docstring)."""

    def __init__(self, model, special: bool = False):
        source = model.chat_template()
        if not source:
            raise TemplateError(f"{model.path} has no chat template, so it cannot be given tools.")
        self.model, self.special = model, special
        self.template = _compiled(source, self._tojson)
        self.nonce = secrets.token_hex(8)
        self._pattern = re.compile("\ue000" + self.nonce + r"\.(\d+)\ue001")
        self._data: list[str] = []  # the texts the placeholders of the rendering under way stand for
        self._marks: dict[str, str] = {}  # placeholder → text

    def _mark(self, text: str) -> str:
        marker = f"\ue000{self.nonce}.{len(self._data)}\ue001"
        self._data.append(text)
        self._marks[marker] = text
        return marker

    def _tojson(self, value, indent=None, separators=None, sort_keys=False) -> str:
        plain = _unmark(value, self._marks)
        dumped = json.dumps(
            plain, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys
        )
        return self._mark(dumped)

    def tokens(self, messages: Sequence, tools: Sequence[dict], prefill: str = "") -> list[int]:
        self._data, self._marks = [], {}
        data, mark = self._data, self._mark
        try:
            text = self.template.render(
                messages=[_message(m, mark) for m in messages],
                tools=list(tools) or None,
                add_generation_prompt=True,
                bos_token="",  # the BOS comes from tokenising the first piece (as in chat.py)
                eos_token="",
            )
        except TemplateError:
            raise
        except Exception as exc:  # a template error, or the sandbox refusing something
            raise TemplateError(f"the model's chat template failed on this conversation ({exc!r}).") from None
        text += prefill
        out: list[int] = []
        at = 0
        for found in self._pattern.finditer(text):
            out += self._template_text(text[at : found.start()], first=at == 0)
            out += self.model.tokenize(
                data[int(found.group(1))], add_special=False, parse_special=self.special
            )
            at = found.end()
        return out + self._template_text(text[at:], first=at == 0)

    def _template_text(self, text: str, first: bool) -> list[int]:
        return self.model.tokenize(text, add_special=first, parse_special=True) if text else []


def _message(message, mark) -> dict:
    """A ``Message`` as the template sees it: text as placeholders, calls' arguments as objects."""
    out: dict = {"role": message.role, "content": mark(message.content) if message.content else ""}
    if getattr(message, "tool_calls", ()):
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": _arguments(call.arguments, mark)},
            }
            for call in message.tool_calls
        ]
    if getattr(message, "tool_call_id", ""):
        out["tool_call_id"] = message.tool_call_id
    return out


def _arguments(text: str, mark):
    """A call's arguments: the object (templates write it with ``tojson``) or, not JSON, its text."""
    try:
        value = json.loads(text)
    except ValueError:
        return mark(text)
    return value if isinstance(value, dict) else mark(text)


def _unmark(value, marks: dict[str, str]):
    """``value`` with placeholders put back (a template may ``tojson`` a message's text)."""
    if isinstance(value, str):
        return marks.get(value, value)
    if isinstance(value, dict):
        return {_unmark(k, marks): _unmark(v, marks) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_unmark(v, marks) for v in value]
    return value


def trimmed_tokens(pair, messages: Sequence, settings, room: int) -> tuple[list[int], int]:
    """The conversation rendered with tools, the oldest exchanges dropped until it fits ``room``.

    An exchange starts at a user message (an assistant's calls and their tool answers stay with the
    question they answer); the system message and the last exchange are always kept. The cut is found
    by bisection: a few renders, whatever the length. Returns the tokens and the messages dropped."""
    system = [m for m in messages if m.role == "system"]
    turns = [m for m in messages if m.role != "system"]
    starts = [i for i, m in enumerate(turns) if m.role == "user" and i > 0]
    render = JinjaRenderer(pair.target.model, settings.special_tokens)

    def tokens(cut: int) -> list[int]:
        return render.tokens(system + turns[cut:], settings.tools, settings.prefill)

    whole = tokens(0)
    if len(whole) <= room:
        return whole, 0
    # the fewest exchanges k to drop (cut at starts[k - 1]): fitting is monotone in k, so bisect
    found = tokens(starts[-1]) if starts else whole
    if len(found) > room:
        raise ContextFullError(
            f"the conversation with its tools needs more than the {max(room, 0)} tokens of context left "
            f"for the prompt (window {pair.target.n_ctx}, {settings.max_tokens} kept for the answer). "
            "Send fewer or shorter tools, lower max tokens, or load the models with a larger --ctx."
        )
    lo, hi = 1, len(starts)
    while lo < hi:
        mid = (lo + hi) // 2
        candidate = tokens(starts[mid - 1])
        if len(candidate) <= room:
            hi, found = mid, candidate
        else:
            lo = mid + 1
    return found, starts[hi - 1]
