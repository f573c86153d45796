"""Request validation's building blocks, shared by chat (``protocol.py``), tools (``tools.py``) and
text completions (``completions.py``): the error response and the checks of a body's fields, each
raising ``ApiError`` with the HTTP status and a message that says what to fix (pure, no I/O)."""

from __future__ import annotations

import json
import math

from ..decoding import checks


class ApiError(Exception):
    """An error response in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    @property
    def kind(self) -> str:
        if self.status == 401:
            return "authentication_error"
        if self.status == 404:
            return "not_found_error"
        return "invalid_request_error" if self.status < 500 else "server_error"

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


MAX_DEPTH = 32  # JSON nesting a body may have (a chat body needs 4)


def parse_body(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except RecursionError:
        body = None  # nested past Python's recursion limit: refused below
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not valid JSON ({exc}); send a JSON object.") from None
    if body is None or _too_deep(body):
        raise ApiError(400, f"the request body is nested more than {MAX_DEPTH} levels deep.")
    if not isinstance(body, dict):
        raise ApiError(400, 'the request body must be a JSON object, e.g. {"messages": [...]}.')
    return body


def _too_deep(value) -> bool:
    """Whether ``value`` nests lists and objects more than ``MAX_DEPTH`` deep (iterative: no recursion)."""
    level = [value]
    for _ in range(MAX_DEPTH + 1):
        level = [
            child
            for item in level
            if isinstance(item, (list, dict))
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, (list, dict))
        ]
        if not level:
            return False
    return True


def checked(check, *args) -> None:
    """Run one of ``edgespec.decoding.checks`` (the CLI's and the chat app's too): its error is a 400."""
    try:
        check(*args)
    except checks.SettingError as exc:
        raise ApiError(400, str(exc), exc.name) from None


def field(body: dict, name: str, kind: type, default):
    """``body[name]`` checked against ``kind`` (bool is not a number; an int is a float)."""
    value = body.get(name)
    if value is None:
        return default
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            value, ok = float(value), True
        except OverflowError:  # an integer beyond any float
            ok = False
    if not ok or (kind is float and not math.isfinite(value)):
        names = {int: "an integer", float: "a number", bool: "true or false"}
        raise ApiError(400, f"{name} must be {names[kind]}, not {shown(value)}.", name)
    return value


def shown(value) -> str:
    """A client's value in an error message: as JSON (ASCII), cut short."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def message_text(value, where: str) -> str:
    """A string, or a list of text parts (``{"type": "text", "text": ...}``); images are not supported."""
    text = None
    if isinstance(value, str):
        text = value
    elif isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in value):
        if all(isinstance(p.get("text"), str) for p in value):
            text = "".join(p["text"] for p in value)
    if text is not None:
        checked(checks.check_text, text, where)
        return text
    raise ApiError(
        400, f"{where} must be a string or a list of text parts (this server reads text only).", where
    )
