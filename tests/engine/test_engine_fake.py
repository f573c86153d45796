"""The speculative loop and the engine's tree batches / KV bookkeeping on a strict fake llama context.

The fake's logits are an exact function of what each token attends to, so speculation must
reproduce plain greedy decoding token for token: any masking or bookkeeping error shows up.
"""

from __future__ import annotations

import pytest

from edgespec.decoding.decoder import Request, generate
from edgespec.decoding.sampling import SamplingParams
from edgespec.planner.chain import ChainPlanner
from tests.support.fake_llama import FakePair
from tests.support.treeplanners import RandomTreePlanner

PROMPT = [5, 17, 3, 29, 8, 40, 12]


GREEDY = SamplingParams()


def _run(pair, planner, max_tokens=60, sampling=GREEDY, prompt=PROMPT):
    events = list(generate(pair, planner, Request(prompt=prompt, max_tokens=max_tokens, sampling=sampling)))
    return [t.id for e in events for t in e.tokens], events


def _plain(max_tokens=60, prompt=PROMPT):
    tokens, _ = _run(FakePair(), None, max_tokens, prompt=prompt)
    return tokens


def _echo_prompt() -> list[int]:
    """PROMPT, part of its answer, then PROMPT again: the fake model (its logits depend on the last
    three tokens and the length mod 5) then answers the same again, so copying pays — as it does when
    a real model rewrites code it was shown."""
    answer = _plain(40)
    shown = (-len(PROMPT)) % 5 + 30  # len(echo) ≡ len(PROMPT) (mod 5): the same answer follows
    return PROMPT + answer[:shown] + PROMPT


def _assert_cache_is_committed(runner):
    """Every cell is committed: positions 0..n-1, the committed tokens, tagged with ids 0 … w−1."""
    view = runner.ctx.committed_view()
    assert [pos for pos, _, _ in view] == list(range(len(runner.committed)))
    assert [tok for _, tok, _ in view] == runner.committed
    assert all(seqs == frozenset(runner.tagged_seqs) for _, _, seqs in view)


@pytest.mark.parametrize("gamma", [1, 2, 4, 8])
def test_chain_equals_plain_decoding(gamma):
    expected = _plain()
    pair = FakePair()
    tokens, events = _run(pair, ChainPlanner(gamma=gamma))
    assert tokens == expected
    assert sum(e.accepted for e in events) > 0  # the noisy draft does get tokens accepted
    assert all(e.verified_nodes == 1 + e.drafted for e in events if e.verified_nodes)


@pytest.mark.parametrize("seed", range(4))
def test_bushy_trees_equal_plain_decoding_and_keep_caches_committed(seed):
    expected = _plain()
    pair = FakePair(n_seq=33)
    tokens, events = _run(pair, RandomTreePlanner(budget=24, seed=seed))
    assert tokens == expected
    assert max(e.leaves for e in events) > 3
    # After the last step only committed cells remain, in both caches (the draft may lag the target
    # by the tokens it has not decoded yet).
    _assert_cache_is_committed(pair.target)
    _assert_cache_is_committed(pair.draft)
    assert pair.target.committed[: len(pair.draft.committed)] == pair.draft.committed


def test_sequence_ids_are_tagged_only_as_far_as_trees_use_them():
    """A chain uses one id in each cache, so its commits re-tag nothing; a tree tags the committed
    prefix with as many ids as its widest step used (leaves in the target, branches in the draft)."""
    pair = FakePair(n_seq=33)
    pair.target.ctx.seq_cp = pair.draft.ctx.seq_cp = _forbidden
    _run(pair, ChainPlanner(gamma=4), max_tokens=30)
    assert pair.target.tagged_seqs == pair.draft.tagged_seqs == (0,)
    _assert_cache_is_committed(pair.target)

    pair = FakePair(n_seq=33)
    _, events = _run(pair, RandomTreePlanner(budget=12, seed=1), max_tokens=40)
    assert len(pair.target.tagged_seqs) == max(e.leaves for e in events if e.verified_nodes) < 33
    assert 1 < len(pair.draft.tagged_seqs) < 33


def _forbidden(*args):
    raise AssertionError(f"seq_cp{args} in a chain")


def test_one_draft_decode_per_level():
    pair = FakePair()
    _, events = _run(pair, ChainPlanner(gamma=5), max_tokens=20)
    assert all(e.draft_decodes == e.depth for e in events if e.verified_nodes)


