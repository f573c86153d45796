"""The draft's look-ahead while a target on RPC servers verifies (``Draft.look_ahead``), on the strict
fake context: a remote fake target runs the decoder's ``meanwhile`` as the real RPC link would (the
fake answers "not done yet" a set number of times, so the look-ahead's length is deterministic).

Reused distributions are the draft's own for the same tokens, so the output must not change at all:
greedy answers equal plain decoding, sampled answers equal the same seed's without a look-ahead, token
for token, and after every reply both caches hold the conversation only.
"""

from __future__ import annotations

import pytest

from edgespec.decoding.decoder import Request, generate
from edgespec.decoding.sampling import SamplingParams
from edgespec.planner.chain import ChainPlanner
from edgespec.planner.strategies import build as make_planner
from tests.engine.test_engine_fake import STRATEGIES, _assert_cache_is_committed, _echo_prompt, _plain, _run
from tests.support.fake_llama import FakePair

POLLS = [(0,), (2,), (8,), (0, 5, 2, 9, 1)]  # "not done" answers per verify (cycled over the steps)


def _remote_pair(polls, **kwargs) -> FakePair:
    pair = FakePair(**kwargs)
    pair.target.ctx.remote = True
    pair.target.ctx.ahead_polls = polls
    return pair


@pytest.mark.parametrize("polls", POLLS)
@pytest.mark.parametrize("strategy", STRATEGIES + ["auto"])
def test_every_strategy_looking_ahead_equals_plain_decoding(strategy, polls):
    echo = _echo_prompt()
    pair = _remote_pair(polls, n_seq=33)
    options = {} if strategy == "auto" else {"budget": 16}
    tokens, _ = _run(pair, make_planner(strategy, options), prompt=echo)
    assert tokens == _plain(prompt=echo)
    _assert_cache_is_committed(pair.target)
    _assert_cache_is_committed(pair.draft)  # the last look-ahead's cells are gone with the reply


@pytest.mark.parametrize("planner", ["chain:2", "chain:4", "dyspec:8", "opt-tree:8"])
def test_the_look_ahead_saves_draft_decodes_when_the_target_takes_its_path(planner):
    """A draft close to the target (noise 0.3): the target often accepts the likeliest path and then
    writes the draft's guess, so the next step starts on nodes decoded during the verify."""
    name, budget = planner.split(":")
    make = (lambda: ChainPlanner(gamma=int(budget))) if name == "chain" else (
        lambda: make_planner(name, {"budget": int(budget)})
    )
    plain = _plain(max_tokens=80)
    runs = {}
    for polls in [(0,), (8,)]:
        pair = _remote_pair(polls, n_seq=33, draft_noise=0.3)
        tokens, events = _run(pair, make(), max_tokens=80)
        assert tokens == plain
        runs[polls] = events
    reused = sum(e.reused for e in runs[(8,)])
    assert sum(e.reused for e in runs[(0,)]) == 0  # done at once: nothing looked ahead
    assert reused >= 5
    # every reused node is a draft decode's worth of work (or more) the step did not wait for
    without = sum(e.draft_decodes for e in runs[(0,)])
    assert sum(e.draft_decodes for e in runs[(8,)]) < without


def test_a_step_after_a_rejection_starts_on_what_the_look_ahead_decoded():
    """When the target rejects a drafted token it often writes the draft's second guess there: the
    look-ahead decodes that too (best first, after the likeliest path), so a step after a rejection
    can also start on decoded nodes — and the answer still equals plain decoding. With the look-ahead
    limited to the likeliest path, no step after a rejection ever reused a node."""
    plain = _plain(max_tokens=80)
    pair = _remote_pair((12,), n_seq=33, draft_noise=0.6)
    tokens, events = _run(pair, ChainPlanner(gamma=3), max_tokens=80)
    assert tokens == plain
    after_rejection = [b for a, b in zip(events, events[1:]) if a.verified_nodes > 1 and a.accepted < a.depth]
    assert len(after_rejection) >= 5
    assert sum(e.reused > 0 for e in after_rejection) >= 2
    _assert_cache_is_committed(pair.draft)


