"""The conversation list (toggle with ctrl+b). Selecting one opens it."""

from __future__ import annotations

from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option, OptionDoesNotExist

from ..storage import Conversation


class ConversationList(OptionList):
    class Opened(Message):
        def __init__(self, conversation_id: int) -> None:
            super().__init__()
            self.conversation_id = conversation_id

    def __init__(self) -> None:
        super().__init__(id="sidebar")
        self.border_title = "chats"

    def show(self, conversations: list[Conversation], current: int | None) -> None:
        self.clear_options()
        self.add_options([Option(c.title or "(untitled)", id=str(c.id)) for c in conversations])
        if current is not None:
            self.mark(current)

    def mark(self, conversation_id: int | None) -> None:
        """Highlight the open conversation (without opening it again)."""
        if conversation_id is None:
            self.highlighted = None
            return
        try:
            self.highlighted = self.get_option_index(str(conversation_id))
        except OptionDoesNotExist:  # not in the list (e.g. deleted meanwhile)
            self.highlighted = None

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id is not None:
            self.post_message(self.Opened(int(event.option.id)))
