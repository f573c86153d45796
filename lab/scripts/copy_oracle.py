"""The ceiling of copying on this machine: what a proposer that knows the answer could gain, priced with
the pair's cost profile (counts only, like ``modelled_speedup.py``), per prompt.

The target's greedy answer out[0 … N) is decoded once (plain decoding). A step at position i (out[:i]
written, out[i − 1] the root) verifies the root and k drafts out[i : i + k], and writes k + 1 tokens for
c_t(1 + k). The cheapest way through the answer is a shortest path over positions (dynamic programming):

    cost[i + k + 1] = min(cost[i + k + 1], cost[i] + c_t(1 + k)),   0 ≤ k ≤ K(i)

- ``copy``: K(i) = the longest k such that the root and out[i : i + k] occur together in the context
  (prompt + out[:i]): the most any copying proposer anchored on the last written token could draft;
- ``any``: K(i) = K — a drafter that is always right and free (the curve's own limit).

K (most drafts per step) is 32 unless given; 15 compares with the copy strategies' budget of 16.
Speedup = N · c_t(1) ÷ cost[N]. Compare with what a strategy's steps cost (``modelled_speedup.py``).

    python scripts/copy_oracle.py edit [max_tokens] [K]
"""

import statistics
import sys

from edgespec.decoding.chat import ChatSettings, Message, prompt_tokens
from edgespec.decoding.decoder import Request, generate
from edgespec.engine.pair import EngineSettings
from edgespec.measure.prompts import load_prompts
from edgespec.models.pairs import open_pair, resolve_pair
from edgespec.planner.ngram import common_prefix
from edgespec.profile.attach import attach
from edgespec.strategy import StrategyChoice, make_planner


def longest_copy(text: list[int], seen: int, at: int, most: int) -> int:
    """The longest k ≤ ``most`` with text[at − 1 : at + k] (the root, then k drafts) also in the context
    text[:seen] (the prompt and the answer before the root); 0 if the root never occurs there."""
    root, want = text[at - 1], text[at : at + most]
    return max(
        (common_prefix(text[start + 1 : seen], want) for start in range(seen) if text[start] == root),
        default=0,
    )


def cheapest(n_tokens: int, longest: list[int], price) -> float:
    """The least cost of writing n tokens when the step at i may draft up to longest[i] of them."""
    cost = [0.0] + [float("inf")] * n_tokens
    cost[1] = price(1)  # the first token: the prompt's decode, priced as a plain step
    for i in range(1, n_tokens):
        for k in range(longest[i] + 1):
            j = min(n_tokens, i + k + 1)
            cost[j] = min(cost[j], cost[i] + price(1 + k))
    return cost[n_tokens]


prompt_set = sys.argv[1]
max_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 128
most = int(sys.argv[3]) if len(sys.argv) > 3 else 32
resolved = resolve_pair()
rows = {"copy": [], "any": []}
with open_pair(resolved, EngineSettings(threads=2)) as pair:
    costs = attach(make_planner(StrategyChoice("ngram", {}), resolved.defaults), pair).costs

    def price(n: int) -> float:
        """Seconds to verify n tokens (root included)."""
        return float(costs.t(n))

    for case in load_prompts(prompt_set):
        messages = [Message(role, content) for role, content in case.messages]
        prompt, _ = prompt_tokens(pair, messages, ChatSettings(max_tokens=max_tokens))
        request = Request(prompt=prompt, max_tokens=max_tokens)
        out = [t for event in generate(pair, None, request) for t in event.token_ids]
        n = len(out)

        # at i, the most drafts a copy anchored on the root out[i − 1] could have right
        text = [*prompt, *out]
        copyable = [0] + [longest_copy(text, len(prompt) + i - 1, len(prompt) + i, most) for i in range(1, n)]
        plain = n * price(1)
        ratio_copy = plain / cheapest(n, copyable, price)
        ratio_any = plain / cheapest(n, [most] * n, price)
        rows["copy"].append(ratio_copy)
        rows["any"].append(ratio_any)
        print(f"{case.name}: {n} tokens, copy oracle {ratio_copy:.3f}, any-draft oracle {ratio_any:.3f}")
for kind, ratios in rows.items():
    print(
        f"{kind} oracle over {len(ratios)} prompts: median {statistics.median(ratios):.3f}, "
        f"mean {statistics.fmean(ratios):.3f}"
    )