@pytest.mark.parametrize("polls", [(0,), (8,)])
def test_the_first_tree_starts_on_what_the_draft_guessed_while_the_target_read_the_prompt(polls):
    """The prompt's decode over RPC overlaps the draft's: it reads the prompt, guesses the reply's
    first token and drafts below that guess, so when the guess is right the first tree is decoded
    already. A target done at once leaves nothing to reuse; the answers equal plain decoding."""
    plain = _plain(max_tokens=40)
    pair = _remote_pair(polls, n_seq=33, draft_noise=0.3)
    tokens, events = _run(pair, ChainPlanner(gamma=3), max_tokens=40)
    assert tokens == plain
    first_tree = events[1]  # events[0]: the first token, from the prompt's decode
    if polls == (0,):
        assert first_tree.reused == 0 and first_tree.draft_decodes > 0
    else:
        assert first_tree.reused > 0 and first_tree.draft_decodes == 0
    _assert_cache_is_committed(pair.draft)


@pytest.mark.parametrize("planner", ["chain:3", "dyspec:8", "opt-tree:8", "auto"])
def test_sampled_answers_do_not_change_when_the_draft_looks_ahead(planner):
    """The reused distributions are exactly the ones the draft would compute then (the fake's logits
    are exact), and the look-ahead draws nothing from the random stream: the same seed, the same
    answer."""
    name, _, budget = planner.partition(":")
    sampling = SamplingParams(temperature=0.9, top_k=20, seed=5)
    answers, reused = [], 0
    for remote in (False, True):
        pair = _remote_pair((8,) if remote else (0,), n_seq=33, draft_noise=0.3)
        pair.target.ctx.remote = remote
        options = {"budget": int(budget)} if budget else {}
        tokens, events = _run(pair, make_planner(name, options), max_tokens=60, sampling=sampling)
        answers.append(tokens)
        reused += sum(e.reused for e in events) if remote else 0
        _assert_cache_is_committed(pair.draft)
    assert answers[0] == answers[1]
    if name != "auto":  # auto may decode plainly on the fake's cost-free curve
        assert reused > 0


def test_a_next_request_starts_clean_after_a_look_ahead():
    """Two turns on one pair: the second keeps the first's common prefix (as the chat does) and still
    equals plain decoding; a look-ahead never leaks into the next prompt's cells."""
    pair = _remote_pair((8,), n_seq=33, draft_noise=0.3)
    planner = ChainPlanner(gamma=3)
    first, _ = _run(pair, planner, max_tokens=30)
    follow_up = [5, 17, 3, 29, 8, 40, 12] + first + [9, 21, 14]
    second = [t.id for e in generate(pair, planner, Request(follow_up, max_tokens=30)) for t in e.tokens]
    assert second == _plain(max_tokens=30, prompt=follow_up)
    _assert_cache_is_committed(pair.draft)


def test_auto_grows_for_free_along_what_the_look_ahead_decoded():
    """A target behind a slow link (``look_ahead``): when the draft decoded the likeliest path during
    the last verify (``Prepaid.drafted``), auto expands those nodes without paying a level for them — no
    drafting predicted — and so drafts deeper than it would pay to draft anew."""
    import dataclasses

    import numpy as np

    from edgespec.planner.auto import SPECULATE, AutoPlanner
    from edgespec.planner.costmodel import DraftFit
    from edgespec.planner.inputs import PlanContext, Prepaid
    from tests.engine.test_fit import SLOW_LINK
    from tests.support.fakes import SyntheticDrafter, sparse
    from tests.support.profiles import Given

    def plan(known_depth: int):
        planner = AutoPlanner()
        fit = DraftFit(np.array([0.8, 0.06, 0.03, 0.02]), ratio=1.0, tokens=64)
        planner.prepare(Given(dataclasses.replace(SLOW_LINK, look_ahead=True), fit))
        drafter = SyntheticDrafter(lambda path: sparse([0.8, 0.06, 0.03, 0.02], ids=[5 + len(path), 1, 2, 3]))
        likeliest = (7,) + tuple(5 + depth for depth in range(1, known_depth + 1))  # the draft's top-1 path
        known = {likeliest[:n] for n in range(1, len(likeliest) + 1)} if known_depth else set()
        prepaid = Prepaid(drafted=lambda path: tuple(path) in known)
        rng = np.random.default_rng(0)
        ctx = PlanContext(sampling=False, rng=rng, max_nodes=65, fresh=True, prepaid=prepaid)
        tree = planner.plan(7, drafter, ctx)
        assert planner.mode == SPECULATE
        return tree, planner.calibration.draft_predicted

    fresh, drafting = plan(0)
    ahead, free = plan(8)
    assert drafting > 0 and free == 0.0
    assert ahead.height > fresh.height
    deepest = max(ahead.leaves, key=lambda node: ahead.depths[node])  # along the decoded path
    path_tokens = [ahead.token_ids[n] for n in ahead.path(deepest)]
    assert path_tokens == [7] + [5 + depth for depth in range(1, ahead.height + 1)]


