"""Free drafts: continuations copied from the conversation (n-gram lookup), as a tree.

Much of what a coding chat writes repeats text already in the conversation ("add type hints to
this function", "fix the bug in this file", a follow-up that quotes the last answer). Such tokens
can be proposed without any draft decode: find where the text just written occurred before, and
propose what followed it there.

**Index (incremental).** ``NGramIndex`` holds the conversation's tokens t[0..L) and, for every
length n_min ≤ n ≤ n_max, where each n-gram occurred: ``ends[t[i−n+1..i]]`` lists i + 1, the
position its continuation starts, in ascending order. Appending a token adds at most n_max entries;
truncating pops them again (each is the last of its list): O(n_max) per token, never a rescan.
Memory O(n_max · L). ``sync`` brings it to the decoder's history: a request's first step keeps the
longest common prefix with what was indexed (earlier turns stay indexed), later steps only append.

**Matches, longest first.** The suffix to match ends with the pending root (not yet in the
history). The lookup walks n = n_max … n_min over the suffix's last n tokens and takes their
occurrences newest first, skipping continuations a longer n already gave, until ``matches`` are
found: O(n_max² + matches) per step. A match found at length n agrees with the context on n tokens;
one found at n_max is then extended backwards token by token, up to ``AGREE_BINS`` (O(AGREE_BINS) per
match): its true length. Inside a passage the answer re-emits, the match is as long as the passage
so far, and how long tells how sure the copy is — measured on a 6-turn coding conversation (the
bench client's), the top copy's next token was right 0.90 of the time after an 8–11-token match,
0.95 after 16–23, 0.98 after 24–31 and 0.99 after 32 or more (the evidence llama.cpp's
``ngram-mod`` waits for, a 24-token key), where n_max = 8 gave them all one agreement and one
learned rate (0.97 pooled). Chains stay ``max_depth`` long: on a 2-core EPYC, 64-deep chains after
such matches gained where an answer re-emits a passage whole (a rename: 1.45 → 1.51× modelled) and
lost where it leaves the source at every method (added docstrings: 1.22 → 1.12×; a 48-copy tree
broke after 11 copies, another after 5).

**The copy trie.** From a match starting at s, the tokens t[s..s+D) are a chain of continuation;
chains that share a prefix share trie nodes, so several continuations per suffix form one tree.
Each node counts the matches through it, weighted ``WEIGHT_BASE ** n`` (a match one token longer
outweighs four shorter ones: longest match first, the shorter ones still add branches). A chain
stops before the first end-of-turn or chat-template token (``PlanContext.turn_tokens``): past it the
conversation's next turn begins, which this answer does not continue (measured on free prose: an
answer that repeats the prompt's last words drew 15-token copies of "<|im_end|>\nassistant\n…",
never accepted past the words, each verify costing five plain steps).

**Acceptance estimate.** Copying node c below u, at depth d of a match of length n, the context
agrees with the copied text on a = n + d − 1 tokens. Its estimated acceptance given its parent is

    q(c) = r(a) · w(c) / Σ_{c' child of u} w(c')        (w: the matches' weights through the node)

where r(a) is the rate at which the target accepts copies with agreement a — learned online from
every *tested* copy (one whose parent was accepted): r(a) = Σ accepted / Σ share, with a prior
r₀(a) = 0.97 − 0.77 · 0.7^(a−1) worth PRIOR_WEIGHT copies. p̂(c) = Π q along its path, the same
quantity drafted nodes carry, so copies and drafts compete in one budget (``copy_drafts``).

Versus llama.cpp's model-free drafting: prompt lookup / ``ngram-simple`` take the newest match of
one fixed n and draft its continuation as a single chain; the map variants keep per-key counts but
also draft one chain. Here several lengths, several matches as branches, p̂ from counts and learned
rates, and the tree's size chosen by p̂ (or by the cost curves when attached).

Copies are deterministic candidates (``ChildRule.TOP``): the one-hot rule verifies them losslessly,
greedy or sampling. Pure Python + numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .inputs import PlanContext
from .tree import ChildRule, DraftTree, PlanStats, TreeBuilder

WEIGHT_BASE = 4.0  # a match one token longer counts as this many shorter ones
AGREE_BINS = 32  # agreement lengths learned separately; longer ones share the last bin
PRIOR_WEIGHT = 2.0  # the prior counts as this many tested copies per bin
DECAY = 0.98  # per step with tested copies: older evidence fades
Q_MAX = 0.995  # no copy is certain


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    same = np.asarray(a[:n]) == np.asarray(b[:n])
    return int(np.argmin(same))


class NGramIndex:
    """Where every n-gram (n_min ≤ n ≤ n_max) of the conversation occurred, updated token by token."""

    def __init__(self, n_max: int = 8, n_min: int = 1):
        if not 1 <= n_min <= n_max:
            raise ValueError(f"need 1 ≤ n_min ≤ n_max, got n_min={n_min}, n_max={n_max}")
        self.n_max, self.n_min = n_max, n_min
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], list[int]] = {}  # n-gram → continuation starts, ascending

    def append(self, token: int) -> None:
        self.tokens.append(int(token))
        end = len(self.tokens)  # the n-grams ending at the new token continue at `end`
        for n in range(self.n_min, min(self.n_max, end) + 1):
            self.ends.setdefault(tuple(self.tokens[end - n :]), []).append(end)

    def truncate(self, length: int) -> None:
        """Forget tokens from ``length`` on (their n-grams are the last entries of their lists)."""
        while len(self.tokens) > length:
            end = len(self.tokens)
            for n in range(self.n_min, min(self.n_max, end) + 1):
                key = tuple(self.tokens[end - n :])
                starts = self.ends[key]
                starts.pop()
                if not starts:
                    del self.ends[key]
            self.tokens.pop()

    def sync(self, history: Sequence[int], fresh: bool) -> None:
        """Index ``history``: only its new tokens, unless it may have changed (``fresh``) or shrank."""
        if fresh or len(history) < len(self.tokens):
            self.truncate(common_prefix(self.tokens, history))
        for token in history[len(self.tokens) :]:
            self.append(token)

    def matches(self, root: int, limit: int) -> list[tuple[int, int]]:
        """Up to ``limit`` (continuation start, match length) for the indexed tokens followed by
        ``root``: the longest matches first, the newest first within one length."""
        tail = (*self.tokens[-(self.n_max - 1) :], int(root)) if self.n_max > 1 else (int(root),)
        found: list[tuple[int, int]] = []
        taken: set[int] = set()
        for n in range(min(self.n_max, len(tail)), self.n_min - 1, -1):
            for start in reversed(self.ends.get(tail[-n:], ())):
                if start >= len(self.tokens) or start in taken:
                    continue  # nothing follows it yet, or a longer match found it already
                taken.add(start)
                found.append((start, n))
                if len(found) >= limit:
                    return found
        return found


@dataclass
class CopyTrie:
    """Candidate continuations; node 0 is the pending root, parents before children."""

    tokens: list[int]
    parents: list[int] = field(default_factory=lambda: [-1])
    weight: list[float] = field(default_factory=lambda: [0.0])  # Σ WEIGHT_BASE**n of matches through it
    kids_weight: list[float] = field(default_factory=lambda: [0.0])  # Σ weight of its children
    agree: list[int] = field(default_factory=lambda: [0])  # the longest context agreement through it
    kids: list[dict[int, int]] = field(default_factory=lambda: [{}])  # token → child
    # set by ``estimate``, read through ``q``, ``share`` and ``phat``
    _estimates: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False)

    @property
    def size(self) -> int:
        return len(self.tokens)

    @property
    def q(self) -> np.ndarray:
        """(n,) estimated acceptance given the parent."""
        return self._estimated()[0]

    @property
    def share(self) -> np.ndarray:
        """(n,) the node's weight among its siblings'."""
        return self._estimated()[1]

    @property
    def phat(self) -> np.ndarray:
        """(n,) p̂: product of q along the path; 1 at the root."""
        return self._estimated()[2]

    def _estimated(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._estimates is None:
            raise RuntimeError("CopyTrie read before its estimate (call estimate first; planner bug)")
        return self._estimates

    def add_chain(self, chain: Sequence[int], match_len: int) -> None:
        node, w = 0, WEIGHT_BASE**match_len
        for depth, token in enumerate(chain, start=1):
            kid = self.kids[node].get(int(token))
            if kid is None:
                kid = len(self.tokens)
                self.tokens.append(int(token))
                self.parents.append(node)
                self.weight.append(0.0)
                self.kids_weight.append(0.0)
                self.agree.append(0)
                self.kids.append({})
                self.kids[node][int(token)] = kid
            self.weight[kid] += w
            self.kids_weight[node] += w
            self.agree[kid] = max(self.agree[kid], match_len + depth - 1)
            node = kid

    def estimate(self, rate_of: np.ndarray) -> None:
        """q = r(agreement) · share among siblings; p̂ = Π q (``rate_of[a]``: r for agreement a).

        One pass in plain Python: a step's trie has a few dozen nodes, and after a CPU decode this pass
        costs half of what the six numpy calls it replaces did (26 vs 52 µs per step on prose)."""
        rates = rate_of.tolist()
        share, q, phat = [1.0], [1.0], [1.0]
        for node in range(1, self.size):  # parents come first
            parent = self.parents[node]
            s = self.weight[node] / self.kids_weight[parent]
            q_node = min(rates[min(self.agree[node], AGREE_BINS - 1)] * s, Q_MAX)
            share.append(s)
            q.append(q_node)
            phat.append(phat[parent] * q_node)
        self._estimates = np.array(q), np.array(share), np.array(phat)

    def best(self, limit: int, min_phat: float = 0.0) -> np.ndarray:
        """The ≤ ``limit`` non-root nodes of largest p̂ (≥ ``min_phat``), a subtree, in index order.

        q ≤ 1 makes p̂ non-increasing downwards, so the top ones by p̂ (ties: the older node) include
        every parent of theirs."""
        idx = np.arange(1, self.size)
        order = idx[np.lexsort((idx, -self.phat[1:]))]
        order = order[self.phat[order] >= min_phat][: max(limit, 0)]
        return np.sort(order)


def prior_rate(agree: np.ndarray) -> np.ndarray:
    """r₀(a): a short match is often a coincidence, a long one usually continues."""
    return 0.97 - 0.77 * 0.7 ** (np.maximum(agree, 1) - 1)


@dataclass
class Copier:
    """The conversation's index, the learned acceptance rates, and proposals from both."""

    n_max: int = 8  # longest suffix matched
    matches: int = 8  # matches (continuations) per step
    max_depth: int = 16  # longest chain copied from one match
    index: NGramIndex = field(init=False, repr=False)
    accepted: np.ndarray = field(init=False, repr=False)  # (AGREE_BINS,) decayed Σ accepted copies
    predicted: np.ndarray = field(init=False, repr=False)  # (AGREE_BINS,) decayed Σ share of tested copies
    _tree: DraftTree | None = field(default=None, init=False, repr=False)  # the last tree proposed
    _meta: dict[int, tuple[int, float]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.index = NGramIndex(self.n_max)
        self.accepted = PRIOR_WEIGHT * prior_rate(np.arange(AGREE_BINS))
        self.predicted = np.full(AGREE_BINS, PRIOR_WEIGHT)

    @property
    def rates(self) -> np.ndarray:
        """r(a) for a = 0 … AGREE_BINS − 1."""
        return self.accepted / self.predicted

    def propose(self, root_token: int, ctx: PlanContext) -> CopyTrie:
        """The copy trie for this step, with q and p̂ (the index first catches up on the history)."""
        self.index.sync(ctx.history, ctx.fresh)
        self._tree, self._meta = None, {}
        trie = CopyTrie([int(root_token)])
        tokens = self.index.tokens
        for start, n in self.index.matches(root_token, self.matches):
            if n == self.n_max:
                n = self._true_length(start, n)
            chain = tokens[start : start + self.max_depth]
            cut = next((i for i, t in enumerate(chain) if t in ctx.turn_tokens), len(chain))
            if cut:  # the match's continuation up to the end of its turn (the template's markers)
                trie.add_chain(chain[:cut], n)
        trie.estimate(self.rates)
        return trie

    def _true_length(self, start: int, n: int) -> int:
        """A match of ``n`` tokens continuing at ``start``, extended backwards (at most to
        ``AGREE_BINS``): the indexed tokens before the root against those before ``start``."""
        tokens, end = self.index.tokens, len(self.index.tokens)
        while n < AGREE_BINS and start - 1 - n >= 0 and tokens[start - 1 - n] == tokens[end - n]:
            n += 1
        return n

    def grow(self, tree: TreeBuilder, trie: CopyTrie, keep: np.ndarray, at: dict[int, int]) -> None:
        """Add trie nodes ``keep`` (parents first) to ``tree`` as copies; ``at`` maps trie → tree
        nodes (the root: {0: 0}) and is extended. A node already there (equal token under the same
        parent) is reused: one node, reached both ways."""
        existing = {(tree.parents[i], tree.tokens[i]): i for i in range(1, tree.size)}
        q = trie.q
        for node in keep:
            node = int(node)
            parent = at[trie.parents[node]]
            token = trie.tokens[node]
            same = existing.get((parent, token))
            if same is None:
                same = tree.add(parent, token, float(q[node]), copied=True)
                tree.set_children_rule(parent, ChildRule.TOP)  # deterministic candidates: one-hot rule
            at[node] = same
            self.note(same, trie, node)

    def note(self, tree_node: int, trie: CopyTrie, node: int) -> None:
        """Tree node ``tree_node`` carries trie node ``node``: ``observe`` learns from its outcome."""
        self._meta[tree_node] = (min(trie.agree[node], AGREE_BINS - 1), float(trie.share[node]))

    def copy_tree(self, trie: CopyTrie, keep: np.ndarray) -> DraftTree:
        """The tree of copies ``keep`` alone."""
        tree = TreeBuilder(trie.tokens[0])
        self.grow(tree, trie, keep, {0: 0})
        return self.remember(tree.freeze(PlanStats(expected_accept=float(trie.phat[keep].sum()))))

    def remember(self, tree: DraftTree) -> DraftTree:
        """Mark ``tree`` as the one whose outcome ``observe`` learns from (node meta from ``grow``)."""
        self._tree = tree
        return tree

    def observe(self, tree: DraftTree | None, path: Sequence[int]) -> None:
        """Learn r(a) from the copies the target tested (their parent was accepted)."""
        if tree is None or tree is not self._tree or not self._meta:
            return
        on_path = set(int(n) for n in path)
        tested = [(node, m, s) for node, (m, s) in self._meta.items() if int(tree.parents[node]) in on_path]
        if not tested:
            return
        self.accepted *= DECAY
        self.predicted *= DECAY
        for node, agree, share in tested:
            self.accepted[agree] += float(node in on_path)
            self.predicted[agree] += share
        self._meta = {}
