"""``auto``'s guard: within an answer, speculation that delivers less than plain decoding stops —
whatever the cost model says.

The cost model forecasts; the guard measures. Each speculative step delivered t tokens in s seconds
of wall time (the decoder's ``StepEvent``); plain decoding costs c seconds per token (measured on
auto's own plain steps, kept across answers). The step's **excess** is

    x = t − s / c,

the tokens it delivered beyond what plain decoding would have in the same time: speculation pays
exactly when its mean excess is positive (Σ t / Σ s > 1 / c). Copies and draft trees are guarded
apart (a copy tree costs one verify and is right or wrong as a block; a draft tree also costs
drafting), each by a ``Guard`` over exponentially weighted evidence (weight ``guard_decay`` per step of its
kind, so a change in the text shows within ~10 steps). A kind **loses** when

- its weighted Σ x < −``loss_budget`` tokens: the recent steps, wins included, lost more than that; or
- after ``min_steps`` steps, mean x + ``z`` · SE < 0 (SE = √(var x / n_eff), n_eff = (Σw)² / Σw²,
  var x at least ``sigma_floor``²: a few equal steps do not make a certainty): a steady loss, larger
  than the noise of accepted lengths.

Then that kind is off for a while (plain decoding, or the other kind), after which it is tried again
on fresh evidence: off for ``backoff`` steps, doubled by every retry that loses again
(``first_backoff`` … ``max_backoff``, reset once it lasts ``calm_steps`` steps) — and at least for as
many steps as make the time the trial lost ``retry_share`` of the time until the retry (a trial of
huge trees that lost ten plain steps' time waits 500 steps). So when speculation always loses, trials
cost a bounded share of the time; and when the text turns copyable, the next retry finds it. Each
answer starts with fresh evidence: copies start afresh (what one answer copies says little about the
next), draft trees keep the wait they were given (the machine, not the text, is what they lose to).

A draft retry first catches the draft up on every token written while it waited (one batched decode
of them): a one-off cost, charged to the trial's wait but no evidence about drafting. Where that
catch-up is known to lose more than ``loss_budget`` (on a CPU it can cost as much as the wait saved),
drafts retry at the next answer instead (the policy prices its catch-up on the prompt there) — unless
the wait would outgrow the catch-up's budget: then the retry comes when the catch-up still fits it
(``bring_forward``, by the cost profile until a catch-up was measured).

Copies cost nothing to propose, so while they wait, the copy trees auto would have verified are
followed along what the target writes (``copies.Unverified``): each is an imagined copy step
that would have delivered its accepted copies + 1 tokens in the time copy steps took — the median of
the last ``recent``: one huge tree that lost (47 copies among 7-copy steps) had raised their average
to most of its own time, every imagined tree after it lost, and copies stayed off for the rest of the
answer. Each counts once it leaves the tree, or as soon as its copies so far beat that time by a
token. When ``min_steps`` of them win (mean x − ``z`` · SE > 0), the wait ends: a copyable passage is
caught within a few tokens.

Draft trees, too, are followed while they wait wherever the draft guesses for free (a target on RPC
servers: the draft decodes each plain step's root while the target does, ``StepEvent.guess``). A chain
drafted at plain step i would have accepted the run of right guesses from step i on: greedy, its node
at depth d + 1 is the draft's guess after its node at depth d, which — when that node was right — is
the token the target wrote at step i + d, so it is the guess step i + d made. Each such run, up to the
depth of the last tree the drafts verified, is an imagined draft step delivering its right guesses + 1
tokens in the time draft steps took; winning ones end the wait as the copies' do. (A tree holds that
chain, so it accepts at least as much: the evidence errs towards waiting.)
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from .copies import Unverified
from .tuning import TUNING


@dataclass
class Evidence:
    """Exponentially weighted moments of a kind's steps: tokens t and seconds s (not yet the excess:
    c may be measured after the steps were)."""

    steps: int = 0
    w: float = 0.0  # Σ w
    w2: float = 0.0  # Σ w²
    t: float = 0.0  # Σ w t
    s: float = 0.0  # Σ w s
    tt: float = 0.0  # Σ w t²
    ss: float = 0.0  # Σ w s²
    ts: float = 0.0  # Σ w t s

    def add(self, tokens: float, seconds: float) -> None:
        d = TUNING.guard_decay
        self.steps += 1
        self.w, self.w2 = d * self.w + 1.0, d * d * self.w2 + 1.0
        self.t, self.s = d * self.t + tokens, d * self.s + seconds
        self.tt, self.ss = d * self.tt + tokens * tokens, d * self.ss + seconds * seconds
        self.ts = d * self.ts + tokens * seconds

    def excess(self, c: float) -> tuple[float, float, float]:
        """(weighted Σ x, mean x, its standard error) for x = t − s / c."""
        total = self.t - self.s / c  # Σ w x = Σ w t − Σ w s / c
        mean = total / self.w
        # var x = mean of x² − mean², with x² = t² − 2 t s / c + s² / c² (weighted means)
        square = (self.tt - 2.0 * self.ts / c + self.ss / (c * c)) / self.w
        n_eff = self.w * self.w / self.w2  # Kish's effective sample size of the weights
        return total, mean, math.sqrt(max(square - mean * mean, TUNING.sigma_floor**2) / n_eff)

    def loses(self, c: float) -> bool:
        if self.steps == 0:
            return False
        total, mean, se = self.excess(c)
        return total < -TUNING.loss_budget or (self.steps >= TUNING.min_steps and mean + TUNING.z * se < 0.0)


@dataclass
class Guard:
    """One kind of speculation against plain decoding: its evidence and its back-off."""

    evidence: Evidence = field(default_factory=Evidence)
    charged: float = 0.0  # tokens' worth of time lost to catch-ups since the last verdict (not evidence)
    catch_up: float | None = None  # tokens' worth of time a catch-up costs per pending token (EMA)
    backoff: int = TUNING.first_backoff  # the next wait, in steps
    off_until: int = 0  # the step from which it may run again
    calm: int = 0  # its steps since it last lost
    measured: float | None = None  # seconds of one of its steps (median): what an imagined one takes
    # its last steps' s
    recent: deque = field(default_factory=lambda: deque(maxlen=TUNING.recent), repr=False)
    shadow: Evidence = field(default_factory=Evidence)  # imagined steps while it waits

    def allows(self, step: int, pending: int = 1) -> bool:
        """Whether it may run at ``step``: not waiting — and, for a retry after more than
        ``catch_up_free`` pending tokens, only where catching up on them is known to lose at most
        ``loss_budget`` (a CPU's draft catching up on a long wait can cost as much as the wait saved).
        Otherwise it retries at the next answer (or when ``bring_forward`` ends the wait)."""
        if step < self.off_until:
            return False
        if self.off_until == 0 or pending <= TUNING.catch_up_free:
            return True
        return self.catch_up is not None and self.catch_up * pending <= TUNING.loss_budget

    def bring_forward(self, pending: int, profiled: tuple[float, float] | None) -> None:
        """End the wait now (or the refusal after it, ``allows``) where one more plain step would make
        the retry's catch-up cost more than ``loss_budget`` (it grows by c_k's slope with every token
        written meanwhile), after ``first_backoff`` plain steps at least (one pending token each):
        waiting on, the retry would be refused until the next answer. The catch-up's cost in tokens'
        worth, now and after one more token: as measured (``catch_up`` per token), else as the cost
        profile says (``profiled``: (c_k(pending) − c_k(1)) / c_t(1), and with pending + 1).

        Without this a 7B target on 16 cores, whose drafts won by 12 % but lost four steps in a row
        early on, never drafted again in its answer. The price: where drafting keeps losing, each
        retry costs up to loss_budget more (the wait cannot outgrow the point where the catch-up
        reaches it); where the catch-up is dear already after ``first_backoff`` steps (a CPU's small
        target), nothing changes."""
        if self.off_until == 0 or pending < TUNING.first_backoff:
            return  # no wait, or too short a one
        if self.catch_up is not None:
            profiled = self.catch_up * pending, self.catch_up * (pending + 1)
        if profiled is not None and profiled[0] <= TUNING.loss_budget < profiled[1]:
            self.off_until = 0  # the wait is over (its back-off, doubled, stays)

    def waiting(self, step: int) -> int:
        """Steps until the next retry (0: allowed now)."""
        return max(self.off_until - step, 0)

    def record(self, tokens: int, seconds: float, c: float | None, step: int) -> None:
        """A step of this kind; ``c``: plain decoding's seconds per token (None: not measured yet)."""
        self.evidence.add(tokens, seconds)
        self.recent.append(seconds)
        self.measured = statistics.median(self.recent)
        self.calm += 1
        self.judge(c, step)

    def imagine(self, tokens: int, c: float | None, step: int) -> None:
        """While it waits: a step of this kind that was not taken, and the tokens it would have
        delivered (in ``measured`` seconds). Enough winning ones end the wait."""
        if self.allows(step + 1) or self.measured is None or c is None:
            return
        self.shadow.add(tokens, self.measured)
        total, mean, se = self.shadow.excess(c)
        if self.shadow.loses(c):  # they would still lose: judge the next ones afresh
            self.shadow = Evidence()
        elif self.shadow.steps >= TUNING.min_steps and mean - TUNING.z * se > 0:
            self.off_until, self.shadow = step + 1, Evidence()

    def charge(self, tokens: int, seconds: float, c: float | None, pending: int) -> None:
        """A step of this kind that paid a one-off cost (the draft catching up on ``pending`` tokens
        plain steps committed): no evidence of how the kind does, but its loss counts towards the next
        wait, and tells what a catch-up costs per token (at most: the step's own loss is in it too)."""
        if c is not None:
            lost = max(seconds / c - tokens, 0.0)
            self.charged += lost
            self.catch_up = _ema(self.catch_up, lost / pending)

    def judge(self, c: float | None, step: int) -> None:
        if c is None:
            return
        if self.evidence.loses(c):  # off for a while, then a retry on fresh evidence
            lost = self.charged - self.evidence.excess(c)[0]  # tokens the trial lost (plain steps' time)
            wait = min(max(self.backoff, math.ceil(lost / TUNING.retry_share)), TUNING.max_backoff)
            self.off_until = step + 1 + wait
            self.backoff = min(2 * self.backoff, TUNING.max_backoff)
            self.evidence, self.calm, self.charged, self.shadow = Evidence(), 0, 0.0, Evidence()
        elif self.calm >= TUNING.calm_steps:  # forgiven: the next loss is a first one again
            self.backoff, self.charged, self.off_until = TUNING.first_backoff, 0.0, 0