def test_second_turn_reuses_the_common_prefix():
    pair = FakePair()
    tokens, _ = _run(pair, ChainPlanner(gamma=3), max_tokens=10)
    decodes_before = pair.target.ctx.decodes
    follow_up = PROMPT + tokens + [9, 21]
    list(generate(pair, ChainPlanner(gamma=3), Request(prompt=follow_up, max_tokens=5)))
    prefill_batch = pair.target.ctx.batch_sizes[decodes_before]
    assert prefill_batch <= 3  # only the new tokens, not the whole conversation


def test_sampling_runs_and_is_reproducible():
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=7)
    first, _ = _run(FakePair(), ChainPlanner(gamma=4), 40, params)
    again, _ = _run(FakePair(), ChainPlanner(gamma=4), 40, params)
    assert first == again and len(first) == 40


def test_a_step_past_max_tokens_is_cut_even_when_it_ends_the_turn():
    from edgespec.decoding.decoder import _cut
    from edgespec.decoding.events import EmittedToken, Provenance
    from tests.support.fake_llama import EOS, FakeModel

    step = tuple(EmittedToken(t, Provenance.DRAFT, 1.0) for t in (5, 6, 7, 8, EOS))
    assert _cut(step, FakeModel(), 2) == (step[:2], "length")  # the end of turn lies past the budget
    assert _cut(step, FakeModel(), 4) == (step[:4], "stop")
    assert _cut(step, FakeModel(), 9) == (step[:4], "stop")


def test_no_tree_drafts_past_the_tokens_the_answer_has_left():
    """r tokens left: at most r − 1 drafts (and the target's own token) are worth verifying."""
    tokens, events = _run(FakePair(), ChainPlanner(gamma=8), max_tokens=11)
    assert tokens == _plain(11)
    left = 11
    for event in events:
        if event.verified_nodes:
            assert event.verified_nodes <= left  # root + drafts
        left -= len(event.tokens)
    assert [e.verified_nodes for e in events if e.verified_nodes][-1] < 9  # the last step was cut short


def test_max_tokens_and_cancel():
    import threading

    tokens, events = _run(FakePair(), ChainPlanner(gamma=4), max_tokens=7)
    assert len(tokens) == 7 and events[-1].finish_reason == "length"
    cancel = threading.Event()
    stream = generate(FakePair(), ChainPlanner(gamma=4), Request(prompt=PROMPT, max_tokens=50), cancel)
    next(stream)
    cancel.set()
    rest = list(stream)
    assert rest[-1].finish_reason == "cancelled" and not rest[-1].tokens


def test_steps_without_drafting_keep_both_caches_consistent():
    from tests.support.treeplanners import SometimesSilentPlanner

    pair = FakePair()
    tokens, events = _run(pair, SometimesSilentPlanner())
    assert tokens == _plain()
    assert any(e.drafted == 0 for e in events) and any(e.accepted for e in events)
    _assert_cache_is_committed(pair.target)
    _assert_cache_is_committed(pair.draft)


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=0.9, top_k=20, seed=11)])
def test_a_planner_that_drafts_nothing_is_plain_decoding(sampling):
    """Root-only trees take the decoder's plain path: the same tokens, margins and random draws as
    plain decoding, one target decode per token, the draft untouched until it has something to do."""
    from tests.support.treeplanners import SometimesSilentPlanner

    plain_tokens, plain_events = _run(FakePair(), None, 30, sampling)
    pair = FakePair()
    tokens, events = _run(pair, SometimesSilentPlanner(period=10**6), 30, sampling)  # never drafts
    assert tokens == plain_tokens
    margins = [t.margin for e in events for t in e.tokens]
    assert margins == [t.margin for e in plain_events for t in e.tokens]
    steps = [e for e in events if e.verified_nodes]
    assert all(e.verified_nodes == 1 and e.accepted_path == (0,) and e.leaves == 1 for e in steps)
    assert pair.target.ctx.decodes == len(tokens)  # the prompt (and the first token), then one per token
    assert pair.draft.ctx.decodes == 0  # not even the prompt: the draft reads it when it drafts
    assert len(pair.draft.pending) == len(PROMPT) + len(tokens)


