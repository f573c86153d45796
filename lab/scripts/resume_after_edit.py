"""Counts only: on the served conversation's answers (a per-step log of ``served_conversation.py``), how
often "resume the source where the answer left it" would propose right copies — the source position
after the last match of >= 4 tokens, resumed when the answer writes its token (or one up to 3 later) —
against the longest n-gram match's copy at the same positions (both capped at 15 tokens).

    python lab/scripts/resume_after_edit.py steps.jsonl
"""

import collections
import json
import sys

from edgespec.decoding.chat import ChatSettings, Message, prompt_tokens
from edgespec.engine.pair import EngineSettings
from edgespec.measure.bench_client import CONVERSATION, SYSTEM
from edgespec.models.pairs import open_pair, resolve_pair
from edgespec.planner.ngram import NGramIndex, common_prefix

ANCHOR_MATCH = 4  # a match this long marks where the answer is in its source
SKIP = 4  # the answer may resume up to SKIP − 1 source tokens later (a deletion)


def run_length(source: list[int], at: int, answer: list[int], i: int) -> int:
    """How many tokens answer[i:] and source[at:] agree on, at most 15."""
    return common_prefix(source[at : at + 15], answer[i : i + 15])


answers = collections.defaultdict(list)
for line in open(sys.argv[1]):
    row = json.loads(line)
    answers[int(str(row["turn"])[-1])] += row["ids"]
counts = collections.Counter()
with open_pair(resolve_pair(), EngineSettings(threads=1, n_ctx=8192)) as pair:
    history = [Message("system", SYSTEM)]
    for turn, text in enumerate(CONVERSATION, 1):
        history.append(Message("user", text))
        prompt, _ = prompt_tokens(pair, history, ChatSettings(max_tokens=384))
        answer, index, anchor = answers[turn], NGramIndex(8), None
        for token in prompt:
            index.append(token)
        for i in range(1, len(answer)):  # written: answer[:i − 1] indexed, answer[i − 1] the root
            if i >= 2:
                index.append(answer[i - 2])
            found = index.matches(answer[i - 1], 8)
            if found and found[0][1] >= ANCHOR_MATCH:
                anchor = found[0][0]  # the source goes on at anchor
                continue
            if anchor is None:
                continue
            top = run_length(index.tokens, found[0][0], answer, i) if found else 0
            for at in range(anchor, anchor + SKIP):
                if at < len(index.tokens) and index.tokens[at] == answer[i - 1]:
                    resumed = run_length(index.tokens, at + 1, answer, i)
                    counts["candidates"] += 1
                    counts["right >= 3"] += resumed >= 3
                    counts["resumed tokens"] += resumed
                    counts["top match tokens there"] += top
                    counts["right >= 3 where the top match < 3"] += resumed >= 3 and top < 3
                    anchor = at + 1
                    break
        history.append(Message("assistant", b"".join(map(pair.target.model.piece, answer)).decode()))
print(dict(counts))