@dataclass
class Guards:
    """Copies and draft trees, each against plain decoding; and plain decoding's measured speed."""

    copies: Guard = field(default_factory=Guard)
    drafts: Guard = field(default_factory=Guard)
    plain_seconds: float | None = None  # c: a plain step's seconds (one token), EMA, across answers
    step: int = 0  # steps observed
    last_plain: int = -1  # the step of the last plain measurement
    shadows: list[list] = field(default_factory=list)  # [copy tree not verified, its copies accepted]
    draft_depth: int = 1  # the height of the last draft tree verified: how deep an imagined chain goes
    guessed: int | None = None  # right guesses in a row of the chain imagined from a plain step

    def restart(self) -> None:
        """A new answer: fresh evidence; copies start afresh, draft trees keep their wait (and c is
        kept: plain decoding's speed is the pair's)."""
        self.copies, self.shadows = Guard(), []
        self.drafts.evidence, self.drafts.calm = Evidence(), 0

    def shadow_copies(self, tree: Unverified) -> None:
        """A copy tree auto would have verified but for the copies' wait: follow it."""
        self.shadows.append([tree, 0])

    def needs_plain(self) -> bool:
        """A plain step is due to measure c: none yet while speculating, or none for a while."""
        speculating = self.copies.evidence.steps + self.drafts.evidence.steps > 0
        return speculating and (self.last_plain < 0 or self.step - self.last_plain >= TUNING.plain_refresh)

    def observe(
        self, kind: str | None, written: Sequence[int], seconds: float, pending: int = 1,
        guess_right: bool | None = None,
    ) -> None:  # fmt: skip
        """A finished step that wrote ``written``: ``kind`` "plain", "copy", "draft", "catch-up" (a draft
        tree that first caught up on ``pending`` tokens: charged, not evidence), or None;
        ``guess_right``: whether the draft's free guess of a plain step's token was right (None: no
        guess)."""
        tokens, c, still = len(written), self.plain_seconds, []
        self._follow_guesses(guess_right if kind == "plain" else None)
        for shadow in self.shadows:  # the copy trees not verified, along what the target wrote
            accepted, _, settled = shadow[0].follow(written)
            shadow[1] += accepted
            # a clear win already: its copies so far beat plain decoding's tokens in its time by one
            measured = self.copies.measured
            winning = c is not None and measured is not None and shadow[1] > measured / c
            if settled or winning:
                self.copies.imagine(shadow[1] + 1, c, self.step)
            else:
                still.append(shadow)
        self.shadows = still
        if kind == "plain":
            self.last_plain = self.step
            if seconds > 0:  # c: an exponential average of plain steps (one token each)
                self.plain_seconds = _ema(self.plain_seconds, seconds)
            self.copies.judge(self.plain_seconds, self.step)  # evidence waiting for c
            self.drafts.judge(self.plain_seconds, self.step)
        elif kind == "copy":
            self.copies.record(tokens, seconds, self.plain_seconds, self.step)
        elif kind == "draft":
            self.drafts.record(tokens, seconds, self.plain_seconds, self.step)
        elif kind == "catch-up":
            self.drafts.charge(tokens, seconds, self.plain_seconds, pending)
        self.step += 1

    def _follow_guesses(self, right: bool | None) -> None:
        """The chain imagined from the first plain step of a run: one more right guess below its
        depth, or it ends here with the target's token (an imagined draft step)."""
        if right is None:  # no guess, or a step that was not plain: the chain is unknown
            self.guessed = None
            return
        accepted = self.guessed or 0
        if right and accepted < self.draft_depth:
            self.guessed = accepted + 1
            return
        self.guessed = None
        self.drafts.imagine(accepted + 1, self.plain_seconds, self.step)


def _ema(old: float | None, new: float) -> float:
    return new if old is None else (1 - TUNING.plain_memory) * old + TUNING.plain_memory * new
