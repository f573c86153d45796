"""How the draft's top-1 probability q predicts the target's greedy token, on prompts' greedy answers:
acceptance by q bin (r = right ÷ Σ q per bin), and right-after-right (the conditional a chain sees).

    python lab/scripts/acceptance_by_q.py PROMPTS.jsonl [TOKENS]
"""

import sys

import numpy as np

from edgespec.decoding.chat import ChatSettings, Message, prompt_tokens
from edgespec.decoding.decoder import Request, generate
from edgespec.engine.pair import EngineSettings
from edgespec.measure.prompts import load_prompts
from edgespec.models.pairs import open_pair, resolve_pair
from edgespec.planner.tree import TreeBuilder


def greedy_answer(pair, prompt, max_tokens: int) -> list[int]:
    """The target's greedy answer (plain decoding), as ``edgespec.profile.fit`` reads it."""
    answer: list[int] = []
    for event in generate(pair, None, Request(prompt=list(prompt), max_tokens=max_tokens)):
        answer.extend(event.token_ids)
    return answer


def draft_chain(draft, prompt, answer):
    """The draft's distribution before each answer token, the answer read as one chain."""
    draft.sync(prompt)  # holds the prompt but its last token: the chain's root
    draft.begin_step(1.0)
    tree, node = TreeBuilder(int(prompt[-1])), 0
    for token in answer:
        (dist,) = draft.expand(tree, [node])
        yield dist
        node = tree.add(node, int(token), dist.prob_of(int(token)))
    draft.begin_step(1.0)


cases = load_prompts(sys.argv[1])
tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 32
bins = np.array([0.0, 0.2, 0.4, 0.6, 0.8, 1.01])
r = resolve_pair()
all_q, all_right = [], []
with open_pair(r, EngineSettings(threads=2, n_ctx=4096)) as pair:
    for case in cases:
        messages = [Message(a, b) for a, b in case.messages]
        prompt, _ = prompt_tokens(pair, messages, ChatSettings(max_tokens=tokens))
        answer = greedy_answer(pair, prompt, tokens)
        q, right = [], []
        for dist, token in zip(draft_chain(pair.draft, prompt, answer), answer):
            q.append(float(dist.probs[0]))
            right.append(float(int(dist.ids[0]) == token))
        q, right = np.array(q), np.array(right)
        after = right[1:][right[:-1] == 1]
        chain = after.mean() if after.size else float("nan")
        print(
            f"{case.name}: n={len(q)} mean q {q.mean():.2f} right {right.mean():.2f} "
            f"r {right.sum() / q.sum():.2f} right-after-right {chain:.2f} ({after.size})"
        )
        print("   " + "".join("x" if x else "." for x in right))
        print("   " + "".join(str(min(int(v * 10), 9)) for v in q))
        all_q.append(q)
        all_right.append(right)
q, right = np.concatenate(all_q), np.concatenate(all_right)
for lo, hi in zip(bins[:-1], bins[1:]):
    m = (q >= lo) & (q < hi)
    if m.any():
        print(
            f"q in [{lo:.1f},{min(hi, 1):.1f}): n={m.sum():3d} mean q {q[m].mean():.2f} "
            f"right {right[m].mean():.2f} r {right[m].sum() / q[m].sum():.2f}"
        )
