"""The chat app on the real bundled pair with its target over RPC, in a child process (see
tests/test_rpc_real.py): it asks one long question, prints ``streaming`` once the answer is on screen,
and after the parent has killed an RPC server it reports what the app shows as one JSON line.

    python tests/support/rpc_chat_child.py CHATS.sqlite3 TARGET DRAFT HOST:PORT,HOST:PORT
"""

from __future__ import annotations

import asyncio
import json
import sys
from time import monotonic

from edgespec.cli import build_parser
from edgespec.decoding.chat import ChatSettings
from edgespec.session import ChatBackend
from tui.app import ChatApp
from tui.storage import ChatStore
from tui.widgets.prompt import PromptInput


async def until(pilot, condition, timeout: float) -> bool:
    deadline = monotonic() + timeout
    while not condition():
        if monotonic() > deadline:
            return False
        await pilot.pause(0.05)
    return True


async def main(db: str, target: str, draft: str, servers: str) -> None:
    argv = ["chat", "--target", target, "--draft", draft, "--rpc", servers, "--rpc-timeout", "20"]
    args = build_parser().parse_args([*argv, "--strategy", "chain", "--threads", "1", "--ctx", "1024"])
    app = ChatApp(ChatBackend.from_args(args), ChatStore(db), settings=ChatSettings(max_tokens=400))
    async with app.run_test(size=(130, 40)) as pilot:
        chat = app.chat
        loaded = await until(pilot, lambda: chat.loaded is not None or chat.status.state == "no model", 300)
        report = {"loaded": loaded and chat.loaded is not None, "status": chat.status.pair}
        if report["loaded"]:
            prompt = chat.query_one(PromptInput)
            prompt.value = "Write a long essay about recursion in programming."
            await pilot.press("enter")
            streaming = await until(
                pilot, lambda: chat.gen is not None and len(chat.gen.answer.text) > 20, 120
            )
            print("streaming" if streaming else "no answer", flush=True)
            report["ended"] = await until(pilot, lambda: chat.gen is None, 60)  # the parent kills a server
            answer = chat.log_view.last_answer()
            report.update(
                shown=answer.text if answer else "",
                meta=answer.meta if answer else "",
                notes=[n.message for n in app._notifications],
                state=chat.status.state,
            )
            # The app stays up: the next question is answered with an error at once, not a hang.
            prompt.value = "And again?"
            await pilot.press("enter")
            report["second_ended"] = await until(pilot, lambda: chat.gen is None, 30)
            report["notes_after"] = [n.message for n in app._notifications]
        print(json.dumps(report), flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
