"""The chat app in a child process, answering slowly until it is killed (see test_crash_safety.py).

    python tests/support/chat_victim.py CHATS.sqlite3 QUESTION
"""

from __future__ import annotations

import asyncio
import sys

from tests.support.tui_fakes import FakeBackend
from tui.app import ChatApp
from tui.storage import ChatStore
from tui.widgets.prompt import PromptInput


async def main(db: str, question: str) -> None:
    app = ChatApp(FakeBackend(delay=0.02, repeat=500), ChatStore(db))
    async with app.run_test(size=(120, 40)) as pilot:
        while app.chat.loaded is None:
            await pilot.pause(0.05)
        prompt = app.chat.query_one(PromptInput)
        prompt.value = question
        await pilot.press("enter")
        print("sent", flush=True)
        while True:  # stream until killed
            await pilot.pause(0.1)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
