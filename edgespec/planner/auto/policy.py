"""``auto``'s policy: each step, plain decoding, copies alone, or a draft tree — as the cost model
forecasts, overruled by the guard (``guard``) where speculation has been losing in this answer.

A step's forecast rate is its expected tokens per second,

    rate = (1 + E) / (drafting + c_t(m + 1) + overhead),     plain decoding: 1 / c_t(1),

E the tree's Σ p̂, each p̂ the product along its path of the chance that each token is right, given
the probability q the draft gave it (``acceptance``).

1. **Could speculation ever pay?** With every draft token accepted, the best a step can do is a
   chain of n: (1 + n) / (catch-up(1) + (n − 1) · d(1) + c_t(n + 1)) (``costmodel.ceiling``; one-pass
   trees: ``parallel_ceiling``). When no n beats plain decoding (a compute-bound CPU, where c_t(n) ≈
   n · c_t(1)), auto never drafts: only copies, which cost no drafting, may still pay.
2. **Forecast.** Otherwise a step's growth is simulated on the draft's average distribution with the
   acceptance curve (``costmodel.simulate``); the draft's catch-up on tokens it has not seen (one batched
   decode after plain steps) is spread over as many steps as the plain stretch, ``horizon`` at least
   (``catch_up_share``). Draft when the forecast beats plain decoding by ``margin``; ``PARALLEL`` when
   a one-pass tree's forecast beats both.
3. **Probes.** When the forecast says plain but step 1 says speculation could pay, auto still
   drafts now and then so that the curve stays fresh — when a probe's worst-case loss fits the probe credit,
   which grows by ``probe_budget`` × every step's time within the answer (an answer starts with no
   credit, only the debts of earlier probes: credit carried over from earlier answers spent itself
   on one 48-token answer's first steps, 11 % of its time on the Xeon; short answers now never probe).
4. **Copies** (``copies.CopySteps``): verified alone when their best size's rate beats plain
   decoding and the draft's forecast.
5. **The look-ahead** (a target on RPC servers: the draft works while the target verifies) runs only
   while a tree whose drafting cost nothing would beat plain decoding (``free_trees_pay``): where even
   that loses (a steep cost curve behind a fast link), the look-ahead's decodes only compete with the
   target for this machine's cores (traced at 0 ms on a 2-core EPYC: plain verifies 66 → 73 ms).
6. **The guard** overrules 2–4: a kind (copies, draft trees) that lost to plain decoding in this
   answer waits for its retry, and a plain step is taken when plain decoding's speed needs measuring.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from ..costmodel import Choice, CostModel, ceiling, parallel_ceiling, simulate
from ..ngram import CopyTrie
from .calibration import Calibration
from .copies import CopySteps, Unverified
from .guard import Guards
from .tuning import TUNING


class Mode(str, Enum):
    """What a step does. str-valued: stats, JSON and the chat's status compare and print the strings."""

    PLAIN = "plain"  # plain decoding: no draft tree
    SPECULATE = "speculate"  # a draft tree grown level by level, as the forecast says it pays
    PROBE = "probe"  # a draft tree the forecast says loses, drafted to keep the acceptance curve fresh
    COPY = "copy"  # the conversation's copies verified alone
    PARALLEL = "parallel"  # a one-pass ParallelSpec tree

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


MODES = tuple(Mode)
DRAFTING = (Mode.SPECULATE, Mode.PROBE, Mode.PARALLEL)  # the modes that draft: the draft guard's


class Ceiling(Enum):
    """Step 1's verdict on the profiled curves: could any tree beat plain decoding on this machine?"""

    UNKNOWN = "unknown"  # not judged yet on the curves in use
    PAYS = "pays"  # some tree would, were every draft token accepted
    CANNOT_PAY = "cannot pay"  # none would: auto never drafts (only copies may still pay)


