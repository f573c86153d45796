"""`auto` on synthetic cost curves: plain decoding where batching is not free, trees sized by the
curve where it is, probes that stay within their budget, and the loop on the fake engine."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.decoding.decoder import Request, generate
from edgespec.decoding.events import EmittedToken, Provenance, StepEvent, StepTimings
from edgespec.decoding.sampling import SamplingParams
from edgespec.planner.auto import COPY, PARALLEL, PLAIN, PROBE, SPECULATE, AutoPlanner
from edgespec.planner.auto.guard import Guard
from edgespec.planner.costmodel import CostModel, best_size, ceiling, simulate
from edgespec.planner.inputs import PlanContext, Prepaid
from edgespec.planner.strategies import PARAM_NAMES
from edgespec.planner.strategies import build as make_planner
from edgespec.planner.tree import ChildRule, DraftTree
from tests.support.fake_llama import FakePair
from tests.support.fakes import SyntheticDrafter, sparse

C1 = 0.057  # seconds: the bundled target's single-token decode on the 2-core CPU
# Compute-bound (this CPU): a batch of n costs n single decodes, for both models.
CPU = CostModel.from_functions(lambda n: C1 * n, lambda n: 0.029 * n)


def _verified(tree: DraftTree, accepted: int, draft_seconds: float, verify_seconds: float) -> StepEvent:
    """What the loop reports after verifying ``tree`` with ``accepted`` draft tokens taken (down its
    likeliest children)."""
    path = [0]
    for _ in range(accepted):
        path.append(max(tree.children(path[-1]), key=lambda u: tree.draft_probs[u]))
    return StepEvent(
        tokens=(EmittedToken(1, Provenance.TARGET, 1.0),) * (accepted + 1),
        text="",
        drafted=tree.size - 1,
        accepted=accepted,
        timings=StepTimings(draft=draft_seconds, verify=verify_seconds),
        tree=tree,
        verified_nodes=tree.size,
        draft_decodes=tree.stats.draft_decodes,
        expected_accept=tree.stats.expected_accept,
        accepted_path=tuple(path),
    )


def memory_bound(jump: float = 2.5, draft: float = 0.002) -> CostModel:
    """CUDA-like: verifying up to 8 tokens costs one decode; 9 and more jump (MMVQ → MMQ)."""
    return CostModel.from_functions(
        lambda n: 0.010 if n <= 8 else 0.010 * jump + 0.0002 * (n - 9), lambda n: draft * (1 + 0.02 * n)
    )


def ctx(sampling: bool = False, max_nodes: int = 65, fresh: bool = True, warm=frozenset()) -> PlanContext:
    """``fresh``: each step is a new answer's first (False: the steps of one long answer); ``warm``:
    the batch sizes the target has decoded before."""
    return PlanContext(
        sampling=sampling,
        rng=np.random.default_rng(0),
        max_nodes=max_nodes,
        fresh=fresh,
        prepaid=Prepaid(sizes=warm),
    )


def confident(q: float = 0.9, width: int = 6) -> SyntheticDrafter:
    """Every node: the top token has probability q, the rest share what is left."""

    def dist(path):
        rest = (1 - q) / (width - 1) * np.linspace(1.5, 0.5, width - 1)
        ids = [(sum(path) * 31 + 7 * i + len(path)) % 1000 for i in range(width)]
        return sparse([q, *rest], ids=ids)

    return SyntheticDrafter(dist)


def check_tree(tree: DraftTree, drafter: SyntheticDrafter) -> None:
    for i in range(1, tree.size):
        assert 0 <= tree.parents[i] < i and tree.depth[i] == tree.depth[tree.parents[i]] + 1
    for node in range(tree.size):
        children = tree.children(node)
        if children:
            assert tree.child_rule[node] == ChildRule.TOP and node in tree.dists
            q = [tree.draft_prob[c] for c in children]
            assert q == sorted(q, reverse=True), "children in the order the one-hot rule tries them"
            assert len({int(tree.tokens[c]) for c in children}) == len(children)
        else:
            assert tree.child_rule[node] == ChildRule.NONE
    # Every node the draft evaluated is in the final tree (auto keeps them all), found by token path:
    # the tree is renumbered from the growth's work tree, as OPT-Tree's is.
    assert set(drafter.expanded_paths) <= {tuple(tree.path_tokens(i)) for i in range(tree.size)}
    assert tree.stats.expected_accept == pytest.approx(float(tree.path_prob[1:].sum()))
    assert tree.stats.draft_decodes == drafter.decodes


# -- the decision ---------------------------------------------------------------------------------------
def test_compute_bound_never_drafts_even_with_a_perfect_draft():
    assert ceiling(CPU, 64) < 1 / C1  # no tree could beat plain decoding here
    planner = AutoPlanner(costs=CPU)
    drafter = confident(q=0.999)
    for _ in range(50):
        tree = planner.plan(7, drafter, ctx())
        assert tree.size == 1
    assert drafter.decodes == 0  # not even probes: nothing to learn when nothing could pay
    assert planner.steps == {PLAIN: 50, SPECULATE: 0, PROBE: 0, COPY: 0, PARALLEL: 0}


def test_cheap_small_batches_allow_only_tiny_trees():
    # A CPU where 2–3 tokens cost little more than one (the rest linear): at most a couple of nodes.
    costs = CostModel.from_functions(
        lambda n: C1 * (1 + 0.15 * (n - 1) if n <= 3 else n - 1.7), lambda n: 0.004 * n
    )
    planner = AutoPlanner(costs=costs)
    drafter = confident(q=0.95)
    sizes = [planner.plan(7, drafter, ctx()).size for _ in range(10)]
    assert max(sizes) <= 3


def test_memory_bound_builds_trees_that_stop_before_the_jump():
    planner = AutoPlanner(costs=memory_bound(jump=2.5))
    sizes = []
    for _ in range(10):
        drafter = confident(q=0.8)
        tree = planner.plan(7, drafter, ctx())
        check_tree(tree, drafter)
        sizes.append(tree.size)
    assert min(sizes) >= 5  # it speculates, with real trees
    assert max(sizes) <= 8  # never 9–16 nodes: verifying them would cost 2.5 decodes


def test_memory_bound_crosses_the_jump_when_the_expected_length_pays():
    # A small jump and a draft that is almost always right: a long chain pays for the 9th+ token.
    planner = AutoPlanner(costs=memory_bound(jump=1.05, draft=0.0005))
    drafter = confident(q=0.99)
    tree = planner.plan(7, drafter, ctx())
    check_tree(tree, drafter)
    assert tree.size > 9


def test_best_size_respects_a_jump_unless_the_pool_pays():
    costs = memory_bound(jump=2.5)
    pool = np.full(20, 0.5)  # many candidates, each worth half a token
    choice = best_size(0.0, 0, pool, 0.002, 1.0, costs, cap=32)
    assert choice.m == 7  # tree size 8: the last one before the jump
    rich = np.full(20, 0.99)
    assert best_size(0.0, 0, rich, 0.002, 1.0, memory_bound(jump=1.2), cap=32).m > 8


def test_poor_acceptance_turns_auto_off_then_probes_within_budget():
    costs = memory_bound(jump=2.5, draft=0.004)
    planner = AutoPlanner(costs=costs, probe_budget=0.02)
    drafter = confident(q=0.9)
    lost, total, modes = 0.0, 0.0, []
    plain_step = float(costs.t(1))
    for _ in range(3000):
        tree = planner.plan(7, drafter, ctx(fresh=False))
        modes.append(planner.mode)
        drafting = 0.004 * tree.stats.draft_decodes  # as profiled: the cost factors stay near 1
        verify = float(costs.t(tree.size))
        seconds = drafting + verify
        planner.observe(_verified(tree, 0, drafting, verify))  # every draft token rejected: one token
        total += seconds
        lost += seconds - plain_step
    assert planner.acceptance.chance(0.9) < 0.25  # it learned that the draft is wrong
    assert modes[0] == SPECULATE  # a good-looking draft is tried first
    tail = modes[200:]
    assert tail.count(PLAIN) > 0.95 * len(tail)
    assert tail.count(PROBE) > 0  # but it keeps checking
    assert lost / total < 0.02 + 0.01  # what probes and the first tries cost stays near the budget


def test_a_profile_that_flatters_batches_is_corrected_by_measurements():
    # The profile says "memory-bound" (e.g. measured while the machine was busy), but every verify
    # really costs n plain decodes: auto stops drafting after one step (the guard), learns the batches'
    # cost from the next tree of that size (a size's first verify is no evidence: it may pay one-off
    # work) and then decodes plainly, but for probes within their budget.
    costs = memory_bound(jump=2.5, draft=0.001)
    planner = AutoPlanner(costs=costs)
    c1 = float(costs.t(1))
    modes, lost, total, decoded = [], 0.0, 0.0, {1}
    for _ in range(400):
        tree = planner.plan(7, confident(q=0.8), ctx(fresh=False, warm=decoded))
        modes.append(planner.mode)
        verify = c1 * tree.size  # compute-bound reality
        drafting = 0.001 * tree.stats.draft_decodes
        accepted = min(tree.size - 1, 2)
        planner.observe(_verified(tree, accepted, drafting, verify))
        decoded.add(tree.size)
        if len(modes) > 1:
            total += verify + drafting
            lost += verify + drafting - (accepted + 1) * c1
    assert modes[0] == SPECULATE and planner.calibration.batch_factor > 2.5
    checks = modes[1:].count(SPECULATE) + modes.count(PROBE)  # the retry that measures, and probes
    assert modes[1:].count(SPECULATE) <= 1 and 0 < checks <= 4
    assert lost / total <= 2 * planner.probe_budget


def test_no_cost_profile_means_plain_decoding():
    planner = make_planner("auto", {"budget": "8", "probe-budget": "0.05"})
    assert (planner.budget, planner.probe_budget) == (8, 0.05)
    assert "plain" in planner.describe()
    drafter = confident()
    assert planner.plan(3, drafter, ctx()).size == 1 and drafter.decodes == 0
    assert "probe_budget" in PARAM_NAMES


def test_describe_says_what_auto_is_doing_now():
    """The chat's status bar shows describe(): no profile, can never pay, plain, speculating N."""
    assert AutoPlanner().describe() == "no cost profile yet: plain decoding"
    cpu = AutoPlanner(budget=8, costs=CPU)
    cpu.plan(3, confident(), ctx())
    assert cpu.describe() == "plain: speculation cannot pay on this machine"
    gpu = AutoPlanner(budget=8, costs=memory_bound(jump=1.05, draft=0.0005))
    assert gpu.describe().startswith("budget≤8")  # nothing decided yet
    tree = gpu.plan(3, confident(), ctx())
    assert gpu.mode == SPECULATE and gpu.describe().startswith(f"speculating {tree.size - 1} tokens")
    assert "speculated 100%, copied 0% of steps" in gpu.describe()


