"""The conversation: user messages and answers, the answer in flight streaming token by token.

While an answer streams, its text is drawn token by token, each run styled by provenance (an accepted
draft token, a token of a GSD-merged node, a token copied from the conversation, or a token the target
chose itself). A finished answer is
rendered as Markdown; the "token view" toggle shows the provenance colours of finished answers instead.
"""

from __future__ import annotations

from rich.text import Text
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Markdown, Static

from edgespec.decoding.events import Provenance

from ..messages import Span

PROVENANCE_CLASSES = {
    Provenance.DRAFT: "provenance--draft",
    Provenance.MERGED: "provenance--merged",
    Provenance.COPIED: "provenance--copied",
    Provenance.TARGET: "provenance--target",
}


class UserMessage(Static):
    def __init__(self, text: str) -> None:
        super().__init__(Text(text), classes="message")
        self.text = text
        self.border_title = "you"


class AnswerMessage(Vertical):
    """One assistant answer: spans of text by provenance, a meta line, Markdown once finished."""

    COMPONENT_CLASSES = set(PROVENANCE_CLASSES.values())

    def __init__(self, spans: list[Span] | None = None, *, streaming: bool = True, meta: str = "") -> None:
        super().__init__(classes="message")
        self.spans: list[Span] = list(spans or [])
        self.streaming = streaming
        self.meta = meta
        self.highlight = True  # colour tokens by provenance
        self.token_view = False  # finished answers: provenance view instead of Markdown
        self.border_title = "assistant"
        self._tokens = Static(classes="tokens")
        self._markdown: Markdown | None = None

    @property
    def text(self) -> str:
        return "".join(t for t, _ in self.spans)

    def compose(self):
        yield self._tokens
        yield Static(self.meta, classes="meta")

    def on_mount(self) -> None:
        self.query_one(".meta").display = bool(self.meta)
        self._show()

    def append(self, spans: list[Span]) -> None:
        for text, prov in spans:  # adjacent runs of one provenance merge into one span
            if self.spans and self.spans[-1][1] == prov:
                self.spans[-1] = (self.spans[-1][0] + text, prov)
            else:
                self.spans.append((text, prov))
        self._tokens.update(self._rich_text())

    def finish(self, meta: str) -> None:
        self.streaming = False
        self.set_meta(meta)
        self._show()

    def set_meta(self, meta: str) -> None:
        self.meta = meta
        if self.is_mounted:
            meta_line = self.query_one(".meta", Static)
            meta_line.update(meta)
            meta_line.display = bool(meta)

    def set_view(self, highlight: bool, token_view: bool) -> None:
        self.highlight, self.token_view = highlight, token_view
        if self.is_mounted:
            self._show()

    def _show(self) -> None:
        tokens_visible = self.streaming or self.token_view
        self._tokens.display = tokens_visible
        if tokens_visible:
            self._tokens.update(self._rich_text())
        elif self._markdown is None:
            self._markdown = Markdown(self.text or "*(no text)*")
            self.mount(self._markdown, before=self.query_one(".meta"))
        if self._markdown is not None:
            self._markdown.display = not tokens_visible

    def _rich_text(self) -> Text:
        text = Text()
        for chunk, prov in self.spans:
            style = self.get_component_rich_style(PROVENANCE_CLASSES[prov]) if self.highlight else ""
            text.append(chunk, style=style)
        if self.streaming:
            text.append("▍", style="dim")
        return text


class ChatLog(VerticalScroll):
    """The messages of the open conversation, kept scrolled to the newest while it streams."""

    def on_mount(self) -> None:
        self.anchor()

    def clear(self) -> None:
        self.remove_children()

    def add_user(self, text: str) -> UserMessage:
        message = UserMessage(text)
        self.mount(message)
        self.anchor()
        return message

    def add_answer(
        self,
        spans: list[Span] | None = None,
        *,
        streaming: bool = True,
        meta: str = "",
        highlight: bool = True,
        token_view: bool = False,
    ) -> AnswerMessage:
        answer = AnswerMessage(spans, streaming=streaming, meta=meta)
        answer.highlight, answer.token_view = highlight, token_view
        self.mount(answer)
        self.anchor()
        return answer

    def answers(self) -> list[AnswerMessage]:
        return list(self.query(AnswerMessage))

    def last_answer(self) -> AnswerMessage | None:
        answers = self.answers()
        return answers[-1] if answers else None


def answer_meta(
    pair: str | None, strategy: str | None, stats: dict, finish: str | None, complete: bool = True
) -> str:
    """The line under a finished answer: who answered, how, and how fast."""
    parts = [pair or "?", strategy or "?"]
    if stats:
        parts.append(f"{stats.get('tokens', 0)} tokens")
        parts.append(f"{stats.get('tokens_per_second', 0.0):.1f} tok/s")
        parts.append(f"MAL {stats.get('mean_accepted_length', 0.0):.2f}")
        if stats.get("drafted"):
            parts.append(f"acceptance {stats.get('acceptance_rate', 0.0):.0%}")
        python = stats.get("time_split", {}).get("python")
        if python is not None and stats.get("target_calls"):
            parts.append(f"python {python / stats['target_calls'] * 1000:.2f} ms/step")
    notes = {
        "length": "max tokens reached",
        "cancelled": "stopped",
        "context": "context full",
        "error": "failed",
    }
    if not complete:  # never finished: still streaming, or cut off by a crash ('interrupted')
        parts.append("cut off: edgespec stopped while writing" if finish == "interrupted" else "interrupted")
    elif finish in notes:
        parts.append(notes[finish])
    return " · ".join(parts)