def test_auto_verifies_what_the_look_ahead_decoded_where_it_would_decode_plainly():
    """A fit that says plain decoding (r = 0.7 on a top-1 of 0.6: right 42 % of the time): with nothing
    decoded, auto decodes plainly; with the root and a confident path (q = 0.95: a chance of 0.67 per
    token) decoded by the look-ahead, it verifies that path — it costs no drafting, only a larger
    verify. (At r = 0.6 the chances 0.57, 0.32 make depth 2 a near-tie on these curves.)"""
    import dataclasses

    import numpy as np

    from edgespec.planner.auto import PLAIN, SPECULATE, AutoPlanner
    from edgespec.planner.costmodel import DraftFit
    from edgespec.planner.inputs import PlanContext, Prepaid
    from tests.engine.test_fit import SLOW_LINK
    from tests.support.fakes import SyntheticDrafter, sparse
    from tests.support.profiles import Given

    def plan(known_depth: int):
        planner = AutoPlanner()
        fit = DraftFit(np.array([0.6, 0.1, 0.05, 0.03]), ratio=0.7, tokens=64)
        planner.prepare(Given(dataclasses.replace(SLOW_LINK, look_ahead=True), fit))
        confident = sparse([0.95, 0.02, 0.01, 0.01], ids=[0, 1, 2, 3])
        drafter = SyntheticDrafter(lambda path: sparse(confident.probs, ids=[5 + len(path), 1, 2, 3]))
        likeliest = (7,) + tuple(5 + depth for depth in range(1, known_depth + 1))
        known = {likeliest[:n] for n in range(1, known_depth + 2)} if known_depth else set()
        prepaid = Prepaid(drafted=lambda path: tuple(path) in known)
        rng = np.random.default_rng(0)
        ctx = PlanContext(sampling=False, rng=rng, max_nodes=65, fresh=True, prepaid=prepaid)
        tree = planner.plan(7, drafter, ctx)
        return planner.mode, tree

    assert plan(0)[0] == PLAIN
    mode, tree = plan(4)
    assert mode == SPECULATE and tree.height >= 2


@pytest.mark.parametrize("planner", ["dyspec:8", "opt-tree:8", "opt-tree:16"])
def test_a_level_may_list_the_look_aheads_node_last(planner, monkeypatch):
    """Planners name a level's nodes in their own order; the node the last look-ahead decoded is reused
    wherever it stands. Listed last, behind nodes decoded anew, it once had its sequence overwritten by
    theirs (the next commit then kept the wrong branch: a broken cache on this strict fake)."""
    from edgespec.engine.draft import Draft

    expand = Draft.expand

    def reversed_levels(self, tree, nodes):
        return expand(self, tree, list(nodes)[::-1])[::-1]

    monkeypatch.setattr(Draft, "expand", reversed_levels)
    name, budget = planner.split(":")
    plain = _plain(max_tokens=80)
    for polls in [(8,), (0, 5, 2, 9, 1)]:
        pair = _remote_pair(polls, n_seq=33, draft_noise=0.1)
        tokens, events = _run(pair, make_planner(name, {"budget": int(budget)}), max_tokens=80)
        assert tokens == plain
        _assert_cache_is_committed(pair.draft)
        assert sum(e.reused for e in events) > 0


