"""The prompt cache without a model: engine/kv_cache.PromptCache on a fake context whose "state" is the
token list it holds, and the prompt-token arithmetic the server reports (timings.prompt_n, cache_n)."""

from __future__ import annotations

from edgespec.decoding.events import GenerationStats, StepEvent, StepTimings
from edgespec.engine.kv_cache import PromptCache
from edgespec.engine.runners import CachedModel, common_prefix
from edgespec.server import protocol

BYTES_PER_TOKEN = 100


class FakeContext:
    """Cells are (position, token); a state is the tuple of tokens of sequence 0."""

    def __init__(self, owner: FakeRunner):
        self.owner = owner
        self.cells: list[int] = []
        self.decoded = 0  # tokens decoded into this context (what a prompt cache saves)

    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> None:
        del self.cells[p0:]

    def clear(self) -> None:
        self.cells = []

    def seq_state(self, seq: int) -> FakeState:
        return FakeState(tuple(self.cells))

    def set_seq_state(self, state: FakeState, seq: int) -> bool:
        self.cells = list(state.tokens)
        return True


class FakeState:
    def __init__(self, tokens: tuple[int, ...]):
        self.tokens = tokens

    def __len__(self) -> int:  # its size in bytes
        return BYTES_PER_TOKEN * len(self.tokens)


class FakeRunner(CachedModel):
    def __init__(self):
        self.ctx = FakeContext(self)
        self.committed: list[int] = []
        self.tagged_seqs = (0,)

    def decode_committed(self, tokens, want_last):
        self.ctx.cells += list(tokens)
        self.ctx.decoded += len(tokens)
        self.committed += list(tokens)


class FakePair:
    def __init__(self):
        self.target, self.draft = FakeRunner(), FakeRunner()
        self.draft_adapter = None

    def forget(self) -> None:
        for runner in (self.target, self.draft):
            CachedModel.sync(runner, [])


def answer(pair: FakePair, cache: PromptCache, prompt: list[int], reply: list[int], scope=()) -> int:
    """What the engine does for one request: prepare, sync both models, decode the reply; returns the
    tokens decoded for the prompt."""
    cache.prepare(prompt, scope)
    before = pair.target.ctx.decoded
    pair.target.sync(prompt)
    pair.draft.sync(prompt)
    decoded = pair.target.ctx.decoded - before
    pair.target.decode_committed(reply, False)
    pair.draft.decode_committed(reply[:-1], False)  # the draft lags a token
    return decoded


def conversation(seed: int, turns: int) -> list[list[int]]:
    """Prompts of a conversation: each the last one plus the reply (20 tokens) and a new message."""
    prompts, prompt = [], [1, 2, 3]  # a shared "system prompt"
    for turn in range(turns):
        prompt = prompt + [1000 * seed + 10 * turn + i for i in range(5)]
        prompts.append(prompt)
        prompt = prompt + reply(seed, turn)
    return prompts


def reply(seed: int, turn: int) -> list[int]:
    return [500_000 + 1000 * seed + 100 * turn + i for i in range(20)]


def test_alternating_conversations_are_put_back():
    pair = FakePair()
    cache = PromptCache(pair, budget=10**9)
    a, b = conversation(1, 4), conversation(2, 4)
    decoded = []
    for turn in range(4):
        for seed, prompts in ((1, a), (2, b)):
            decoded.append(answer(pair, cache, prompts[turn], reply(seed, turn)))
    assert decoded[:2] == [8, 5]  # first turns: all of A, B less the shared system prompt
    assert decoded[2:] == [5] * 6  # later turns: only the new message, for both
    assert cache.restores == 6 and len(cache) == 1  # the other conversation waits in host memory
    assert pair.draft.committed == pair.target.committed[:-1]  # the draft came back with the target