STRATEGIES = ["chain", "tsd", "gsd", "opt-tree", "dyspec", "mcsd", "ngram", "hybrid"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_equals_plain_decoding_on_the_engine(strategy):
    from edgespec.planner.strategies import build as make_planner

    pair = FakePair(n_seq=33)
    echo = _echo_prompt()
    tokens, events = _run(pair, make_planner(strategy, {"budget": 16}), prompt=echo)
    assert tokens == _plain(prompt=echo)
    assert sum(e.accepted for e in events) > 0
    _assert_cache_is_committed(pair.target)
    _assert_cache_is_committed(pair.draft)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_samples_on_the_engine(strategy):
    from edgespec.planner.strategies import build as make_planner

    pair = FakePair(n_seq=33)
    params = SamplingParams(temperature=0.9, seed=0)
    tokens, events = _run(pair, make_planner(strategy, {"budget": 16}), 40, params, prompt=_echo_prompt())
    assert len(tokens) == 40 and sum(e.accepted for e in events) > 0
    _assert_cache_is_committed(pair.target)


def test_python_time_excludes_the_models_decodes(monkeypatch):
    """time_split.python = step wall time minus time inside llama_decode (here: a fake decode that
    spins 20 ms), so it stays far below the decode time however many decodes a step makes."""
    import time

    from tests.support.fake_llama import FakeContext

    check_batch = FakeContext._check_batch

    def slow_check(self, *args):  # runs inside FakeContext.decode's timed region, like a forward pass
        check_batch(self, *args)
        end = time.perf_counter() + 0.02
        while time.perf_counter() < end:
            pass

    monkeypatch.setattr(FakeContext, "_check_batch", slow_check)
    _, events = _run(FakePair(), ChainPlanner(gamma=3), max_tokens=12)
    for e in events[1:]:  # the first token's decode is the prompt's (prefill)
        decodes = 1 + e.draft_decodes  # the target's verify decode and the draft's levels
        assert 0 < e.timings.python < e.timings.total - 0.02 * decodes + 0.005


def test_ngram_copies_without_touching_the_draft():
    from edgespec.decoding.events import Provenance
    from edgespec.planner.strategies import build as make_planner

    pair = FakePair(n_seq=33)
    echo = _echo_prompt()
    tokens, events = _run(pair, make_planner("ngram"), prompt=echo)
    assert tokens == _plain(prompt=echo)
    copied = [t for e in events for t in e.tokens if t.provenance is Provenance.COPIED]
    assert len(copied) >= 10  # the answer shown in the prompt (13 tokens) comes back as copies
    assert all(e.draft_decodes == 0 for e in events)
    assert pair.draft.ctx.decodes == 0 and not pair.draft.committed  # never synced, never decoded
    _assert_cache_is_committed(pair.target)


def test_ngram_runs_on_a_pair_without_a_draft():
    from edgespec.planner.strategies import build as make_planner

    pair = FakePair(n_seq=33)
    pair.draft = None  # as ModelPair(target, None) leaves it
    echo = _echo_prompt()
    tokens, events = _run(pair, make_planner("ngram"), prompt=echo)
    assert tokens == _plain(prompt=echo) and sum(e.accepted for e in events) > 0


def test_hybrid_skips_the_draft_where_copies_cover_the_next_token():
    from edgespec.decoding.events import Provenance
    from edgespec.planner.strategies import build as make_planner

    pair = FakePair(n_seq=33)
    echo = _echo_prompt()
    tokens, events = _run(pair, make_planner("hybrid", {"mu": 0.3}), prompt=echo)
    assert tokens == _plain(prompt=echo)
    kinds = {t.provenance for e in events for t in e.tokens}
    assert Provenance.COPIED in kinds and Provenance.DRAFT in kinds  # both sources paid off
    assert any(e.draft_decodes == 0 and e.accepted > 2 for e in events)  # copies alone, no draft decode
    _assert_cache_is_committed(pair.target)
    _assert_cache_is_committed(pair.draft)
    assert pair.target.committed[: len(pair.draft.committed)] == pair.draft.committed


def test_the_draft_never_proposes_or_reads_past_its_own_vocabulary():
    """A target with a larger vocabulary (Qwen2.5 7B: 152,064 ids; its 0.5B draft: 151,936) sets the
    draft's vocab_limit: the compiled loops read vocab_limit logits per row, so it stays ≤ the draft's."""
    from edgespec.engine.draft import Draft

    pair = FakePair()
    wide = Draft(pair.draft.ctx, vocab_limit=pair.draft.ctx.n_vocab + 128)
    assert wide.vocab_limit == pair.draft.ctx.n_vocab
    assert Draft(pair.draft.ctx, vocab_limit=20).vocab_limit == 20