@pytest.mark.parametrize("sampling", [False, True])
@pytest.mark.parametrize("budget,max_nodes", [(32, 65), (5, 65), (32, 6)])
def test_trees_are_valid_and_within_caps(sampling, budget, max_nodes):
    planner = AutoPlanner(budget=budget, costs=memory_bound(jump=1.05, draft=0.0005), max_depth=4)
    drafter = SyntheticDrafter.random(vocab=40, top_k=8, seed=budget, sharpness=4.0)
    tree = planner.plan(7, drafter, ctx(sampling, max_nodes))
    check_tree(tree, drafter)
    assert 1 < tree.size <= min(budget + 1, max_nodes)
    assert tree.depth.max() <= 4


def test_simulated_forecast_grows_with_the_draft_quality():
    costs = memory_bound()
    weak = simulate(float(costs.k(1)), 1.0, costs, 32, np.array([0.3, 0.2, 0.1, 0.05]), 10)
    strong = simulate(float(costs.k(1)), 1.0, costs, 32, np.array([0.9, 0.05, 0.02, 0.01]), 10)
    assert strong.rate > weak.rate and strong.expected > weak.expected
    assert strong.m <= 7 and weak.m <= 7


def test_pending_catch_up_counts_against_speculating():
    # The draft must first decode many tokens it skipped (cheap target batches): a catch-up of 50 ms a
    # token costs more than a speculative step gains, however long the answer is taken to run; one of
    # 4 ms a token is paid back (over as many steps as the plain stretch: ``catch_up_share``).
    def costs(per_token: float) -> CostModel:
        return CostModel.from_functions(
            lambda n: 0.010 if n <= 8 else 0.03, lambda n: 0.0015, lambda n: 0.004 + per_token * (n - 1)
        )

    dear = AutoPlanner(costs=costs(0.05))
    assert dear.policy.decide(pending=1, cap=32) == SPECULATE
    assert dear.policy.decide(pending=200, cap=32) == PLAIN
    cheap = AutoPlanner(costs=costs(0.004))
    assert cheap.policy.decide(pending=200, cap=32) == SPECULATE
    rates = []
    for pending in (1, 8, 200):
        cheap.policy.decide(pending=pending, cap=32)
        rates.append(cheap.policy.forecast_rate)
    assert rates[0] > rates[1] > rates[2]  # still charged, a share of it per step


