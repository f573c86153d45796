"""End-to-end losslessness harness: every strategy through the decoder's own step
(``decoding.decoder.speculative_step``: plan → verify → decide → commit → ``observe``) on a synthetic
pair (``synthetic_engine``), the target sampling with temperature, top-K and top-P (``SAMPLING``).

Every step starts from the same root token and conversation (``HISTORY``), as the first step of an
answer would, but the planner lives on: adaptive planners (auto, ngram, hybrid) plan each step after
``observe`` has seen every step before, as they do in a real answer. The emitted tokens (accepted
drafts, then the target's own token) are counted. Lossless means: whenever the decoder emits a token,
given everything emitted before it in the step (and so whether it got there), the token is distributed
as the target's sampling distribution p' = ``target_probs`` (softmax at T, top-K, top-P) after the
previous token. Two chi-square tests check that, each at ALPHA / 2 (Bonferroni):

1. the first token of every step against p'(· | ROOT), over its support (df = support − 1);
2. every later token (positions 2, 3, ≥ 4, each by its previous token) against p'(· | previous) —
   the strata where every expected count in the support is ≥ 5.

A token outside p's support (cut by top-K or top-P) fails at once (p = 0).

The pair is chosen so that mistakes show (``make_pair``): the draft is sharply unlike the target, the
draft keeps only its top K of V tokens so its probabilities miss mass (a verifier that forgets to
renormalise is off), the root's draft makes token 0 a likely first child (the old DySpec seeding) and
proposes tokens the target's top-K cuts (which must never be emitted), and the planners' parameters
(``PARAMS``) give up to 4 siblings and depth ≥ 3.

Sample size (test 1). A shift of δ in one token's frequency, taken from the others in proportion,
gives the chi-square non-centrality λ = N · δ² / (p (1 − p)) (any other compensation gives a larger
λ); p (1 − p) is largest at the largest p'(· | ROOT): 0.0844, so p (1 − p) ≤ 0.0773. p' has 13 tokens
(df = 12); at a false alarm of ALPHA / 2 = 5e-4 the critical value is 34.82. The power is the
non-central chi-square's tail past it (``noncentral_sf``: exact, a Poisson mixture of central tails;
it agrees with numpy's noncentral_chisquare to 3 decimals). ``STEPS`` = 125,000 gives λ = 40.4 for
δ = 0.005: power 0.913 (the full run, marked slow). The quick tier's ``QUICK_STEPS`` = 12,000 gives
power 0.905 for δ = ``QUICK_DELTA`` = 0.016. ``first_token_power`` computes these from the pair, and
``test_the_stated_power_holds`` checks them. Later positions get fewer samples (only steps that
accepted a draft token reach them), so test 2 sees shifts there as far as its counts allow.

The trees of planners that learn nothing (no ``observe``), whose children are all deterministic
(``ChildRule.TOP``: the one-hot rule, lossless for any fixed tree) and that return the same tree for
two different random streams are planned once and replayed through the same step; every other tree
is planned afresh each step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from edgespec.decoding.sampling import SamplingParams
from edgespec.engine.rows import target_probs
from edgespec.planner.base import Planner
from edgespec.planner.costmodel import CostModel
from edgespec.planner.inputs import PlanContext
from edgespec.planner.strategies import STRATEGY_NAMES
from edgespec.planner.strategies import build as make_planner
from edgespec.planner.tree import ChildRule, DraftTree, SparseDist
from tests.support.profiles import Given
from tests.support.synthetic_engine import SyntheticEngine

V = 16  # vocabulary
K = 6  # the draft keeps its top K: its probabilities sum to < 1
ROOT = 5  # every step's pending root token
ALPHA = 1e-3  # false-alarm rate of one harness run (two tests at ALPHA / 2 each)
# The target's sampling: at ROOT top-K cuts 3 of its 16 tokens, after any other token top-P cuts 3 or 4
SAMPLING = SamplingParams(temperature=0.9, top_k=13, top_p=0.95)
STEPS = 125_000  # the full run: a 0.005 shift in any first-token frequency fails w.p. ≥ 0.9
QUICK_STEPS = 12_000  # the quick tier's run …
QUICK_DELTA = 0.016  # … fails on a shift of this much w.p. ≥ 0.9
POWER = 0.9
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



def planner_for(name: str, pair: SyntheticPair):
    strategy, params, costs, _ = VARIANTS.get(name, (name, PARAMS.get(name, {"budget": 10}), COSTS, None))
    planner = make_planner(strategy, params)
    planner.prepare(Given(costs))  # what the planner asks for (auto, OPT-Tree, n-gram, hybrid: the curves)
    return planner


def costs_for(name: str) -> CostModel:
    """The machine a strategy runs on (the engine's clock), the same curves its planner was given."""
    return VARIANTS[name][2] if name in VARIANTS else COSTS


# The conversation before the root, for planners that copy from it (ngram, hybrid, auto): ROOT recurs
# after "1 2" and alone, with different continuations, so copies branch (siblings) and run deep.
HISTORY = (1, 2, ROOT, 7, 8, 9, 3, 4, ROOT, 0, 1, 2, 6, 11, ROOT, 7, 8, 10, 12, 13, 1, 2)


def history_for(name: str) -> tuple[int, ...]:
    """The conversation a strategy plans in (copying planners find continuations in HISTORY)."""
    return VARIANTS[name][3] if name in VARIANTS else HISTORY


def expected_rows(pair: SyntheticPair, params: SamplingParams = SAMPLING) -> np.ndarray:
    """(V, V) p'(· | a): the target's sampling distribution after token a, as the decoder computes it."""
    return np.array([target_probs(np.log(pair.target[a]).astype(np.float32), params) for a in range(V)])


class _Replay(Planner):
    """A planner's one tree, replayed every step (see the module docstring: planners that learn
    nothing and plan one deterministic tree)."""

    def __init__(self, planner, tree: DraftTree):
        self.planner, self.tree = planner, tree
        self.name, self.needs_draft = planner.name, planner.needs_draft
        self.needs_target_root = planner.needs_target_root

    def plan(self, root_token, drafter, ctx) -> DraftTree:
        return self.tree


def _shape(tree: DraftTree) -> tuple:
    return tuple(tree.tokens.tolist()), tuple(tree.parents.tolist()), tuple(tree.child_rule.tolist())


def _fixed_tree(planner, pair: SyntheticPair, history, seed: int) -> DraftTree | None:
    """The planner's tree when it is the same for two random streams, deterministic and never learnt."""
    if type(planner).observe is not Planner.observe:
        return None
    trees = []
    for stream in (seed, seed + 1):
        engine = SyntheticEngine(pair.target, pair.draft, COSTS)
        engine.reset(history, ROOT)
        root_dist = None
        if planner.needs_target_root:
            p = target_probs(np.log(pair.target[ROOT]).astype(np.float32), SAMPLING)
            order = np.argsort(-p, kind="stable")[: np.count_nonzero(p)].astype(np.int32)
            root_dist = SparseDist(order, p[order])
        rng = np.random.default_rng(stream)
        ctx = PlanContext(True, rng, engine.max_nodes, history, True, root_dist=root_dist)
        engine.draft.begin_step(SAMPLING.temperature)
        trees.append(planner.plan(ROOT, engine.draft, ctx))
    deterministic = set(trees[0].child_rule.tolist()) <= {ChildRule.NONE, ChildRule.TOP}
    return trees[0] if deterministic and _shape(trees[0]) == _shape(trees[1]) else None


@dataclass
class Run:
    """What a harness run saw: emitted-token counts and the tree shapes it exercised."""

    first: np.ndarray  # (V,) the first emitted token of each step
    later: np.ndarray  # (MAX_POSITION − 1, V, V) [position − 2, previous token, token]
    max_depth: int = 0
    siblings: set[int] = field(default_factory=set)  # child counts of expanded nodes
    plain_steps: int = 0  # steps that verified no draft token (auto's plain steps, copiers without a match)
    fresh_trees: bool = True  # False: one deterministic tree, replayed
    p_first: float = 1.0
    p_later: float = 1.0

    @property
    def passed(self) -> bool:
        return min(self.p_first, self.p_later) >= ALPHA / 2


def run(
    planner, pair: SyntheticPair, steps: int = QUICK_STEPS, seed: int = 0, history: tuple[int, ...] = HISTORY,
    costs: CostModel = COSTS, params: SamplingParams = SAMPLING, backend: bool = False,
) -> Run:  # fmt: skip
    """``steps`` steps of the decoder from ROOT on a ``costs`` machine; counts, coverage, p-values.
    ``backend``: the target's outputs as llama.cpp's backend samplers give them (``SyntheticTarget``)."""
    rng = np.random.default_rng(seed)
    out = Run(first=np.zeros(V, dtype=np.int64), later=np.zeros((MAX_POSITION - 1, V, V), dtype=np.int64))
    fixed = _fixed_tree(planner, pair, history, seed)
    out.fresh_trees = fixed is None
    stepper = planner if fixed is None else _Replay(planner, fixed)
    engine = SyntheticEngine(pair.target, pair.draft, costs, backend=backend)
    engine.target.use_sampling(params)
    with engine.clock.running():
        for i in range(steps):
            engine.reset(history, ROOT)
            event = engine.step(stepper, ROOT, params, rng, fresh=i == 0).event
            emitted = [ROOT, *event.token_ids]
            out.first[emitted[1]] += 1
            for position in range(2, len(emitted)):
                out.later[min(position, MAX_POSITION) - 2, emitted[position - 1], emitted[position]] += 1
            tree = event.tree
            out.plain_steps += tree is None or tree.size == 1
            if tree is not None and (out.fresh_trees or out.max_depth == 0):
                out.max_depth = max(out.max_depth, int(tree.depth.max()))
                out.siblings.update(len(tree.children(u)) for u in range(tree.size) if tree.children(u))
    expected = expected_rows(pair, params)
    out.p_first = chi2_sf(*chi_square(out.first[None, :], expected[ROOT][None, :]))
    out.p_later = chi2_sf(*chi_square(out.later.reshape(-1, V), np.tile(expected, (MAX_POSITION - 1, 1))))
    return out


# -- statistics -------------------------------------------------------------------------------------
def first_token_power(steps: int, delta: float, params: SamplingParams = SAMPLING) -> float:
    """Test 1's power against a δ shift of one first-token frequency (the worst token: largest p)."""
    p_root = expected_rows(make_pair(), params)[ROOT]
    p = float(p_root.max())
    df = int(np.count_nonzero(p_root)) - 1
    return noncentral_sf(chi2_isf(ALPHA / 2, df), df, steps * delta**2 / (p * (1 - p)))


def chi2_isf(q: float, df: int) -> float:
    """The x with P(χ²_df ≥ x) = q (bisection on ``chi2_sf``)."""
    low, high = 0.0, 10.0 * df + 100.0
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if chi2_sf(mid, df) > q else (low, mid)
    return (low + high) / 2


def noncentral_sf(x: float, df: int, lam: float) -> float:
    """P(χ'²_df(λ) ≥ x): the non-central chi-square is a Poisson(λ/2) mixture of central χ²_{df+2j}."""
    total, j, weight = 0.0, 0, math.exp(-lam / 2)
    while j < 10 * (lam + 10):
        total += weight * chi2_sf(x, df + 2 * j)
        j += 1
        weight *= (lam / 2) / j
    return total


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson's X² = Σ (O − E)² / E over each stratum's (row's) support p > 0, for the strata whose
    every such E = n · p is ≥ MIN_EXPECTED, and its degrees of freedom Σ (support − 1) over them (each
    row's total is fixed by the data). A count outside the support is impossible: X² = ∞."""
    if (counts[probs == 0] > 0).any():
        return math.inf, 1
    n = counts.sum(axis=1, keepdims=True)  # (S, 1) visits of each stratum
    expected = n * probs  # (S, V)
    support = probs > 0
    usable = ((expected >= MIN_EXPECTED) | ~support).all(axis=1) & (n[:, 0] > 0)
    cells = support & usable[:, None]
    stat = float(((counts - expected)[cells] ** 2 / expected[cells]).sum())
    return stat, int((support.sum(axis=1) - 1)[usable].sum())


def chi2_sf(x: float, df: int) -> float:
    """P(χ²_df ≥ x) = Q(df/2, x/2), the regularised upper incomplete gamma function (Numerical Recipes
    §6.2: the series for P when x < a + 1, else Lentz's continued fraction for Q)."""
    if df == 0:
        return 1.0  # nothing could be tested: no evidence against
    if math.isinf(x):
        return 0.0
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
