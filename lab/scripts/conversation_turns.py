"""The bench client's 6-turn coding conversation as a prompt file: each turn's messages, the answers
before it being the target's greedy plain answers (what a server writes, up to near-ties), so the
counting scripts (``copy_oracle.py``, ``modelled_speedup.py``, ``copy_by_match_length.py``) can run
on it in process.

    python lab/scripts/conversation_turns.py OUT.jsonl [max_tokens=384]
"""

import json
import sys

from edgespec.decoding.chat import ChatSettings, Message, prompt_tokens
from edgespec.decoding.decoder import Request, generate
from edgespec.engine.pair import EngineSettings
from edgespec.measure.bench_client import CONVERSATION, SYSTEM
from edgespec.models.pairs import open_pair, resolve_pair

out_path = sys.argv[1]
max_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 384
history = [("system", SYSTEM)]
with open_pair(resolve_pair(), EngineSettings(threads=2)) as pair, open(out_path, "w") as out:
    for turn, text in enumerate(CONVERSATION, 1):
        history.append(("user", text))
        messages = [{"role": role, "content": content} for role, content in history]
        case = {"name": f"conversation/turn{turn}", "category": "conversation", "messages": messages}
        out.write(json.dumps(case))
        out.write("\n")
        chat = [Message(role, content) for role, content in history]
        prompt, _ = prompt_tokens(pair, chat, ChatSettings(max_tokens=max_tokens))
        answer = [t for event in generate(pair, None, Request(prompt, max_tokens)) for t in event.token_ids]
        text = b"".join(pair.target.model.piece(t) for t in answer).decode("utf-8", "replace")
        history.append(("assistant", text))
        print(f"turn {turn}: prompt {len(prompt)} tokens, answer {len(answer)}", flush=True)