@pytest.mark.parametrize("every", [0, 2, 3])
def test_steps_that_draft_nothing_catch_the_draft_up_and_guess_meanwhile(every):
    """auto's plain and copy steps draft nothing; over RPC the draft catches up on the conversation
    while the target decodes, guesses the next token (the step's ``guess``: auto learns r from it)
    and looks ahead from there — so a drafting step after them starts on decoded nodes. Root-only
    trees, a chain of 3 every ``every``-th step: the answer is plain decoding's, the caches committed."""
    from dataclasses import dataclass

    from edgespec.planner.base import Planner
    from edgespec.planner.tree import TreeBuilder

    @dataclass
    class Alternating(Planner):
        steps: int = 0
        name = "alternating"

        def describe(self) -> str:
            return f"a chain every {every} steps"

        def plan(self, root_token, drafter, ctx):
            self.steps += 1
            if every and self.steps % every == 0:
                return ChainPlanner(gamma=3).plan(root_token, drafter, ctx)
            return TreeBuilder(root_token).freeze()

    plain = _plain(max_tokens=80)
    for polls in [(8,), (0, 5, 2, 9, 1)]:
        pair = _remote_pair(polls, n_seq=33, draft_noise=0.1)
        tokens, events = _run(pair, Alternating(), max_tokens=80)
        assert tokens == plain
        _assert_cache_is_committed(pair.draft)
        nothing = [e for e in events[1:] if e.drafted == 0]
        guessed = [e for e in nothing if e.guess is not None]
        assert len(guessed) >= len(nothing) // 2
        right = sum(int(e.guess.ids[0]) == e.tokens[0].id for e in guessed if e.tokens)
        assert right >= len(guessed) // 2  # a close draft (noise 0.1) guesses right most of the time
        if every and polls == (8,):
            assert sum(e.reused for e in events if e.drafted) > 0


def test_auto_looks_ahead_only_where_a_tree_drafted_for_free_would_pay():
    """Over RPC the look-ahead's draft decodes share this machine's cores with the target's own share
    (on a 2-core EPYC at 0 ms added delay they slowed plain verifies from 66 to 73 ms): auto keeps it
    for where a tree whose drafting cost nothing would beat plain decoding. The same curve — a
    2-token verify costs 1.6 plain decodes, so a long accepted chain could pay (auto may draft) — with
    a poor draft (top-1 0.5, r 0.6: no tree pays even drafted for free) and a good one."""
    import dataclasses

    import numpy as np

    from edgespec.planner.auto import AutoPlanner
    from edgespec.planner.costmodel import CostModel, DraftFit
    from tests.support.profiles import Given

    curve = CostModel.from_functions(lambda n: 0.065 * (1 + 0.6 * (n - 1)), lambda n: 0.01 * n)
    for top1, ratio, looks in ((0.5, 0.6, False), (0.9, 1.0, True)):
        planner = AutoPlanner()
        fit = DraftFit(np.array([top1, 0.1, 0.05, 0.03]), ratio=ratio, tokens=64)
        planner.prepare(Given(dataclasses.replace(curve, look_ahead=True), fit))
        planner.policy.decide(1, planner.budget)  # step 1 of the policy: could a tree ever pay?
        assert planner.may_draft
        assert planner.may_look_ahead is looks


@pytest.mark.parametrize("known", [False, True])
def test_a_level_the_look_ahead_decoded_is_not_counted_as_drafting(known, monkeypatch):
    """Drafting auto predicts (and so learns its drafting factor against) counts only the nodes the draft
    must decode: a level of nodes the look-ahead decoded costs nothing, even where the growth chose it
    by its forecast rather than as free. (Counted, each such step taught auto that drafting costs ~0
    and the factor sank to 0.25: its next trees drafted 5.7 levels a step at 20 ms.)"""
    import numpy as np

    from edgespec.planner.auto import trees as auto_trees
    from edgespec.planner.auto.acceptance import Acceptance
    from edgespec.planner.growth import Growth
    from tests.engine.test_fit import SLOW_LINK

    growth = Growth.from_root(7)
    policy = auto_trees.AutoGrowth(
        SLOW_LINK, Acceptance(), np.array([0.8, 0.1, 0.05, 0.02]), cap=16, max_depth=10, spent=0.0,
        known=lambda path: known,
    )  # fmt: skip
    growth.levels.append(1)
    growth.expanded[0] = None
    policy.admit(growth, [0], [auto_trees.SparseDist(ids=np.array([5, 6]), probs=np.array([0.8, 0.1]))])
    monkeypatch.setattr(auto_trees.AutoGrowth, "_free", lambda *args: False)  # not taken as free …
    monkeypatch.setattr(auto_trees, "deepen", lambda *args: (1, None))  # … but worth a level
    assert len(policy.next_level(growth)) == 1
    assert policy.spent == (0.0 if known else pytest.approx(float(SLOW_LINK.d(1))))