# -- on the fake engine ---------------------------------------------------------------------------------
PROMPT = [5, 17, 3, 29, 8, 40, 12]


GREEDY = SamplingParams()


def _tokens(pair, planner, n=40, sampling=GREEDY):
    events = list(generate(pair, planner, Request(prompt=PROMPT, max_tokens=n, sampling=sampling)))
    return [t.id for e in events for t in e.tokens], events


def test_auto_on_the_engine_equals_plain_decoding_and_learns():
    plain, _ = _tokens(FakePair(), None)
    planner = AutoPlanner(costs=memory_bound(jump=2.5, draft=0.001))
    pair = FakePair(n_seq=33)
    tokens, events = _tokens(pair, planner)
    assert tokens == plain
    assert events[0].draft_decodes == 0  # the first token comes with the prompt's decode
    assert sum(planner.steps.values()) == len(events) - 1
    assert planner.steps[SPECULATE] > 0 and any(e.accepted for e in events)
    assert planner.acceptance.step > 0 and planner.acceptance.b != 0.0  # observe() saw the steps


def test_auto_on_a_cpu_profile_never_touches_the_draft():
    plain, _ = _tokens(FakePair(), None)
    pair = FakePair()
    decodes_before = pair.draft.ctx.decodes
    tokens, events = _tokens(pair, AutoPlanner(costs=CPU))
    assert tokens == plain
    assert all(e.drafted == 0 and e.draft_decodes == 0 for e in events)
    assert pair.draft.ctx.decodes == decodes_before  # not even the prompt
    assert len(pair.draft.pending) == len(PROMPT) + len(plain)  # the draft would catch up in one batch later


