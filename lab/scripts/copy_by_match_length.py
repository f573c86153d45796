"""How often the top copy's next token is right, by the match's true length (extended backwards past
the index's n_max = 8), and how far the answer then goes on copying — on the target's greedy answers
to a prompt file (counts only: one plain decode per prompt).

    python lab/scripts/copy_by_match_length.py conversation.jsonl [max_tokens=384]
"""

import sys
from collections import defaultdict

from edgespec.decoding.chat import ChatSettings, Message, prompt_tokens
from edgespec.decoding.decoder import Request, generate
from edgespec.engine.pair import EngineSettings
from edgespec.measure.prompts import load_prompts
from edgespec.models.pairs import open_pair, resolve_pair
from edgespec.planner.ngram import NGramIndex, common_prefix

BINS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32)
max_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 384
right, total, runs = defaultdict(int), defaultdict(int), defaultdict(list)
with open_pair(resolve_pair(), EngineSettings(threads=2)) as pair:
    for case in load_prompts(sys.argv[1]):
        messages = [Message(role, content) for role, content in case.messages]
        prompt, _ = prompt_tokens(pair, messages, ChatSettings(max_tokens=max_tokens))
        answer = [t for event in generate(pair, None, Request(prompt, max_tokens)) for t in event.token_ids]
        text = [*prompt, *answer]
        index = NGramIndex(8)
        for token in text[: len(prompt) - 1]:
            index.append(token)
        for i in range(len(prompt), len(text)):  # the root text[i − 1] is pending, text[i] comes next
            best = None
            for start, n in index.matches(text[i - 1], 8):
                while n < 64 and start - 1 - n >= 0 and text[start - 1 - n] == text[i - 1 - n]:
                    n += 1  # its true length
                if best is None or n > best[1]:
                    best = (start, n)
            if best is not None:
                start, n = best
                run = common_prefix(text[start:i], text[i:])  # how many tokens the answer copies from there
                b = max(x for x in BINS if x <= n)
                right[b] += run > 0
                total[b] += 1
                runs[b].append(run)
            index.append(text[i - 1])
for b in BINS:
    if total[b]:
        r = sorted(runs[b])
        print(
            f"match {b:>2}{'+' if b >= 8 else ' '} tokens: next right {right[b]}/{total[b]} = "
            f"{right[b] / total[b]:.2f}, copying on a median {r[len(r) // 2]} tokens "
            f"({sum(x >= 16 for x in r) / total[b]:.2f} ≥ 16)"
        )
