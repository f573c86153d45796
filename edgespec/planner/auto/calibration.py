"""``auto``'s calibration: the cost curves it decides with and what it learns from the steps it ran.

- **Curves** (``effective``): the pair's measured cost profile (``edgespec.profile.costs``) with two
  learned factors, measured ÷ profiled cost of batches (n ≥ 2) and of drafting, each over the same
  ratio for plain decoding — so a profile taken on a busy machine is corrected, whatever the load now.
  Over RPC a batch size the target has not decoded yet costs more once (``one_off``): trees are sized
  on curves that charge it (``sizing``).
- **the acceptance curve** (``acceptance``): the chance the draft's guess is the target's token
  as a function of its probability q, learnt from the verified trees' trials. A node's chance is the
  product of its path's; a tree's expected yield their Σ. Over RPC a step that drafted nothing counts
  too: the draft guessed its root's next token while the target decoded (``learn_guess``).
- **profile**: the draft's average top-j probabilities, which forecasts grow children from
  (``chances``: through the curve).
- **the pair's fit** (``DraftFit``, measured once per pair by ``edgespec.profile.fit``): where r and
  the profile start, instead of a typical draft's. Without it a forecast on a flat cost curve (the
  target behind a slow link) can say "plain" for a draft whose real top-1 is 0.8, and short answers
  never earn a probe that would teach it otherwise.
- **one-pass trees** (ParallelSpec): their own r (the masks' rows are not the draft's), and the
  expected length and size they came to.

The copies' calibration r_c is ``copies.CopySteps``'s.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np

from ..costmodel import CostModel, DraftFit
from ..tree import SparseDist
from .acceptance import Acceptance, trials
from .tuning import PROFILE_LEN, TUNING


@dataclass
class Calibration:
    costs: CostModel | None = None  # the pair's profile (None: not measured yet → plain decoding)
    _effective: CostModel | None = field(default=None, repr=False)  # ``effective``'s (set with ``costs``)
    acceptance: Acceptance = field(default_factory=Acceptance)  # the chance a guess is right, by its q
    profile: np.ndarray = field(default_factory=lambda: TUNING.prior_profile.copy())
    batch_factor: float = 1.0  # measured ÷ profiled verify of n ≥ 2 tokens, over plain decoding's
    draft_factor: float = 1.0  # measured ÷ profiled drafting, over plain decoding's
    plain_verify: float | None = None  # measured plain decode (EMA)
    par_accepted: float = TUNING.one_pass_prior_weight  # one-pass trees: decayed Σ accepted
    par_predicted: float = TUNING.one_pass_prior_weight  # … and Σ p̂
    par_expected: float = 1.0  # their Σ p̂ (EMA; prior: one token per step)
    par_size: float = 0.0  # their size (EMA; 0: none seen yet)
    draft_predicted: float = 0.0  # the last step's drafting seconds as profiled (set by the trees)
    chain_hit: float | None = None  # the fit's P(top-1 right look_ahead_chain + 1 times in a row)
    epoch: int = 0  # bumped whenever anything a forecast reads changes
    _factors_used: tuple[float, float] = (1.0, 1.0)
    one_off: float = 0.0  # over RPC: seconds a batch size's first verify costs extra (EMA; ``sizing``)
    _sizing: tuple[tuple, CostModel] | None = None  # (key, curves) of the last ``sizing``
    # decayed Σ drafting seconds (measured, profiled); None until a step measured it (the prior rules)
    _drafting: tuple[float, float] | None = None

    @property
    def profiled(self) -> CostModel:
        """``costs``, where the caller knows they are set (what reads the curves runs only then)."""
        if self.costs is None:
            raise RuntimeError("auto's calibration read before its cost profile was set (planner bug)")
        return self.costs

    @property
    def effective(self) -> CostModel:
        """The profile with the learned factors applied (set whenever ``costs`` is)."""
        if self._effective is None:
            raise RuntimeError("auto's calibration read before its cost profile was set (planner bug)")
        return self._effective

    def set_costs(self, costs: CostModel) -> None:
        """Start from the pair's measured cost curves (``AutoPlanner.prepare``)."""
        self.costs = costs
        self._apply_factors()
        self._look_ahead_prior()

    def set_fit(self, fit: DraftFit) -> None:
        """Start the acceptance curve and the profile from the pair's measured fit."""
        top1 = float(fit.profile[0])
        self.acceptance = Acceptance.from_rate(top1, fit.ratio * top1, fit.tokens)
        self.profile = np.asarray(fit.profile, dtype=np.float64).copy()
        self.chain_hit = (
            fit.runs[TUNING.look_ahead_chain] if len(fit.runs) > TUNING.look_ahead_chain else None
        )
        self.epoch += 1
        self._look_ahead_prior()

    def _look_ahead_prior(self) -> None:
        """Where the draft looks ahead while the target verifies (``costs.look_ahead``), a step's
        drafting is done already when the target accepted the last tree's likeliest path and then
        wrote the draft's top-1 token: for a chain of n, when the draft's top-1 was right n + 1 times
        in a row — as often as the pair's fit saw that (``DraftFit.runs``; without it α^(n + 1) at a
        per-token acceptance α = chance(p₁), which misses that right guesses come in runs). Until steps
        have measured it, the drafting factor is what is left on average, 1 − P(hit) with n =
        ``look_ahead_chain`` (the steps then correct it)."""
        if self.costs is None or not self.costs.look_ahead or self._drafting is not None:
            return
        hit = self.chain_hit
        if hit is None:
            hit = self.acceptance.chance(float(self.profile[0])) ** (TUNING.look_ahead_chain + 1)
        self.draft_factor = float(np.clip(1.0 - hit, *TUNING.factor_range))
        self._apply_factors()

    def sizing(self, warm: Collection[int]) -> CostModel:
        """The curves trees are sized with: ``effective``, where over RPC each size the target has not
        decoded yet (not in ``warm``) also costs its one-off ÷ ``one_off_share`` (the verifies of that
        size assumed to share it) — trees keep to the sizes paid for unless a new one is clearly better.
        Whether to draft at all is decided on ``effective``: a one-off is no reason to stop."""
        if self.one_off <= 0:
            return self.effective
        key = (id(self.effective), self.one_off, len(warm))  # ``warm`` only grows within a process
        if self._sizing is None or self._sizing[0] != key:
            c = self.effective
            target = c.target.copy()
            new = [n - 1 for n in range(2, target.shape[0] + 1) if n not in warm]
            target[new] += self.one_off / TUNING.one_off_share
            self._sizing = key, CostModel(target, c.draft, c.catchup, c.overhead, c.look_ahead)
        return self._sizing[1]

    @property
    def plain_decode(self) -> float:
        """c_t(1) as profiled: one plain decode."""
        return float(self.profiled.target[0])

    @property
    def chances(self) -> np.ndarray:
        """The profile through the acceptance curve: the chances of a node's best children."""
        return self.acceptance.chances(self.profile)

    @property
    def par_ratio(self) -> float:
        return self.par_accepted / self.par_predicted

    def _apply_factors(self) -> None:
        """The curves decisions use: the profile, batches and drafting scaled by the learned factors."""
        c = self.profiled
        target = c.target.copy()
        target[1:] *= self.batch_factor
        draft, catchup = c.draft * self.draft_factor, c.catchup * self.draft_factor
        self._effective = CostModel(target, draft, catchup, c.overhead, c.look_ahead)
        self._factors_used = (self.batch_factor, self.draft_factor)
        self.epoch += 1

    # -- learning -------------------------------------------------------------------------------------
    def learn_plain(self, event) -> None:
        self.plain_verify = _ema(self.plain_verify, event.timings.verify, 0.2)

    def learn_costs(self, event, first: bool = False) -> None:
        """Measured ÷ profiled for the tree's verify and its drafting, over the same for plain decoding;
        the curves are rescaled when a factor moved by more than a tenth. ``first``: the target had not
        decoded a batch of this size before — one-off work, no evidence of what batches cost (over RPC
        it is large, and learnt as ``one_off``)."""
        costs = self.profiled
        plain = (self.plain_verify / self.plain_decode) if self.plain_verify else 1.0
        size, verify = event.verified_nodes, event.timings.verify
        if size >= 2 and verify > 0 and not first:
            measured = verify / float(costs.t(size)) / plain
            self.batch_factor = float(np.clip(_ema(self.batch_factor, measured, 0.3), *TUNING.factor_range))
        elif size >= 2 and verify > 0 and costs.look_ahead:
            expected = float(costs.t(size)) * self.batch_factor * plain
            self.one_off = _ema(self.one_off or None, max(verify - expected, 0.0), 0.5)
        drafting = event.timings.draft + event.timings.plan
        if self.draft_predicted > 0 and drafting > 0:
            # decayed Σ measured ÷ Σ profiled drafting: a step that drafted little weighs little (a
            # mean of per-step ratios let one 30 ms level that also paid a wait say "8x")
            if self._drafting is None:  # the prior, worth 0.3 of the first measured step (after decay)
                prior = self.draft_predicted * (1 - TUNING.draft_decay) / TUNING.draft_decay
                self._drafting = (self.draft_factor * prior, prior)
            seen, profiled = self._drafting
            self._drafting = (
                TUNING.draft_decay * seen + drafting / plain,
                TUNING.draft_decay * profiled + self.draft_predicted,
            )
            self.draft_factor = float(np.clip(self._drafting[0] / self._drafting[1], *TUNING.factor_range))
        used_b, used_d = self._factors_used
        if abs(self.batch_factor / used_b - 1) > 0.1 or abs(self.draft_factor / used_d - 1) > 0.1:
            self._apply_factors()

    def learn_tree(self, event) -> None:
        """A level-by-level draft tree: the acceptance curve from its trials, and the draft's top-j
        profile from its distributions."""
        tree = event.tree
        if tree is None:
            return
        self.acceptance.learn(trials(tree, event.accepted_path))
        if tree.dists:
            self._learn_profile(list(tree.dists.values()))
        self.epoch += 1

    def _learn_profile(self, dists: list[SparseDist]) -> None:
        """The running top-j profile moves towards these distributions' mean, each worth one node."""
        tops = np.zeros((len(dists), PROFILE_LEN))
        for i, dist in enumerate(dists):
            k = min(PROFILE_LEN, dist.probs.shape[0])
            tops[i, :k] = dist.probs[:k]
        weight = len(dists) / (len(dists) + TUNING.profile_memory)
        self.profile = (1 - weight) * self.profile + weight * tops.mean(axis=0)

    def learn_guess(self, guess: SparseDist, token: int) -> None:
        """A step that drafted nothing, over RPC: the draft's distribution at its root, decoded while
        the target decoded, against the token the target wrote there — a one-token tree that cost
        nothing, so the curve and the profile stay current while auto decodes plainly (no probe)."""
        if guess.ids.shape[0] == 0:
            return
        self.acceptance.learn([(float(guess.probs[0]), int(guess.ids[0]) == token)])
        self._learn_profile([guess])
        self.epoch += 1

    def learn_one_pass(self, event) -> None:
        """A one-pass tree: its own r, expected length and size."""
        self.par_accepted = TUNING.one_pass_decay * self.par_accepted + event.accepted
        self.par_predicted = TUNING.one_pass_decay * self.par_predicted + event.expected_accept
        self.par_expected = _ema(self.par_expected, event.expected_accept, 0.2)
        self.par_size = _ema(self.par_size or None, event.drafted, 0.2)
        self.epoch += 1


def _ema(old: float | None, new: float, alpha: float) -> float:
    return new if old is None else (1 - alpha) * old + alpha * new
