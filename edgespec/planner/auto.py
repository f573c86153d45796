"""``auto``: speculate only as much as this hardware pays for — and not at all when it does not.

Each step maximises the expected tokens per second of the step,

    rate(tree) = (1 + r · Σ p̂) / (draft time + c_t(tree size) + overhead),

where Σ p̂ is the tree's expected accepted length under the draft's probabilities (OPT-Tree's E[A]),
``r`` the running ratio of tokens accepted to tokens predicted (the draft's calibration, measured
online through ``observe``), and c_t the target's measured verify cost by batch size (the cost
profile, see ``edgespec.measure.costs``). Plain decoding is the tree with only the root: rate 1 / c_t(1).

1. **Could speculation ever pay?** With every draft token accepted, the best a step can do is a
   chain of n: (1 + n) / (catch-up(1) + (n − 1) · d(1) + c_t(n + 1)). When no n beats plain decoding
   (a compute-bound CPU, where c_t(n) ≈ n · c_t(1)), auto decodes plainly and never drafts or probes.
2. **Forecast.** Otherwise the growth below is simulated on the average draft distribution seen so
   far (top-j probabilities) with the measured r; the draft's catch-up on tokens it has not seen
   (one batched decode after plain steps) is spread over a few steps. Speculate when the forecast
   beats plain decoding by a margin.
3. **Probes.** When the forecast says "plain" but step 1 says speculation could pay, auto still
   drafts now and then so that r stays fresh — only when a probe's worst-case loss fits the probe
   credit, which grows by ``probe_budget`` × every step's time: probes cost at most that fraction.
4. **Growth (one batched draft decode per level).** Nodes are kept best-first by p̂ (the top n by p̂
   form a subtree, OPT-Tree Theorem 3.1). After each level: the best final size m is the one that
   maximises the rate with the draft time spent so far — so a jump in c_t (CUDA's 8 → 9 tokens) is
   crossed only when the extra E[A] pays for it; one more level is drafted (its w best unexpanded
   nodes, w chosen the same way, children predicted from the average distribution) only when that
   forecast beats stopping now.

5. **One-pass trees (ParallelSpec, ``masks`` = K > 0).** One draft pass over the pending tokens and
   K masks gives K + 1 per-depth distributions; the tree is their best product paths, sized with that
   pass, c_k(pending + K), as the drafting time. Forecast (1 + r_par·E_par) / (c_k(pending + K) +
   c_t(m_par + 1)), learned from the parallel steps seen; chosen when it beats the others.

6. **Copies.** Every step also looks up continuations in the conversation (``ngram.Copier``): free
   candidates, no draft time. Copies alone are verified when their best size's rate
   (1 + r_c · Σ p̂) / c_t(n + 1) beats plain decoding and the draft's forecast (``COPY`` steps; r_c
   and the rule in ``auto_copies``). Growing the draft's tree, copies at least as likely as its
   least likely node are grafted on (the hybrid; a token both propose is one node).

Children are the draft's most likely tokens (``ChildRule.TOP``): the one-hot rule verifies them
losslessly, greedy or sampling. Every node added to the tree stays in it (node indices are the ones
the draft saw), so nothing is renumbered. Pure numpy: the cost curves arrive as data, and the rate
arithmetic (``best_size``, ``deepen``, ``simulate``, ``ceiling``) lives in ``costmodel``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import params
from .auto_copies import CopySteps
from .costmodel import Choice, CostModel, best_size, ceiling, deepen, parallel_ceiling, simulate
from .ngram import Copier, CopyTrie
from .parallel import ADAPTER_HELP, grow
from .params import param
from .tree import (
    ChildRule,
    Drafter,
    DraftSetup,
    DraftTree,
    PlanContext,
    Planner,
    PlanStats,
    TreeBuilder,
    step_seed,
)

CHILDREN_KEPT = 8  # candidates per expanded node that may enter the tree
PROFILE_LEN = 4  # children predicted per expanded node in forecasts
PRIOR_PROFILE = np.array([0.6, 0.12, 0.05, 0.03])  # a typical draft's top-j probabilities
PRIOR_WEIGHT = 4.0  # the priors count as this many observed nodes / predicted tokens
PROFILE_MEMORY = 8.0  # the running profile weighs as this many nodes against a step's new ones
PROBE_PROFILE = np.array([0.9, 0.05, 0.02, 0.01])  # what a probe hopes the draft to be (at least)
STEP_PRIOR = 2.0  # within a step, the running profile counts as this many of the step's own nodes
DECAY = 0.97  # per observed speculative step: older steps fade
HORIZON = 8  # the draft's catch-up after plain steps is spread over this many speculative steps
MARGIN = 0.03  # speculate when the forecast beats plain decoding by this fraction
MODES = PLAIN, SPECULATE, PROBE, COPY, PARALLEL = "plain", "speculate", "probe", "copy", "parallel"


@dataclass
class AutoPlanner(Planner):
    budget: int = param(
        48, "most draft tokens per step, root excluded (the cost curves usually pick fewer)", minimum=1
    )
    max_depth: int = param(10, params.MAX_DEPTH + " (draft decodes per step)", minimum=1)
    probe_budget: float = param(
        0.01,
        "most of the time auto may lose to probes that re-check the acceptance rate (fraction)",
        minimum=0,
        maximum=0.5,
    )
    masks: int = param(
        0,
        "K > 0: also weigh ParallelSpec trees drafted in one pass with K [MASK] tokens (0: off)",
        minimum=0,
    )
    adapter: str = param("", ADAPTER_HELP)
    # the pair's measured curves (``use_costs``); None → plain decoding
    costs: CostModel | None = field(default=None, compare=False, repr=False)
    name = "auto"
    wants_costs = True
    # -- learned online (observe) -----------------------------------------------------------------
    accepted: float = field(default=PRIOR_WEIGHT, repr=False)  # decayed Σ accepted draft tokens
    predicted: float = field(default=PRIOR_WEIGHT, repr=False)  # decayed Σ p̂ of the verified trees
    profile: np.ndarray = field(default_factory=lambda: PRIOR_PROFILE.copy(), repr=False)
    plain_seconds: float | None = field(default=None, repr=False)  # measured plain step time (EMA)
    credit: float = field(default=0.0, repr=False)  # seconds probes may still lose
    steps: dict = field(default_factory=lambda: dict.fromkeys(MODES, 0), repr=False)
    copier: Copier = field(default_factory=Copier, repr=False)  # continuations from the conversation
    copies: CopySteps = field(default_factory=CopySteps, repr=False)  # when copies alone are verified (r_c)
    # measured ÷ profiled cost of batches (n ≥ 2) and of drafting, relative to plain decoding's
    # measured ÷ profiled cost: corrects a profile taken on a busy machine, whatever the current load
    batch_factor: float = field(default=1.0, repr=False)
    draft_factor: float = field(default=1.0, repr=False)
    # one-pass trees: decayed Σ accepted and Σ p̂, and the expected length and size chosen (EMA)
    par_accepted: float = field(default=PRIOR_WEIGHT, repr=False)
    par_predicted: float = field(default=PRIOR_WEIGHT, repr=False)
    par_expected: float = field(default=1.0, repr=False)  # prior: one token per step
    par_size: float = field(default=0.0, repr=False)  # 0: not seen yet (then K + 1)
    _plain_verify: float | None = field(default=None, repr=False)  # measured plain decode (EMA)
    _draft_predicted: float = field(default=0.0, repr=False)  # last step's profiled drafting seconds
    _mode: str = field(default=PLAIN, repr=False)
    _last_drafted: int = field(default=0, repr=False)  # draft tokens of the last speculative step
    _forecast: Choice | None = field(default=None, repr=False)
    _forecast_rate: float = field(default=0.0, repr=False)  # this step's forecast rate when speculating
    _ceiling_ok: bool | None = field(default=None, repr=False)
    _plain: float = field(default=0.0, repr=False)
    _eff: CostModel | None = field(default=None, repr=False)  # the profile with the factors applied
    _eff_factors: tuple[float, float] = field(default=(1.0, 1.0), repr=False)

    def __post_init__(self) -> None:
        if self.costs is not None:
            self.use_costs(self.costs)

    def use_costs(self, costs: CostModel) -> None:
        self.costs = costs
        self._plain = float(costs.target[0])  # c_t(1): one plain decode
        self._apply_factors()

    def _apply_factors(self) -> None:
        """The curves decisions use: the profile, batches and drafting scaled by the learned factors."""
        c = self.costs
        target = c.target.copy()
        target[1:] *= self.batch_factor
        self._eff = CostModel(target, c.draft * self.draft_factor, c.catchup * self.draft_factor, c.overhead)
        self._eff_factors = (self.batch_factor, self.draft_factor)
        self.copies.use_costs(self._eff, self.budget)
        self._forecast = None
        self._ceiling_ok = None

    @property
    def ratio(self) -> float:
        """r: accepted ÷ predicted (Σ p̂) over recent speculative steps (prior 1)."""
        return self.accepted / self.predicted

    def describe(self) -> str:
        """What auto is doing now (shown live in the chat's status bar) and how often it speculated."""
        if self.costs is None:
            return "no cost profile yet: plain decoding"
        if self._ceiling_ok is False:
            return "plain: speculation cannot pay on this machine"
        total = sum(self.steps.values())
        if total == 0:
            return f"budget≤{self.budget}, deciding per step"
        share = (self.steps[SPECULATE] + self.steps[PROBE] + self.steps[PARALLEL]) / total
        copying = self.steps[COPY] / total
        now = {
            PLAIN: "plain now",
            SPECULATE: f"speculating {self._last_drafted} tokens",
            PROBE: f"probing {self._last_drafted} tokens",
            COPY: f"copying {self._last_drafted} tokens",
            PARALLEL: f"one-pass tree of {self._last_drafted} tokens",
        }[self._mode]
        return (
            f"{now} (budget≤{self.budget}, r={self.ratio:.2f}, speculated {share:.0%}, copied {copying:.0%} "
            "of steps)"
        )

    def draft_setup(self) -> DraftSetup:
        if not self.masks:
            return DraftSetup()
        return DraftSetup(masks=self.masks, adapter="" if self.adapter == "none" else self.adapter)

    # -- the decision -----------------------------------------------------------------------------
    def decide(self, pending: int, cap: int) -> str:
        """PLAIN, SPECULATE, PARALLEL or PROBE for a step whose draft must first decode ``pending`` tokens."""
        if self.costs is None or cap < 1 or self._ceiling_ok is False:
            return PLAIN
        costs = self._eff
        plain_rate = 1.0 / self._plain
        if self._ceiling_ok is None:
            best = max(ceiling(costs, cap), parallel_ceiling(costs, self.masks, cap) if self.masks else 0.0)
            self._ceiling_ok = best > plain_rate * (1 + MARGIN)
        if not self._ceiling_ok:
            return PLAIN  # nothing could beat plain decoding here, even if every draft token were accepted
        if self._forecast is None:
            self._forecast = simulate(float(costs.k(1)), self.ratio, costs, cap, self.profile, self.max_depth)
        f = self._forecast
        catchup = float(costs.k(max(pending, 1)) - costs.k(1)) / HORIZON
        self._forecast_rate = (1.0 + self.ratio * f.expected) / (f.seconds + catchup)
        rival = max(plain_rate * (1 + MARGIN), self._forecast_rate)
        if self.masks and (parallel := self._parallel_rate(pending, cap)) > rival:
            self._forecast_rate = parallel
            return PARALLEL
        if self._forecast_rate > plain_rate * (1 + MARGIN):
            return SPECULATE
        if self.credit >= self._probe_loss(pending):
            return PROBE
        return PLAIN

    def _parallel_rate(self, pending: int, cap: int) -> float:
        """Forecast of a one-pass tree: (1 + r_par · E_par) / (c_k(pending + K) + c_t(m_par + 1))."""
        size, costs = min(cap, round(self.par_size) or self.masks + 1), self._eff
        seconds = costs.k(pending + self.masks) + costs.t(size + 1) + costs.overhead
        return float((1.0 + self.par_accepted / self.par_predicted * self.par_expected) / seconds)

    def _probe_loss(self, pending: int) -> float:
        """Worst case of a probe: a whole forecast tree's time for the one token plain decoding gives."""
        costs = self._eff
        f = self._forecast
        seconds = f.seconds if f is not None and f.m > 0 else costs.k(1) + costs.t(2) + costs.overhead
        return float(seconds + costs.k(max(pending, 1)) - costs.k(1) - costs.t(1))

    # -- planning ---------------------------------------------------------------------------------
    def plan(self, root_token: int, drafter: Drafter, ctx: PlanContext) -> DraftTree:
        cap = min(self.budget, ctx.max_nodes - 1)
        pending = len(drafter.pending) or 1  # tokens the draft has yet to decode
        if ctx.fresh:
            self.copies.restart()
        trie = self.copier.propose(root_token, ctx)  # free candidates, whatever is decided
        self._mode = self.decide(pending, cap)
        if copies := self._copies_alone(trie, cap):
            self._mode = COPY
        self.steps[self._mode] += 1
        if self._mode == COPY:  # no draft work; the draft catches up later
            self._draft_predicted = 0.0
            tree = self.copier.copy_tree(trie, trie.best(copies))
            self._last_drafted = tree.size - 1
            return tree
        if self._mode == PLAIN:
            return TreeBuilder(root_token).freeze()  # no draft work at all; the draft catches up later
        if self._mode == PARALLEL:
            return self._one_pass(root_token, drafter, ctx, cap, pending)
        if self._mode == PROBE:  # optimistic: draft what would pay if the draft were good, and see
            prior = np.maximum(self.profile, PROBE_PROFILE)
            return self._grow(root_token, drafter, cap, pending, max(self.ratio, 1.0), prior, trie)
        return self._grow(root_token, drafter, cap, pending, self.ratio, self.profile, trie)

    def _copies_alone(self, trie: CopyTrie, cap: int) -> int:
        """How many copies to verify alone: 0 unless they beat plain decoding and the draft's forecast."""
        if self.costs is None:
            return 0
        rival = (1.0 + MARGIN) / self._plain
        if self._mode in (SPECULATE, PARALLEL):
            rival = max(rival, self._forecast_rate)
        return self.copies.alone(trie, cap, rival)

    def _grow(
        self,
        root_token: int,
        drafter: Drafter,
        cap: int,
        pending: int,
        ratio: float,
        prior: np.ndarray,
        trie: CopyTrie,
    ) -> DraftTree:
        costs = self._eff
        tree = TreeBuilder(root_token)
        spent = float(costs.k(pending))
        # candidates not (yet) in the tree: parent node, token, q, p̂, depth, rank (for stable ties)
        cand: list[tuple[int, int, float, float, int, int]] = []
        decodes, evaluated = 0, 0
        frontier = [0]
        tops = np.zeros(PROFILE_LEN)  # Σ top-j probabilities of this step's distributions
        while True:
            dists = drafter.expand(tree, frontier)
            decodes += 1
            evaluated += len(frontier)
            for node, dist in zip(frontier, dists):
                k = min(PROFILE_LEN, dist.probs.shape[0])
                tops[:k] += dist.probs[:k]
                for rank in range(min(CHILDREN_KEPT, dist.ids.shape[0])):
                    q = float(dist.probs[rank])
                    if q > 0.0:
                        phat = tree.path_prob[node] * q
                        cand.append((node, int(dist.ids[rank]), q, phat, tree.depth[node] + 1, len(cand)))
            cand.sort(key=lambda c: (-c[3], c[5]))  # best p̂ first; ties: the older candidate
            pool = np.array([c[3] for c in cand], dtype=np.float64)
            expandable = np.array([c[4] < self.max_depth for c in cand], dtype=bool)
            forced_e = float(sum(tree.path_prob[1:]))
            # Children not drafted yet look like this step's distributions so far (the running
            # profile weighs in as STEP_PRIOR nodes): a confident chain is expected to stay confident.
            profile = (STEP_PRIOR * prior + tops) / (STEP_PRIOR + evaluated)
            w, _ = deepen(forced_e, tree.size - 1, pool, expandable, spent, ratio, costs, cap, profile)
            if w == 0:
                break
            chosen = [c for c, ok in zip(cand, expandable) if ok][:w]
            frontier = [self._add(tree, c) for c in chosen]
            taken = {id(c) for c in chosen}
            cand = [c for c in cand if id(c) not in taken]
            spent += float(costs.d(w))
        final = best_size(float(sum(tree.path_prob[1:])), tree.size - 1, pool, spent, ratio, costs, cap)
        for c in cand[: final.m - (tree.size - 1)]:
            self._add(tree, c)
        if tree.size > 1 and trie.size > 1:  # the hybrid: copies as likely as the least likely node
            graft = trie.best(cap - (tree.size - 1), min(tree.path_prob[1:]))
            self.copier.grow(tree, trie, graft, {0: 0})
        self._draft_predicted = spent / self.draft_factor
        self._last_drafted = tree.size - 1
        stats = PlanStats(
            draft_decodes=decodes,
            drafted_nodes=evaluated,
            expected_accept=float(sum(tree.path_prob[1:])),
        )
        return self.copier.remember(tree.freeze(stats))

    def _one_pass(self, root_token: int, drafter: Drafter, ctx: PlanContext, cap: int, pending: int):
        """ParallelSpec's tree: one draft pass of the pending tokens and K masks, then the size that
        maximises the rate with that pass as the drafting time (nodes in the order ``grow`` adds them:
        best p̂ first when greedy, so every prefix is a subtree)."""
        costs = self._eff
        k = min(self.masks, cap - 1)
        tree = TreeBuilder(root_token)
        dists = drafter.parallel_dists(tree, k)
        seed = step_seed(ctx) if ctx.sampling else None
        trial = TreeBuilder(root_token)
        grow(trial, dists, cap, seed)
        spent = float(costs.k(pending + k))
        ratio = self.par_accepted / self.par_predicted
        size = best_size(0.0, 0, np.asarray(trial.path_prob[1:]), spent, ratio, costs, cap).m
        grow(tree, dists, max(size, 1), seed)
        self._draft_predicted, self._last_drafted = spent / self.draft_factor, tree.size - 1
        expected = float(sum(tree.path_prob[1:]))
        return tree.freeze(PlanStats(draft_decodes=1, drafted_nodes=k + 1, expected_accept=expected))

    def _learn_costs(self, event) -> None:
        """Measured ÷ profiled, for the tree's verify and the drafting, over the same for plain decoding."""
        plain = (self._plain_verify / self._plain) if self._plain_verify else 1.0
        if event.verified_nodes >= 2 and event.timings.verify > 0:
            measured = event.timings.verify / float(self.costs.t(event.verified_nodes)) / plain
            self.batch_factor = float(np.clip(_ema(self.batch_factor, measured, 0.3), 0.25, 8.0))
        drafting = event.timings.draft + event.timings.plan
        if self._draft_predicted > 0 and drafting > 0:
            measured = drafting / self._draft_predicted / plain
            self.draft_factor = float(np.clip(_ema(self.draft_factor, measured, 0.3), 0.25, 8.0))
        used_b, used_d = self._eff_factors
        if abs(self.batch_factor / used_b - 1) > 0.1 or abs(self.draft_factor / used_d - 1) > 0.1:
            self._apply_factors()

    @staticmethod
    def _add(tree: TreeBuilder, cand: tuple[int, int, float, float, int, int]) -> int:
        parent, token, q = cand[0], cand[1], cand[2]
        tree.set_children_rule(parent, ChildRule.TOP)
        return tree.add(parent, token, q)

    # -- learning ---------------------------------------------------------------------------------
    def observe(self, event) -> None:
        """What the step did (a ``StepEvent``): the decoder calls this after every step."""
        self.copier.observe(event.tree, event.accepted_path)  # the copies' acceptance rates
        self.copies.observe(event, copied=self._mode == COPY)  # the copy steps' r_c
        if self.costs is None or self._ceiling_ok is False:
            return  # no draft trees for good: nothing else to learn
        seconds = event.timings.total
        self.credit = min(self.credit + self.probe_budget * seconds, 64 * self._plain)
        if self._mode == COPY:
            self._learn_costs(event)  # the batch's cost; the draft's calibration is not involved
            return
        if event.drafted == 0 and event.draft_decodes == 0:
            self.plain_seconds = _ema(self.plain_seconds, seconds, 0.2)
            self._plain_verify = _ema(self._plain_verify, event.timings.verify, 0.2)
            return
        self._learn_costs(event)
        if self._mode == PARALLEL:  # its own calibration: the masks' rows are not the draft's
            self.par_accepted = DECAY * self.par_accepted + event.accepted
            self.par_predicted = DECAY * self.par_predicted + event.expected_accept
            self.par_expected = _ema(self.par_expected, event.expected_accept, 0.2)
            self.par_size = _ema(self.par_size or None, event.drafted, 0.2)
            self._forecast = None
            return
        if event.drafted > 0:
            self.accepted = DECAY * self.accepted + event.accepted
            self.predicted = DECAY * self.predicted + event.expected_accept
        tree = event.tree
        if tree is not None and tree.dists:
            tops = np.zeros((len(tree.dists), PROFILE_LEN))
            for i, dist in enumerate(tree.dists.values()):
                k = min(PROFILE_LEN, dist.probs.shape[0])
                tops[i, :k] = dist.probs[:k]
            weight = len(tree.dists) / (len(tree.dists) + PROFILE_MEMORY)
            self.profile = (1 - weight) * self.profile + weight * tops.mean(axis=0)
        if self._mode == PROBE:
            plain = self.plain_seconds if self.plain_seconds is not None else self._plain
            self.credit -= max(seconds - len(event.tokens) * plain, 0.0)
        self._forecast = None  # r or the profile moved


def _ema(old: float | None, new: float, alpha: float) -> float:
    return new if old is None else (1 - alpha) * old + alpha * new