@dataclass
class Policy:
    calibration: Calibration
    copies: CopySteps
    guards: Guards
    budget: int  # the planner's: most draft tokens per step
    max_depth: int
    masks: int  # one-pass trees' K (0: none)
    probe_budget: float
    credit: float = 0.0  # seconds probes may still lose
    why: str = ""  # why the last step was plain, when not by the forecast ("": it was)
    forecast_rate: float = 0.0  # this step's forecast when drafting
    _forecast: tuple[int, Choice] | None = field(default=None, repr=False)  # (calibration epoch, choice)
    _ceiling: Ceiling = field(default=Ceiling.UNKNOWN, repr=False)
    _free: tuple[int, bool] | None = field(default=None, repr=False)  # (calibration epoch, free_trees_pay)
    _curves: CostModel | None = field(default=None, repr=False)  # the curves the caches were made with

    @property
    def never_drafts(self) -> bool:
        """Step 1 said no tree could ever beat plain decoding on this machine."""
        return self._ceiling is Ceiling.CANNOT_PAY

    @property
    def free_trees_pay(self) -> bool:
        """Step 5: a forecast tree beats plain decoding when its drafting costs nothing (the draft's
        look-ahead did it while the target verified)."""
        cal = self.calibration
        if cal.costs is None or self.never_drafts:
            return False
        if self._free is None or self._free[0] != cal.epoch:
            c = cal.effective
            free = CostModel(c.target, 0 * c.draft, 0 * c.catchup, c.overhead, c.look_ahead)
            f = simulate(0.0, 1.0, free, self.budget, cal.chances, self.max_depth)
            self._free = cal.epoch, f.m > 0 and f.rate > (1 + TUNING.margin) / cal.plain_decode
        return self._free[1]

    def choose(self, trie: CopyTrie, pending: int, cap: int) -> tuple[Mode, int]:
        """(mode, copies to verify alone) for a step whose draft must first decode ``pending`` tokens."""
        self.why = ""
        mode = self.decide(pending, cap)
        copies = self.copies_alone(trie, cap, mode)
        step, guards = self.guards.step, self.guards
        if copies and not guards.copies.allows(step):  # followed, not verified: will copies win again?
            guards.shadow_copies(Unverified.of(trie, trie.best(copies)))
            copies, self.why = 0, f"copies lost to plain decoding, retry in {guards.copies.waiting(step)}"
        if copies:
            mode = Mode.COPY
        now, later = self._catch_up_tokens(pending), self._catch_up_tokens(pending + 1)
        guards.drafts.bring_forward(pending, None if now is None or later is None else (now, later))
        if mode in DRAFTING and not guards.drafts.allows(step, pending):
            wait = guards.drafts.waiting(step)
            mode, self.why = (
                Mode.PLAIN,
                f"drafts lost to plain decoding, retry in {wait or 'the next answer'}",
            )
        if mode != Mode.PLAIN and guards.needs_plain():
            mode, self.why = Mode.PLAIN, "measuring plain decoding"
        if mode == Mode.PLAIN and not self.why and self.never_drafts:
            self.why = "speculation cannot pay on this machine"
        return mode, copies if mode == Mode.COPY else 0

    def decide(self, pending: int, cap: int) -> Mode:
        """The cost model's choice (steps 1–3): PLAIN, SPECULATE, PARALLEL or PROBE."""
        cal = self.calibration
        if cal.costs is None or cap < 1 or self._ceiling is Ceiling.CANNOT_PAY:
            return Mode.PLAIN
        costs = self._refresh(cap)
        plain_rate = 1.0 / cal.plain_decode
        if self._ceiling is not Ceiling.PAYS:
            return Mode.PLAIN  # nothing could beat plain decoding here, even were every draft token accepted
        if self._forecast is None or self._forecast[0] != cal.epoch:
            seconds = float(costs.k(1))
            self._forecast = cal.epoch, simulate(seconds, 1.0, costs, cap, cal.chances, self.max_depth)
        f = self._forecast[1]
        catchup = catch_up_share(costs, pending)
        self.forecast_rate = (1.0 + f.expected) / (f.seconds + catchup)
        rival = max(plain_rate * (1 + TUNING.margin), self.forecast_rate)
        if self.masks and (parallel := self._parallel_rate(pending, cap)) > rival:
            self.forecast_rate = parallel
            return Mode.PARALLEL
        if self.forecast_rate > plain_rate * (1 + TUNING.margin):
            return Mode.SPECULATE
        if self.credit >= self._probe_loss(pending):
            return Mode.PROBE
        return Mode.PLAIN

    def _refresh(self, cap: int) -> CostModel:
        """The calibration's curves; when they changed, the copies' bound and step 1 follow them."""
        costs = self.calibration.effective
        if costs is not self._curves:
            self._curves, self._ceiling = costs, Ceiling.UNKNOWN
            self.copies.set_costs(costs, self.budget)
        if self._ceiling is Ceiling.UNKNOWN:  # on the profile: what this machine allows, not a factor's
            # estimate of the moment (a "never" on learnt factors was final: nothing drafted to unlearn it)
            profiled = self.calibration.profiled
            best = ceiling(profiled, cap)
            if self.masks:
                best = max(best, parallel_ceiling(profiled, self.masks, cap))
            pays = best > (1 + TUNING.margin) / self.calibration.plain_decode
            self._ceiling = Ceiling.PAYS if pays else Ceiling.CANNOT_PAY
        return costs

    def copies_alone(self, trie: CopyTrie, cap: int, mode: Mode) -> int:
        """How many copies to verify alone: 0 unless they beat plain decoding and the draft's forecast."""
        cal = self.calibration
        if cal.costs is None:
            return 0
        if self._curves is not cal.effective:
            self._refresh(cap)
        rival = (1.0 + TUNING.margin) / cal.plain_decode
        if mode in (Mode.SPECULATE, Mode.PARALLEL):
            rival = max(rival, self.forecast_rate)
        return self.copies.alone(trie, cap, rival)

    def _catch_up_tokens(self, pending: int) -> float | None:
        """The draft's catch-up on ``pending`` tokens beyond a step's own root, in plain decodes'
        worth, as the curves say: (c_k(pending) − c_k(1)) / c_t(1) (None: no curves)."""
        cal = self.calibration
        if cal.costs is None:
            return None
        costs = cal.effective
        return float(costs.k(max(pending, 1)) - costs.k(1)) / cal.plain_decode

    def _parallel_rate(self, pending: int, cap: int) -> float:
        """Forecast of a one-pass tree: (1 + r_par · E_par) / (c_k(pending + K) + c_t(m_par + 1))."""
        cal, costs = self.calibration, self.calibration.effective
        size = min(cap, round(cal.par_size) or self.masks + 1)
        seconds = costs.k(pending + self.masks) + costs.t(size + 1) + costs.overhead
        return float((1.0 + cal.par_ratio * cal.par_expected) / seconds)

    def _probe_loss(self, pending: int) -> float:
        """Worst case of a probe: a whole forecast tree's time for the one token plain decoding gives."""
        costs = self.calibration.effective
        f = self._forecast[1] if self._forecast is not None else None
        seconds = f.seconds if f is not None and f.m > 0 else costs.k(1) + costs.t(2) + costs.overhead
        return float(seconds + costs.k(max(pending, 1)) - costs.k(1) - costs.t(1))

    def restart(self) -> None:
        """A new answer: probes spend only what it earns (a debt is kept)."""
        self.credit = min(self.credit, 0.0)

    def learn(self, event, mode: Mode, plain_seconds: float) -> None:
        """Probe credit: earned by every step's time, spent by what probes lost against plain decoding."""
        cal = self.calibration
        seconds = event.timings.total
        self.credit = min(self.credit + self.probe_budget * seconds, TUNING.credit_max * cal.plain_decode)
        if mode == Mode.PROBE:
            self.credit -= max(seconds - len(event.tokens) * plain_seconds, 0.0)


def catch_up_share(costs: CostModel, pending: int) -> float:
    """The part of the draft's catch-up on ``pending`` tokens (one batched decode, c_k(p), after plain
    steps) that one speculative step is charged, beyond the root every step decodes:

        (c_k(p) − c_k(1)) / max(horizon, p − 1).

    The catch-up is paid once, by the first step that drafts, and serves every step after it: it is
    spread over at least ``horizon`` steps, and over as many as the plain stretch that made it (an
    answer that ran p − 1 plain steps is taken to run that many more). Spread over ``horizon`` alone,
    a long plain stretch was a trap: its charge grew with every plain step (a 7B target on 16 cores
    whose forecast fell just under the margin once never drafted again in its answer, probes
    included), while this one tends to the slope of c_k, one pending token's batched cost."""
    p = max(pending, 1)
    return float(costs.k(p) - costs.k(1)) / max(TUNING.horizon, p - 1)
