"""End-to-end losslessness harness: planner → tree → verifier, on a synthetic target/draft pair.

Every step starts from the same root token. The planner grows a tree with a synthetic draft, the real
``verify_sampling`` walks it against a synthetic target, and the emitted tokens (accepted drafts,
then the target's own token) are counted. Lossless means: whenever the verifier emits a token, given
everything emitted before it in the step (and so whether it got there), the token is distributed as
the target's p(· | previous token). Two chi-square tests check that, each at ALPHA / 2 (Bonferroni):

1. the first token of every step against p(· | ROOT) — STEPS samples, df = V − 1;
2. every later token (positions 2, 3, ≥ 4, each by its previous token) against p(· | previous) —
   the strata where every expected count is ≥ 5, df = Σ (V − 1) over them.

The pair is chosen so that mistakes show (``make_pair``): the draft is sharply unlike the target, the
draft keeps only its top K of V tokens so its probabilities miss mass (a verifier that forgets to
renormalise is off), the root's draft makes token 0 a likely first child (the old DySpec seeding),
and the planners' parameters (``PARAMS``) give up to 4 siblings and depth ≥ 3.

Sample size (test 1). A shift of δ in one token's frequency, taken from the others in proportion,
gives the chi-square non-centrality λ = STEPS · δ² / (p (1 − p)) (any other compensation gives a
larger λ). Every p(· | ROOT) is ≤ 0.07, so p (1 − p) ≤ 0.0651. With df = 15 and a false alarm of
ALPHA / 2 = 5e-4 (critical value 39.72), power 0.9 needs λ ≥ 42.5 (the non-central chi-square's
tail, by simulation: numpy's noncentral_chisquare, 4·10⁵ draws). δ = 0.005 → STEPS ≥ 42.5 · 0.0651
/ 0.005² = 110,670. Later positions get fewer samples (only steps that accepted a draft token
reach them), so test 2 sees shifts there as far as its counts allow.

Trees of planners whose children are all deterministic (``ChildRule.TOP``: the one-hot rule, lossless
for any fixed tree) and that return the same tree for two different random streams are planned once
and reused; every sampled tree is planned afresh each step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from edgespec.decoding.verify import verify_sampling
from edgespec.planner.costmodel import CostModel
from edgespec.planner.strategies import STRATEGY_NAMES
from edgespec.planner.strategies import build as make_planner
from edgespec.planner.tree import (
    ChildRule,
    DraftTree,
    PlanContext,
    SparseDist,
    TreeBuilder,
)

V = 16  # vocabulary
K = 6  # the draft keeps its top K: its probabilities sum to < 1
ROOT = 5  # every step's pending root token
ALPHA = 1e-3  # false-alarm rate of one harness run (two tests at ALPHA / 2 each)
STEPS = 111_000  # see the module docstring: a 0.005 shift in any first-token frequency fails w.p. ≥ 0.9
MAX_POSITION = 4  # positions ≥ 4 in a step share a stratum (by previous token)
MIN_EXPECTED = 5.0  # chi-square strata with a smaller expected count in some cell are left out

# Planners checked under a name of their own: auto weighing one-pass ParallelSpec trees, with costs
# where a draft level costs half a verify and one pass over pending tokens + masks next to nothing.
VARIANTS = {  # name → (strategy, parameters, cost curves, conversation history)
    "auto-parallel": (
        "auto",
        {"budget": 10, "masks": 3},
        CostModel.from_functions(lambda n: 1.0, lambda n: 0.5, lambda n: 0.001),
        (),  # nothing to copy: the one-pass tree is auto's best step
    ),
}
STRATEGIES = (*STRATEGY_NAMES, "auto", *VARIANTS)  # every registered strategy; new ones are picked up here
# Parameters that give each strategy ≥ 2 siblings and depth ≥ 3 on this pair in a small tree;
# a strategy not listed gets {"budget": 10}.
PARAMS: dict[str, dict] = {
    "chain": {"gamma": 4},
    "tsd": {"k": 2, "budget": 10, "theta_prob": 0.05, "theta_sib": 0.1},
    "gsd": {"k": 2, "budget": 10, "theta_prob": 0.05, "theta_sib": 0.1, "tau": 1},
    "opt-tree": {"budget": 16},
    "dyspec": {"budget": 8},
    "mcsd": {"k_config": "4,1,1"},
    "mcsd-target-init": {"w": 2, "k_config": "3,1"},
    "auto": {"budget": 16},
    "parallelspec": {"k": 4, "budget": 10},
}
# For planners that take cost curves (auto, OPT-Tree's μ): a verify costs the same at any size and
# drafting next to nothing, so trees grow deep.
COSTS = CostModel.from_functions(lambda n: 1.0, lambda n: 0.001)


@dataclass(frozen=True)
class SyntheticPair:
    target: np.ndarray  # (V, V) row a: the target's p(· | previous token a)
    draft: tuple[SparseDist, ...]  # [a]: the draft's top-K candidates after token a (sum < 1)


# The draft after ROOT, as full-softmax probabilities of its top K = 8 tokens (token 0 first; they sum
# to 0.67): a sharp head the target does not share, and a tail below the target's p ≈ 1/16, so that
# siblings after a rejection are accepted sometimes (where p − q > 0): what the residual rule is for.
ROOT_DRAFT = {0: 0.30, 9: 0.15, 2: 0.08, 13: 0.04, 7: 0.03, 4: 0.03, 11: 0.02, 5: 0.02}


def make_pair(seed: int = 11) -> SyntheticPair:
    """Target rows: 0.8 · Dirichlet(2) + 0.2 / V, so every p ≥ 0.0125 and the chi-square's expected
    counts stay large; p(· | ROOT) is nearly flat (∝ 1.0 … 0.8, shuffled: max ≤ 0.07, which the sample
    size relies on). After ROOT the draft is ROOT_DRAFT; after any other token it ranks tokens in the
    opposite order to the target, sharpened (T = 0.5), and keeps its top K of the full softmax."""
    rng = np.random.default_rng(seed)
    target = 0.8 * rng.dirichlet(np.full(V, 2.0), size=V) + 0.2 / V
    flat = rng.permutation(np.linspace(1.0, 0.8, V))
    target[ROOT] = flat / flat.sum()
    draft = []
    for a in range(V):
        if a == ROOT:
            ids, probs = np.fromiter(ROOT_DRAFT, dtype=np.int32), np.fromiter(ROOT_DRAFT.values(), float)
            draft.append(SparseDist(ids=ids, probs=probs))
            continue
        logits = -2.0 * np.log(target[a])  # opposite order, sharper: the draft is sharply unlike p
        q = np.exp(logits - logits.max())
        q /= q.sum()
        best = np.argsort(-q, kind="stable")[:K]
        draft.append(SparseDist(ids=best.astype(np.int32), probs=q[best]))
    return SyntheticPair(target, tuple(draft))


class MarkovDrafter:
    """The ``Drafter`` protocol over the pair's draft: a node's distribution depends on its token only."""

    pending = ()  # always caught up

    def __init__(self, pair: SyntheticPair):
        self.pair = pair

    def expand(self, tree: TreeBuilder, nodes) -> list[SparseDist]:
        dists = [self.pair.draft[tree.tokens[node]] for node in nodes]
        for node, dist in zip(nodes, dists):
            tree.dists[node] = dist
        return dists

    def parallel_dists(self, tree: TreeBuilder, k: int) -> list[SparseDist]:
        """ParallelSpec's k + 1 per-depth distributions: the draft after the root, then after the
        draft's own likeliest token at each depth (a parallel drafter's guess at what comes between)."""
        dists = [self.pair.draft[tree.tokens[0]]]
        for _ in range(k):
            dists.append(self.pair.draft[int(dists[-1].ids[0])])
        return dists


def planner_for(name: str, pair: SyntheticPair):
    strategy, params, costs, _ = VARIANTS.get(name, (name, PARAMS.get(name, {"budget": 10}), COSTS, None))
    planner = make_planner(strategy, params)
    if planner.wants_costs:
        planner.use_costs(costs)
    return planner


# The conversation before the root, for planners that copy from it (ngram, hybrid, auto): ROOT recurs
# after "1 2" and alone, with different continuations, so copies branch (siblings) and run deep.
HISTORY = (1, 2, ROOT, 7, 8, 9, 3, 4, ROOT, 0, 1, 2, 6, 11, ROOT, 7, 8, 10, 12, 13, 1, 2)


def history_for(name: str) -> tuple[int, ...]:
    """The conversation a strategy plans in (copying planners find continuations in HISTORY)."""
    return VARIANTS[name][3] if name in VARIANTS else HISTORY


def _plan(planner, pair: SyntheticPair, rng: np.random.Generator, history=HISTORY) -> DraftTree:
    ctx = PlanContext(sampling=True, rng=rng, max_nodes=64, history=history, fresh=True)
    if planner.needs_target_root:  # the target's own candidates at the root
        p = pair.target[ROOT]
        order = np.argsort(-p, kind="stable").astype(np.int32)
        return planner.plan(ROOT, MarkovDrafter(pair), ctx, root_dist=SparseDist(order, p[order]))
    return planner.plan(ROOT, MarkovDrafter(pair), ctx)


def _shape(tree: DraftTree) -> tuple:
    return tuple(tree.tokens.tolist()), tuple(tree.parents.tolist()), tuple(tree.child_rule.tolist())


@dataclass
class Run:
    """What a harness run saw: emitted-token counts and the tree shapes it exercised."""

    first: np.ndarray  # (V,) the first emitted token of each step
    later: np.ndarray  # (MAX_POSITION − 1, V, V) [position − 2, previous token, token]
    max_depth: int = 0
    siblings: set[int] = field(default_factory=set)  # child counts of expanded nodes
    fresh_trees: bool = True  # False: one deterministic tree, planned once
    p_first: float = 1.0
    p_later: float = 1.0

    @property
    def passed(self) -> bool:
        return min(self.p_first, self.p_later) >= ALPHA / 2


def run(
    planner,
    pair: SyntheticPair,
    steps: int = STEPS,
    seed: int = 0,
    verify: Callable = verify_sampling,
    history: tuple[int, ...] = HISTORY,
) -> Run:
    """``steps`` planning + verification steps from ROOT; counts, coverage and the two p-values."""
    rng = np.random.default_rng(seed)
    out = Run(first=np.zeros(V, dtype=np.int64), later=np.zeros((MAX_POSITION - 1, V, V), dtype=np.int64))
    fixed = _plan(planner, pair, rng, history)
    deterministic = set(fixed.child_rule.tolist()) <= {ChildRule.NONE, ChildRule.TOP}
    again = _plan(planner, pair, np.random.default_rng(seed + 1), history)  # another stream: the same tree?
    out.fresh_trees = not (deterministic and _shape(again) == _shape(fixed))
    for _ in range(steps):
        tree = _plan(planner, pair, rng, history) if out.fresh_trees else fixed
        verdict = verify(tree, lambda node, tokens=tree.tokens: pair.target[tokens[node]], rng)
        emitted = [ROOT, *(int(tree.tokens[node]) for node in verdict.path[1:]), verdict.next_token]
        out.first[emitted[1]] += 1
        for position in range(2, len(emitted)):
            out.later[min(position, MAX_POSITION) - 2, emitted[position - 1], emitted[position]] += 1
        if out.fresh_trees or out.max_depth == 0:
            out.max_depth = max(out.max_depth, int(tree.depth.max()))
            out.siblings.update(len(tree.children(u)) for u in range(tree.size) if tree.children(u))
    out.p_first = chi2_sf(*chi_square(out.first[None, :], pair.target[ROOT][None, :]))
    out.p_later = chi2_sf(*chi_square(out.later.reshape(-1, V), np.tile(pair.target, (MAX_POSITION - 1, 1))))
    return out


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson's X² = Σ (O − E)² / E over the strata (rows) whose every E = n · p is ≥ MIN_EXPECTED,
    and its degrees of freedom Σ (V − 1) over them (each row's total is fixed by the data)."""
    n = counts.sum(axis=1, keepdims=True)  # (S, 1) visits of each stratum
    expected = n * probs  # (S, V)
    usable = (expected >= MIN_EXPECTED).all(axis=1)
    stat = float((((counts - expected) ** 2)[usable] / expected[usable]).sum())
    return stat, int(usable.sum()) * (counts.shape[1] - 1)


def chi2_sf(x: float, df: int) -> float:
    """P(χ²_df ≥ x) = Q(df/2, x/2), the regularised upper incomplete gamma function (Numerical Recipes
    §6.2: the series for P when x < a + 1, else Lentz's continued fraction for Q)."""
    if df == 0:
        return 1.0  # nothing could be tested: no evidence against
    a, x = df / 2.0, x / 2.0
    if x <= 0.0:
        return 1.0
    log_prefactor = -x + a * math.log(x) - math.lgamma(a)  # log(e^{−x} x^a / Γ(a))
    if x < a + 1.0:
        term = total = 1.0 / a  # P(a, x) = prefactor · Σ_n x^n / (a (a+1) … (a+n))
        n = 0
        while abs(term) > 1e-16 * abs(total):
            n += 1
            term *= x / (a + n)
            total += term
        return max(0.0, 1.0 - total * math.exp(log_prefactor))
    tiny = 1e-300
    b = x + 1.0 - a
    c, d = 1.0 / tiny, 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = b + an / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        if abs(d * c - 1.0) < 1e-16:
            break
    return math.exp(log_prefactor) * h
