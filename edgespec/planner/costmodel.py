"""The cost model and the forecasts ``auto`` decides with: what a tree of m draft tokens is expected to
yield, what it costs on this hardware, and how a step's growth would go.

A step's rate is its expected tokens per second,

    rate(tree) = (1 + r · E) / (spent + c_t(m + 1) + overhead),

with E = Σ p̂ over the tree's m draft tokens (OPT-Tree's expected accepted length), r the draft's
calibration (accepted ÷ predicted), ``spent`` the drafting time so far and c_t the target's verify
cost by batch size (root included). Plain decoding is the tree with only the root: rate 1 / c_t(1).

- ``best_size``: the best final m from candidates already predicted (the top m by p̂ form a subtree,
  OPT-Tree Theorem 3.1), so a jump in c_t is crossed only when the extra E pays for it.
- ``deepen``: whether one more draft level (its w best expandable nodes, children predicted from an
  average distribution) beats stopping now; ``chain_on`` looks several levels down a chain, since one
  level ahead never sees past a jump in c_t.
- ``simulate``: a whole step's growth on the average distribution — the forecast.
- ``ceiling``: the best rate any tree could reach with every draft token accepted.

``auto``'s level trees pass p̂ already calibrated token by token (``auto/acceptance.py``) and r = 1.

Pure numpy: the cost curves arrive as data (``edgespec.profile.costs`` measures them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # level widths considered when deepening
CHAIN_LOOKAHEAD = 12  # levels a chain is followed ahead when deciding to deepen by one node
DENSE = 258  # tabulated sizes: beyond the largest tree (255 leaves + root) a context allows


@dataclass(frozen=True)
class CostModel:
    """Seconds per decode by batch size, n = 1…N at index n − 1; linear past N."""

    target: np.ndarray  # (N,) the target verifying n tokens (root included); [0] is plain decoding
    draft: np.ndarray  # (N,) one draft level of n nodes (decode + top-k of every row)
    catchup: np.ndarray  # (N,) the draft decoding n committed tokens in a row
    overhead: float = 3e-4  # Python per speculative step besides the decodes (verify rule, KV, event)
    look_ahead: bool = False  # the draft works while the target verifies (a target on RPC servers)

    @classmethod
    def from_functions(
        cls,
        target: Callable[[int], float],
        draft: Callable[[int], float],
        catchup: Callable[[int], float] | None = None,
        n_max: int = 64,
        overhead: float = 0.0,
    ) -> CostModel:
        """Curves from functions of n (tests, synthetic hardware); catch-up defaults to ``draft``."""
        n = range(1, n_max + 1)
        return cls(
            np.array([target(i) for i in n], dtype=np.float64),
            np.array([draft(i) for i in n], dtype=np.float64),
            np.array([(catchup or draft)(i) for i in n], dtype=np.float64),
            overhead,
        )

    def __post_init__(self) -> None:
        # Dense tables for n = 0…DENSE (index n; 0 costs nothing): the planner's hot path indexes them.
        for name in ("target", "draft", "catchup"):
            object.__setattr__(self, f"_{name}", _dense(getattr(self, name)))

    def t(self, n):
        """Target verify of n tokens (vectorised over n)."""
        return _lookup(self._target, self.target, n)

    def d(self, n):
        """One draft level of n nodes."""
        return _lookup(self._draft, self.draft, n)

    def k(self, n):
        """Draft catch-up on n committed tokens."""
        return _lookup(self._catchup, self.catchup, n)


def _extrapolate(curve: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Seconds for sizes n ≥ 0: the curve, then its last segment's slope past its end."""
    size = curve.shape[0]
    slope = max(curve[-1] - curve[-2], 0.0) if size >= 2 else curve[-1]
    inside = curve[np.clip(n, 1, size) - 1]
    out = np.where(n > size, curve[-1] + slope * (n - size), inside)
    return np.where(n <= 0, 0.0, out)


def _dense(curve: np.ndarray) -> np.ndarray:
    return _extrapolate(curve, np.arange(DENSE + 1))


