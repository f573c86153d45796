"""The chat app on the real bundled pair, answering many questions in a row with speculation on.

Run by test_chat_stress.py in a child process, so that a native crash is a failed test with a
stack trace (faulthandler, all threads, written to FAULT_LOG) instead of a dead test run.

    python tests/support/chat_stress.py CHATS.sqlite3 REPLIES FAULT_LOG
"""

from __future__ import annotations

import asyncio
import faulthandler
import sys

from edgespec.cli import build_parser
from edgespec.decoding.chat import ChatSettings
from edgespec.session import ChatBackend
from edgespec.strategy import StrategyChoice
from tui.app import ChatApp
from tui.storage import ChatStore
from tui.widgets.prompt import PromptInput

QUESTIONS = (
    "Write a Python function that reverses a list.",
    "What is a hash map?",
    "Fix this: for i in range(10) print(i)",
    "Translate 'good morning' into French.",
    "Give me a SQL query that counts rows per day.",
    "Explain recursion in one sentence.",
    "Write a haiku about caches.",
    "What does git rebase do?",
)
# auto first (its cost profile is measured, then it decides per step), then forced speculation.
STRATEGIES = (
    StrategyChoice("auto"),
    StrategyChoice("chain", {"budget": 4}),
    StrategyChoice("dyspec", {"budget": 8}),
    StrategyChoice("tsd", {"budget": 8}),
)
NEW_CHAT_EVERY = 4  # keep the context short: a new conversation every few replies


async def stress(db: str, replies: int) -> int:
    args = build_parser().parse_args(["chat", "--ctx", "2048", "--strategy", "auto"])
    app = ChatApp(ChatBackend.from_args(args), ChatStore(db), settings=ChatSettings(max_tokens=10))
    failures = 0
    async with app.run_test(size=(120, 40)) as pilot:
        chat = app.chat
        while chat.loaded is None:
            assert chat.status.state != "no model", [n.message for n in app._notifications]
            await pilot.pause(0.1)
        for i in range(replies):
            if i % NEW_CHAT_EVERY == 0:
                chat.conversation_id = None
            assert chat.set_strategy(STRATEGIES[(i // NEW_CHAT_EVERY) % len(STRATEGIES)], chosen=True)
            started = chat._gen_counter
            chat.query_one(PromptInput).value = QUESTIONS[i % len(QUESTIONS)]
            await pilot.press("enter")
            while chat._gen_counter == started or chat.gen is not None:
                await pilot.pause(0.05)
            stored = app.store.messages(chat.conversation_id)[-1]
            ok = stored.role == "assistant" and stored.content.strip() and stored.finish_reason in (
                "length",
                "stop",
            )
            failures += not ok
            print(
                f"reply {i + 1:2d} {'ok ' if ok else 'BAD'} {chat.status.strategy[:60]:<60} "
                f"{stored.finish_reason} tokens={stored.stats.get('tokens') if stored.stats else None} "
                f"MAL={stored.stats.get('mean_accepted_length', 0) if stored.stats else 0:.2f}",
                flush=True,
            )
    return failures


if __name__ == "__main__":
    with open(sys.argv[3], "w") as fault_log:
        faulthandler.enable(fault_log, all_threads=True)
        sys.exit(min(asyncio.run(stress(sys.argv[1], int(sys.argv[2]))), 100))