def test_auto_samples_on_the_engine():
    pair = FakePair(n_seq=33)
    planner = AutoPlanner(costs=memory_bound(jump=2.5, draft=0.001))
    tokens, events = _tokens(pair, planner, 30, SamplingParams(temperature=0.8, seed=5))
    assert len(tokens) == 30 and planner.steps[SPECULATE] > 0


# -- one-pass trees (ParallelSpec) ------------------------------------------------------------------
def one_pass_costs() -> CostModel:
    """A GPU-like pair whose draft is slow per level but cheap per pass: verifying ≤ 16 tokens costs one
    decode, a draft level 0.6 of it, one catch-up pass over a few tokens 0.7 of it."""
    return CostModel.from_functions(
        lambda n: 0.010 if n <= 16 else 0.010 + 0.001 * (n - 16),
        lambda n: 0.006,
        lambda n: 0.007 + 0.0001 * n,
    )


def test_auto_drafts_one_pass_trees_where_they_pay_and_learns_from_them():
    planner = AutoPlanner(costs=one_pass_costs(), masks=4)
    assert planner.draft_setup().masks == 4
    modes = []
    for _ in range(12):
        drafter = confident(q=0.8)
        tree = planner.plan(7, drafter, ctx())
        modes.append(planner.mode)
        if planner.mode == PARALLEL:
            assert drafter.decodes == 1 and tree.stats.draft_decodes == 1  # one pass, whatever the size
            assert tree.size > 2 and int(tree.depth.max()) <= 5  # at most K + 1 deep
            planner.observe(_verified(tree, 3, 0.007, 0.010))
    assert modes.count(PARALLEL) >= 10
    assert planner.calibration.par_size > 2  # it learned the sizes it chose
    assert "one-pass tree" in planner.describe()
    # without masks the same pair drafts level by level; on a compute-bound CPU, never at all
    plain_auto = AutoPlanner(costs=one_pass_costs())
    plain_auto.plan(7, confident(q=0.8), ctx())
    assert plain_auto.mode != PARALLEL and plain_auto.draft_setup().masks == 0
    cpu = AutoPlanner(costs=CPU, masks=4)
    for _ in range(5):
        cpu.plan(7, confident(q=0.99), ctx())
    assert cpu.steps[PARALLEL] == 0 and cpu.steps[PLAIN] == 5


def test_one_pass_forecast_follows_what_the_masks_deliver():
    planner = AutoPlanner(costs=one_pass_costs(), masks=4)
    tree = planner.plan(7, confident(q=0.8), ctx())
    assert planner.mode == PARALLEL
    for _ in range(60):  # the masks' trees are never accepted: the forecast must give them up
        planner.observe(_verified(tree, 0, 0.007, 0.010))
    planner.plan(7, confident(q=0.8), ctx())
    assert planner.mode != PARALLEL


def test_probes_spend_only_what_the_answer_earned():
    """Probe credit is earned within an answer: after a long answer that earned plenty, a new answer
    starts without it (a short answer never pays for a probe), while a probe's debt carries over."""
    costs = memory_bound(jump=2.5, draft=0.004)
    planner = AutoPlanner(costs=costs, probe_budget=0.02)
    drafter = confident(q=0.9)
    for _ in range(3000):  # one long answer whose drafts are always wrong: probes, within budget
        tree = planner.plan(7, drafter, ctx(fresh=False))
        drafting = 0.004 * tree.stats.draft_decodes
        planner.observe(_verified(tree, 0, drafting, float(costs.t(tree.size))))
    assert planner.policy.credit > 10 * planner.policy._probe_loss(1)
    planner.guards.drafts = Guard()  # the draft guard's wait after those losses aside: credit decides
    modes = []
    for step in range(10):  # a short answer: it earns less than a probe may lose, so no probe
        tree = planner.plan(7, drafter, ctx(fresh=step == 0))
        modes.append(planner.mode)
        planner.observe(_verified(tree, 0, 0.0, float(costs.t(tree.size))))
    assert PROBE not in modes and SPECULATE not in modes
    planner.policy.credit = -1.0  # a debt: kept by the next answer
    planner.plan(7, drafter, ctx(fresh=True))
    assert planner.policy.credit < 0