def _lookup(table: np.ndarray, curve: np.ndarray, n):
    if isinstance(n, (int, np.integer)):
        return float(table[n]) if 0 <= n <= DENSE else float(_extrapolate(curve, np.asarray(n)))
    n = np.asarray(n)
    return table[n] if n.size and n.min() >= 0 and n.max() <= DENSE else _extrapolate(curve, n)


@dataclass(frozen=True)
class Choice:
    """A forecast final tree and what it is expected to give."""

    rate: float  # expected tokens per second of the step
    m: int  # draft tokens in the final tree
    expected: float  # Σ p̂ of the final tree (uncorrected)
    seconds: float  # predicted step time


def best_size(
    forced_e: float,
    forced_n: int,
    pool: np.ndarray,
    spent: float,
    ratio: float,
    costs: CostModel,
    cap: int,
) -> Choice:
    """The best final tree: the ``forced_n`` nodes already in it (Σ p̂ = ``forced_e``) plus the m −
    forced_n best candidates of ``pool`` (p̂, sorted descending), m ≤ cap, after ``spent`` seconds of
    drafting. Rate = (1 + r·E) / (spent + c_t(m + 1) + overhead)."""
    extra = np.cumsum(pool[: max(cap - forced_n, 0)])
    e = np.empty(extra.shape[0] + 1)
    e[0] = forced_e
    e[1:] = forced_e + extra
    seconds = spent + costs.overhead + costs.t(np.arange(forced_n + 1, forced_n + e.shape[0] + 1))
    rates = (1.0 + ratio * e) / seconds
    i = int(np.argmax(rates))  # ties: the smaller tree
    return Choice(float(rates[i]), forced_n + i, float(e[i]), float(seconds[i]))


def deepen(
    forced_e: float,
    forced_n: int,
    pool: np.ndarray,
    expandable: np.ndarray,
    spent: float,
    ratio: float,
    costs: CostModel,
    cap: int,
    profile: np.ndarray,
) -> tuple[int, Choice]:
    """Whether to draft one more level: (w, forecast) for the best width w, or (0, stop-now choice).

    ``pool`` holds the candidates' p̂ sorted descending; ``expandable`` marks those that may be
    expanded (depth limit). Expanding the w best expandable ones among the first ``cap − forced_n``
    (``expandable_within``) makes them tree nodes and adds, per node x, predicted children p̂(x) · profile.
    """
    room = max(cap - forced_n, 0)  # candidates past the room left can never enter the tree
    stop = best_size(forced_e, forced_n, pool[:room], spent, ratio, costs, cap)
    can = expandable_within(expandable[: pool.shape[0]], room)
    best_w, best, last = 0, stop, 0.0
    for w in WIDTHS:
        if w > can.shape[0] or w >= room:
            break
        chosen = can[:w]
        rest = np.delete(pool[: room + w], chosen)
        children = np.outer(pool[chosen], profile).ravel()
        new_pool = -np.sort(-np.concatenate((rest, children)))[: room - w]
        go = best_size(
            forced_e + float(pool[chosen].sum()),
            forced_n + w,
            new_pool,
            spent + costs.d(w),
            ratio,
            costs,
            cap,
        )
        if w == 1:  # one level at a time cannot see past a jump in c_t: look down a chain too
            e1 = forced_e + float(pool[chosen].sum())
            deeper = chain_on(e1, forced_n + 1, new_pool, spent + costs.d(1), ratio, costs, cap, profile[0])
            if deeper is not None and deeper.rate > go.rate:
                go = deeper
        if go.rate > best.rate:
            best_w, best = w, go
        elif go.rate < last:
            break  # past the best width (the rate is unimodal in w in practice)
        last = go.rate
    return best_w, best


def expandable_within(expandable: np.ndarray, room: int) -> np.ndarray:
    """Positions of the expandable candidates among the first ``room`` (best p̂ first): one further
    down could never enter the tree, and expanding it would force it in ahead of better ones."""
    return np.flatnonzero(expandable[: max(room, 0)])