def test_budget_keeps_the_most_recent_and_drops_prefixes():
    pair = FakePair()
    cache = PromptCache(pair, budget=3 * 55 * BYTES_PER_TOKEN)  # 3 conversations of 28 + 27 tokens
    for seed in range(1, 8):  # seven conversations, one turn each
        answer(pair, cache, conversation(seed, 1)[0], reply(seed, 0))
        assert cache.size <= cache.budget
    kept = sorted(c.target.tokens[3] // 1000 for c in cache._saved.values())
    assert kept == [4, 5, 6]  # the least recently used went first; 7 is the live one
    # a conversation that goes on is saved once: the save it came back from is not kept besides
    pair = FakePair()
    cache = PromptCache(pair, budget=10**9)
    a = conversation(1, 3)
    answer(pair, cache, a[0], reply(1, 0))
    answer(pair, cache, conversation(2, 1)[0], reply(2, 0))  # A is saved
    answer(pair, cache, a[1], reply(1, 1))  # A comes back, B is saved
    answer(pair, cache, conversation(3, 1)[0], reply(3, 0))  # the longer A is saved
    starts = sorted(c.target.tokens[3] // 1000 for c in cache._saved.values())
    assert starts == [1, 2]


def test_a_budget_of_one_conversation_still_alternates_two():
    pair = FakePair()
    cache = PromptCache(pair, budget=200 * BYTES_PER_TOKEN)  # one conversation of both models, not two
    a, b = conversation(1, 3), conversation(2, 3)
    decoded = []
    for turn in range(3):
        decoded.append(answer(pair, cache, a[turn], reply(1, turn)))
        decoded.append(answer(pair, cache, b[turn], reply(2, turn)))
        assert len(cache) == 1 and cache.size <= cache.budget
    assert decoded == [8, 5, 5, 5, 5, 5]


def test_no_budget_keeps_only_the_live_conversation():
    pair = FakePair()
    cache = PromptCache(pair, budget=0)
    a, b = conversation(1, 2), conversation(2, 2)
    assert answer(pair, cache, a[0], reply(1, 0)) == 8
    assert answer(pair, cache, a[1], reply(1, 1)) == 5  # the contexts keep the prefix themselves
    assert answer(pair, cache, b[0], reply(2, 0)) == 5
    assert answer(pair, cache, a[1], reply(1, 1)) == len(a[1]) - 3  # evicted: decoded again
    assert len(cache) == 0 and cache.saves == 0


def test_a_small_loss_is_not_saved_and_other_draft_weights_are_not_restored():
    pair = FakePair()
    cache = PromptCache(pair, budget=10**9, min_save=32)
    prompt = conversation(1, 1)[0]
    answer(pair, cache, prompt, reply(1, 0))
    answer(pair, cache, prompt, reply(1, 0))  # the same request again: it throws away only the reply
    assert cache.saves == 0
    answer(pair, cache, conversation(2, 1)[0], [7] * 40)
    answer(pair, cache, conversation(3, 1)[0], [8] * 40)  # conversation 2 saved
    pair.draft_adapter = object()  # the draft now has other weights: its saved cells are useless
    answer(pair, cache, conversation(2, 1)[0] + [7] * 40 + [9], [1])
    assert cache.restores == 0


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([1, 2], [1, 2]) == 2


def test_timings_count_only_decoded_prompt_tokens():
    stats = GenerationStats(prompt_tokens=120)
    stats.add(StepEvent((), "", 0, 0, StepTimings(verify=0.1), prefill_seconds=0.5, cached_tokens=100))
    timings, usage = protocol.timings(stats, "chain"), protocol.usage(stats)
    assert timings["prompt_n"] == 20 and timings["cache_n"] == 100
    assert timings["prompt_per_second"] == 40.0
    assert usage["prompt_tokens"] == 120 and usage["prompt_tokens_details"] == {"cached_tokens": 100}


def test_scopes_never_reuse_each_others_cells():
    """A prompt of another scope (API key, client cache key) decodes in full whatever the caches hold,
    live or saved, and each scope still reuses its own conversations."""
    pair = FakePair()
    cache = PromptCache(pair, budget=10**9)
    secret = conversation(1, 1)[0]
    answer(pair, cache, secret, [7] * 20, scope=("a",))
    assert answer(pair, cache, secret, [5] * 20, scope=("b",)) == len(secret)  # the same text: none reused
    assert pair.target.ctx.cells[: len(secret)] == secret  # (decoded again, by b)
    assert answer(pair, cache, secret + [7] * 20 + [9], [1], scope=("a",)) == 1  # a's saved one is back
    assert answer(pair, cache, secret + [5] * 5 + [6], [1], scope=("b",)) == 1  # b's own, from its save
    no_budget = PromptCache(FakePair(), budget=0)
    answer(no_budget.pair, no_budget, secret, [7] * 20, scope=("a",))
    assert answer(no_budget.pair, no_budget, secret, [5], scope=("b",)) == len(secret)
