"""``auto``'s tuned constants, each once: what it controls and where its value came from.

The modules read ``TUNING`` (a frozen ``Tuning``) when they use a value. Constants fixed by the
algorithm rather than tuned stay where they are used; ``PROFILE_LEN``, the length of every top-j
profile (the tuned ``prior_profile`` and ``probe_profile`` below, the pair's fit), is here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

PROFILE_LEN = 4  # children predicted per expanded node in forecasts (the profiles' length)


def _frozen(*values: float) -> np.ndarray:
    array = np.array(values)
    array.flags.writeable = False
    return array


@dataclass(frozen=True)
class Tuning:
    # -- the planner (``planner``) --------------------------------------------------------------------
    # what a probe hopes the draft to be (at least): its top-j profile, PROFILE_LEN long
    probe_profile: np.ndarray = field(default_factory=lambda: _frozen(0.9, 0.05, 0.02, 0.01))

    # -- the policy (``policy``) ----------------------------------------------------------------------
    horizon: int = 8  # the draft's catch-up after plain steps is spread over this many speculative steps
    margin: float = 0.03  # speculate when the forecast beats plain decoding by this fraction
    credit_max: int = 64  # probe credit is capped at this many plain decodes (within one long answer)

    # -- the acceptance curve (``acceptance``) --------------------------------------------------------
    acceptance_decay: float = 0.97  # per learning step (a verified tree, or a free guess): older trials fade
    # The prior's pull, 1 / variance, on a and on b. The slope a is held firmly: trials at one q (a
    # confident draft's) cannot tell a from b, and a small a would give every unlikely sibling a fair
    # chance.
    acceptance_prior_weight: np.ndarray = field(default_factory=lambda: _frozen(8.0, 1.0))
    # trials remembered (older ones weigh < acceptance_decay^60 ≈ 0.16 at ≥ 4 trials per step)
    trials_kept: int = 256
    # a pair's fit pulls on b as this many of its trials at most (``Acceptance.from_rate``): its 64
    # positions are other text, greedy, whose agreement overstates a sampled answer's (on the 7B/14B
    # curves of tests/engine/test_auto_targets.py, 24 held that optimism until a 14B lost 12 % to the
    # best chain; 0 let four unlucky steps stop a 7B's drafting for its answer)
    fit_trials: int = 8
    a_range: tuple[float, float] = (0.4, 2.5)  # the curve's slope a stays within this range
    b_range: tuple[float, float] = (-8.0, 8.0)  # … and its intercept b within this one

    # -- calibration (``calibration``) ----------------------------------------------------------------
    # a typical draft's top-j probabilities (PROFILE_LEN long): where the profile starts without a fit
    prior_profile: np.ndarray = field(default_factory=lambda: _frozen(0.6, 0.12, 0.05, 0.03))
    one_pass_prior_weight: float = 4.0  # the one-pass trees' prior r counts as this many predicted tokens
    profile_memory: float = 8.0  # the running profile weighs as this many nodes against a step's new ones
    one_pass_decay: float = 0.97  # per observed one-pass step: older steps fade
    factor_range: tuple[float, float] = (0.25, 8.0)  # learned cost factors stay within this range
    # per step, on the drafting factor's sums (a mean of per-step ratios let one 30 ms level that also
    # paid a wait say "8x")
    draft_decay: float = 0.7
    one_off_share: int = 4  # over RPC a tree size not decoded yet costs its one-off ÷ this (``sizing``)
    look_ahead_chain: int = 4  # the chain the look-ahead's prior assumes (``Calibration._look_ahead_prior``)

    # -- copies (``copies``) ----------------------------------------------------------------------------
    copy_prior: float = 8.0  # r_c's prior (1) counts as this many predicted copied tokens
    copy_fade: float = 0.97  # per step: the copy steps' evidence fades towards the prior
    copy_ratio_max: float = 1.25  # r_c may correct the estimates upwards this far at most

    # -- the guard (``guard``) --------------------------------------------------------------------------
    guard_decay: float = 0.9  # per step of its kind: evidence older than ~10 steps fades
    loss_budget: float = 2.0  # tokens a kind may lose (weighted Σ of its excess) before it is stopped
    min_steps: int = 3  # steps before the steady-loss test
    z: float = 1.0  # the steady-loss test's margin, in standard errors of the mean excess
    sigma_floor: float = 0.5  # tokens: the least spread assumed for a step's excess
    first_backoff: int = 16  # steps before the first retry, at least
    max_backoff: int = 4096  # the longest wait between retries (answers apart)
    # the time a losing trial lost is at most this share of its wait (a trial of huge trees that lost
    # ten plain steps' time waits 500 steps)
    retry_share: float = 0.02
    calm_steps: int = 16  # steps of a kind without losing that reset its back-off
    catch_up_free: int = 4  # pending tokens a draft catches up on without that counting as a one-off cost
    plain_refresh: int = 128  # steps after which plain decoding is measured again (one plain step)
    plain_memory: float = 0.2  # weight of a new step in plain decoding's measured step time (c: an EMA)
    # a kind's step time: the median of its last this many steps (one huge copy tree that lost, 47 copies
    # among 7-copy steps, had raised their mean to most of its own time)
    recent: int = 9

    # -- tree builders (``trees``) ----------------------------------------------------------------------
    children_kept: int = 8  # candidates per expanded node that may enter the tree
    step_prior: float = 2.0  # within a step, the running profile counts as this many of the step's own nodes


TUNING = Tuning()