def chain_on(
    forced_e: float,
    forced_n: int,
    pool: np.ndarray,
    spent: float,
    ratio: float,
    costs: CostModel,
    cap: int,
    a: float,
) -> Choice | None:
    """The best final tree after drafting L = 1…CHAIN_LOOKAHEAD more levels down the best candidate
    (its child predicted at p̂ · a each time), the other candidates as they are. Seen one level ahead,
    a jump in c_t (8 → 9 tokens on CUDA) never pays; seen a few levels ahead, it may."""
    links = min(CHAIN_LOOKAHEAD, cap - forced_n - 1)
    if pool.shape[0] == 0 or links < 1:
        return None
    chain = float(pool[0]) * a ** np.arange(links + 1)  # the chain's nodes, p̂ each
    rest = pool[1 : max(cap - forced_n, 1)]
    L = np.arange(1, links + 1)[:, None]  # (L, 1) levels drafted down the chain
    k = np.arange(rest.shape[0] + 1)[None, :]  # (1, K) other candidates kept
    e = forced_e + np.cumsum(chain)[:-1][:, None] + np.concatenate(([0.0], np.cumsum(rest)))[None, :]
    m = forced_n + L + k  # draft tokens in the final tree (the chain's last child left out)
    seconds = spent + L * costs.d(1) + costs.t(np.minimum(m + 1, DENSE)) + costs.overhead
    rates = np.where(m <= cap, (1.0 + ratio * e) / seconds, 0.0)
    i, j = np.unravel_index(int(np.argmax(rates)), rates.shape)
    return Choice(float(rates[i, j]), int(m[i, j]), float(e[i, j]), float(seconds[i, j]))


def simulate(
    spent: float, ratio: float, costs: CostModel, cap: int, profile: np.ndarray, max_depth: int
) -> Choice:
    """Forecast of one step's growth on the average draft distribution (children p̂ = p̂(parent)·profile)."""
    forced_e, forced_n = 0.0, 0
    pool = np.sort(profile)[::-1].astype(np.float64)
    depth = np.ones(pool.shape[0], dtype=np.int32)
    while True:
        w, choice = deepen(forced_e, forced_n, pool, depth < max_depth, spent, ratio, costs, cap, profile)
        if w == 0:
            return choice
        can = expandable_within(depth < max_depth, cap - forced_n)[:w]
        forced_e += float(pool[can].sum())
        forced_n += w
        spent += float(costs.d(w))
        children = np.outer(pool[can], profile).ravel()
        child_depth = np.repeat(depth[can] + 1, profile.shape[0])
        keep = np.ones(pool.shape[0], dtype=bool)
        keep[can] = False
        pool = np.concatenate((pool[keep], children))
        depth = np.concatenate((depth[keep], child_depth))
        order = np.argsort(-pool, kind="stable")
        pool, depth = pool[order], depth[order]


def chain_seconds(costs: CostModel, n):
    """One step of a chain of n draft tokens: the draft catches up the root (c_k(1), which also gives
    the first guess), drafts n − 1 more one node a level, and the target verifies root + n."""
    n = np.asarray(n)
    return costs.k(1) + (n - 1) * costs.d(1) + costs.t(n + 1) + costs.overhead


def ceiling(costs: CostModel, cap: int) -> float:
    """The best rate any tree could reach with every draft token accepted: a chain of n (accepted
    length ≤ depth, and a chain is the cheapest way to reach a depth)."""
    n = np.arange(1, max(cap, 1) + 1)
    return float(np.max((1.0 + n) / chain_seconds(costs, n)))


def parallel_ceiling(costs: CostModel, masks: int, cap: int) -> float:
    """The best rate a one-pass ParallelSpec tree could reach with every draft token accepted: a chain
    of n ≤ K + 1 drafted in one pass of 1 + K tokens."""
    n = np.arange(1, max(min(cap, masks + 1), 1) + 1)
    seconds = costs.k(1 + masks) + costs.t(n + 1) + costs.overhead
    return float(np.max((1.0 + n) / seconds))


@dataclass(frozen=True)
class DraftFit:
    """How well this draft predicts this target, measured on the target's own greedy answer: the
    draft's mean top-j probabilities there, and r = Σ [draft's top-1 = target's token] ÷ Σ top-1 p̂."""

    profile: np.ndarray  # (PROFILE_LEN,) mean top-j probabilities of the draft's distributions
    ratio: float  # accepted ÷ predicted for a one-token draft at each position
    tokens: int  # positions it was measured on
    runs: tuple[float, ...] = ()  # [n − 1]: share of positions where its top-1 is right n times in a row
