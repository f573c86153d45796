"""Plain decoding and the speculative loop: plan → pack → verify → commit.

Each step makes exactly one target decode (two for a planner that ``needs_target_root``: the root
first, alone) and yields a ``StepEvent`` with the tokens it committed, each marked with its
provenance. The loop runs on any object with the ``ModelPair`` shape (the real engine, or a small
fake in unit tests).
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from time import perf_counter

import numpy as np

from ..engine.interrupts import Cancelled
from ..engine.rows import argmax_margin, draft_dists
from ..planner.tree import DraftTree, PlanContext, Planner, SparseDist, TreeBuilder
from .events import EmittedToken, Provenance, StepEvent, StepTimings
from .sampling import SamplingParams, sample, target_probs
from .text import Detokenizer, StopStrings
from .verify import Verdict, verify_greedy, verify_sampling


@dataclass(frozen=True)
class Request:
    prompt: Sequence[int]  # token ids; the last one becomes the first pending root
    max_tokens: int = 256
    sampling: SamplingParams = SamplingParams()
    stop: Sequence[str] = ()


@dataclass(frozen=True)
class _Step:
    """One step before text and stop handling."""

    tokens: tuple[EmittedToken, ...]
    next_root: int
    event: StepEvent


def generate(
    pair, planner: Planner | None, request: Request, cancel: threading.Event | None = None
) -> Iterator[StepEvent]:
    """Stream the answer to ``request``; ``planner=None`` decodes plainly (one token per step)."""
    rng = np.random.default_rng(request.sampling.seed)
    start = perf_counter()
    root = int(request.prompt[-1])
    meanwhile = None
    if planner is not None and planner.needs_draft:
        pair.set_up_draft(planner.draft_setup())  # the plain draft, or a parallel drafter (ParallelSpec)
        pair.draft.defer(request.prompt)  # read with the first draft level: after the first token
        pair.draft.begin_step(request.sampling.temperature)
        # over RPC the draft catches up and guesses past the prompt while the target decodes it
        meanwhile = _look_ahead(pair.draft, planner, pair.target, TreeBuilder(root).freeze())
    # The prompt's new part in one target decode, its last token with logits: the first token's row.
    try:
        first_row, cached = pair.target.prefill(request.prompt, meanwhile, cancel)
    except Cancelled:  # the client left during the prompt: the model is free for the next one at once
        yield _finish("cancelled", "")
        return
    prefill = perf_counter() - start
    detok = Detokenizer(pair.target.model.piece)
    stops = StopStrings(request.stop)
    produced, fresh, first = 0, True, True
    while True:
        if cancel is not None and cancel.is_set():
            yield _finish("cancelled", stops.flush())
            return
        room = pair.target.n_ctx - len(pair.target.committed)
        if room < 1:
            yield _finish("context", stops.flush())
            return
        if first:  # the first token waits for the prompt's decode only, never for the draft
            step = first_token(pair, planner, root, first_row, request.sampling, rng)
        elif planner is None:
            step = plain_step(pair.target, root, request.sampling, rng)
        else:
            # no deeper than the answer may still go: r tokens left are r − 1 drafts and the target's own
            nodes = min(room, pair.max_nodes, request.max_tokens - produced)
            step = speculative_step(pair, planner, root, request.sampling, rng, max_nodes=nodes, fresh=fresh)
            fresh = False  # the planner's first step of this request is behind us
        root, first = step.next_root, False
        tokens, finish = _cut(step.tokens, pair.target.model, request.max_tokens - produced)
        produced += len(tokens)
        text = stops.feed("".join(detok.push(t.id) for t in tokens))
        if stops.stopped:
            finish = "stop"
        if finish is not None:
            text += detok.flush() if finish != "stop" else ""
            if planner is not None and planner.needs_draft:
                pair.draft.drop_ahead()  # the cache holds the conversation only, as between replies
        yield replace(
            step.event,
            tokens=tokens,
            text=text,
            finish_reason=finish,
            prefill_seconds=prefill,
            cached_tokens=cached,
            committed=len(step.tokens),
        )
        prefill, cached = 0.0, 0
        if finish is not None:
            return


def _cut(tokens: tuple[EmittedToken, ...], model, budget: int) -> tuple[tuple[EmittedToken, ...], str | None]:
    """Stop at end-of-generation tokens (not shown) and at the token budget, whichever comes first."""
    for i, tok in enumerate(tokens):
        if model.is_eog(tok.id) and i <= budget:
            return tokens[:i], "stop"
    if len(tokens) >= budget:
        return tokens[:budget], "length"
    return tokens, None


def _finish(reason: str, text: str) -> StepEvent:
    return StepEvent(
        tokens=(),
        text=text,
        drafted=0,
        accepted=0,
        timings=StepTimings(),
        verified_nodes=0,
        finish_reason=reason,
    )


# -- plain decoding ---------------------------------------------------------------------------------
def plain_step(target, root: int, params: SamplingParams, rng: np.random.Generator) -> _Step:
    start, decoding = perf_counter(), target.ctx.decode_seconds
    row = target.decode_root(root)
    verified = perf_counter()
    token, margin = choose(row, params, rng)
    emitted = (EmittedToken(token, Provenance.TARGET, margin),)
    end = perf_counter()
    python = end - start - (target.ctx.decode_seconds - decoding)
    timings = StepTimings(verify=verified - start, bookkeeping=end - verified, python=python)
    event = StepEvent(tokens=emitted, text="", drafted=0, accepted=0, timings=timings)
    return _Step(emitted, token, event)


def first_token(pair, planner: Planner | None, root: int, row, params: SamplingParams, rng) -> _Step:
    """A reply's first token, from the row of the prompt's last token (``root``, decoded with the
    prompt): no draft work waited for. The draft, which reads the rest of the prompt with its first
    level later (over RPC: what it did not read while the target decoded the prompt), queues the token
    as its next root — or, when it guessed it during that decode, keeps what it decoded past it."""
    start = perf_counter()
    token, margin = choose(row, params, rng)
    emitted = (EmittedToken(token, Provenance.TARGET, margin),)
    tree = TreeBuilder(root).freeze()  # the root alone, as a step that drafted nothing
    if planner is not None and planner.needs_draft:
        pair.draft.commit(tree, (0,), token)  # the step began before the prompt's decode
    seconds = perf_counter() - start
    timings = StepTimings(bookkeeping=seconds, python=seconds)  # its decode is the prompt's (prefill)
    event = StepEvent(
        tokens=emitted,
        text="",
        drafted=0,
        accepted=0,
        timings=timings,
        tree=tree,
        accepted_path=(0,),
        leaves=1,
    )
    return _Step(emitted, token, event)


def choose(row: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> tuple[int, float]:
    """The target's token after ``row`` (its argmax, or a draw from p) and its top-1 − top-2 margin.
    The same draw as ``verify_sampling`` at a node without children."""
    best, margin = argmax_margin(row)
    return (best if params.greedy else sample(target_probs(row, params), rng)), margin


# -- speculative decoding ---------------------------------------------------------------------------
class _NoDraft:
    """The draft for planners that need none (``needs_draft = False``): no work, no time."""

    decode_seconds = 0.0
    decodes = 0
    pending = ()
    reused = 0
    ahead_seconds = 0.0
    guess = None

    def begin_step(self, temperature: float) -> None:
        pass

    def commit(self, tree: DraftTree, path: Sequence[int], next_token: int) -> None:
        pass


def speculative_step(
    pair,
    planner: Planner,
    root: int,
    params: SamplingParams,
    rng: np.random.Generator,
    max_nodes: int,
    fresh: bool = True,
) -> _Step:
    """One step; ``fresh``: the request's first (the history may differ from the last request's)."""
    draft = pair.draft if planner.needs_draft else _NoDraft()
    target = pair.target
    start = step_start = perf_counter()
    decoding = _llama_seconds(pair)
    # mcsd-target-init: the target decodes the root alone first (committing it); its row is the
    # distribution the root's children are taken from, and row 0 of the verification below.
    root_row = target.decode_root(root).copy() if planner.needs_target_root else None
    root_seconds = perf_counter() - start
    history = target.committed if root_row is None else target.committed[:-1]  # before the root
    turns = target.turn_tokens
    tree, plan_seconds = plan(
        draft, planner, root, params, rng, max_nodes, root_row, history, fresh, turns, target.sizes_decoded
    )
    start = perf_counter()
    if tree.size == 1 and root_row is None:
        # Nothing drafted (auto's plain steps, a copier without a match): plain decoding, without
        # packing, walking or re-tagging a one-node tree. Same token, same draw.
        meanwhile = _look_ahead(draft, planner, target, tree)  # over RPC the draft catches up meanwhile
        token, margin = choose(target.decode_root(root, meanwhile), params, rng)
        verified = perf_counter()
        verdict, emitted = Verdict((0,), token), (EmittedToken(token, Provenance.TARGET, margin),)
    else:
        meanwhile = _look_ahead(draft, planner, target, tree)
        layout, target_rows = target.verify(tree, root_row, meanwhile)  # pack + the one target decode
        verified = perf_counter()
        verdict, path_margins = decide(tree, target_rows, params, rng)
        emitted = provenance(tree, verdict, path_margins)
        target.commit(tree, layout, verdict.path, root_committed=root_row is not None)
    draft.commit(tree, verdict.path, verdict.next_token)
    end = perf_counter()
    timings = StepTimings(
        draft=draft.decode_seconds,
        plan=plan_seconds - draft.decode_seconds,
        verify=verified - start + root_seconds,
        bookkeeping=end - verified,
        # the look-ahead's draft decodes overlapped the target's (counted in full): not Python either
        python=end - step_start - (_llama_seconds(pair) - decoding - draft.ahead_seconds),
    )
    event = StepEvent(
        tokens=emitted,
        text="",
        drafted=tree.size - 1,
        accepted=verdict.accepted,
        timings=timings,
        tree=tree,
        accepted_path=verdict.path,
        verified_nodes=tree.size,
        draft_decodes=draft.decodes,
        reused=draft.reused,
        guess=draft.guess,
        depth=tree.height,
        leaves=len(tree.leaves),
        expected_accept=tree.stats.expected_accept,
        merges=tree.stats.merges,
        graph_success=any(tree.merged_flags[node] for node in verdict.path),
    )
    planner.observe(event)  # planners that learn from outcomes (auto, the copiers' acceptance rates)
    return _Step(emitted, verdict.next_token, event)


def _look_ahead(draft, planner: Planner, target, tree: DraftTree):
    """What the draft does while a target on RPC servers verifies ``tree``: it looks ahead along the
    tree's likeliest path (``Draft.look_ahead``), hiding the next step's drafting when the target
    accepts that path — after catching up, when the step drafted nothing (a root-only tree decoded
    plainly, or copies). None where nothing can overlap the verify (a target on this machine), or for
    a planner whose drafting would not pay even done meanwhile (``Planner.may_look_ahead``)."""
    if not (target.remote and planner.may_look_ahead):  # a local target: no question
        return None
    # the last decode of the same kind: the next tree is usually of the same size
    expected = target.verify_seconds if tree.size > 1 else target.plain_seconds
    return lambda done: draft.look_ahead(tree, done, expected)


def _llama_seconds(pair) -> float:
    """Time both models have spent inside llama_decode so far (a running total: take differences)."""
    draft = pair.draft.ctx.decode_seconds if pair.draft is not None else 0.0  # ngram loads no draft
    return pair.target.ctx.decode_seconds + draft


def plan(
    draft,
    planner: Planner,
    root: int,
    params: SamplingParams,
    rng,
    max_nodes: int,
    root_row=None,
    history: Sequence[int] = (),
    fresh: bool = True,
    turn_tokens: frozenset[int] = frozenset(),
    warm: Collection[int] = frozenset(),
) -> tuple[DraftTree, float]:
    """Grow this step's draft tree (the draft model decodes level by level inside). ``root_row``: the
    target's logits after the root, for planners that take the root's children from the target.
    ``history``: the committed tokens before the root (planners that copy from the conversation);
    ``turn_tokens``: the target's end-of-turn and control tokens (copies stop before them)."""
    start = perf_counter()
    draft.begin_step(params.temperature)
    ctx = PlanContext(
        sampling=not params.greedy,
        rng=rng,
        max_nodes=max_nodes,
        history=history,
        fresh=fresh,
        turn_tokens=turn_tokens,
        warm=warm,
    )
    if root_row is None:
        tree = planner.plan(root, draft, ctx)
    else:
        root_dist = target_candidates(root_row, params, draft.top_k, draft.vocab_limit)
        tree = planner.plan(root, draft, ctx, root_dist=root_dist)
    return tree, perf_counter() - start


def target_candidates(row: np.ndarray, params: SamplingParams, k: int, vocab_limit: int) -> SparseDist:
    """The target's k likeliest next tokens that the draft can decode (ids < ``vocab_limit``): ranked by
    logit under greedy; with the target's own sampling distribution p (temperature, top-k, top-p)
    when it samples, so that draws from them are draws from p (truncated to the k best)."""
    if params.greedy:
        return draft_dists(row[None, :], k, 1.0, vocab_limit)[0]
    p = target_probs(row, params)[:vocab_limit]
    k = min(k, int(np.count_nonzero(p)))
    best = np.argpartition(-p, k - 1)[:k]
    best = best[np.argsort(-p[best], kind="stable")]  # most likely first
    return SparseDist(ids=best.astype(np.int32), probs=p[best])


def decide(
    tree: DraftTree, target_rows: np.ndarray, params: SamplingParams, rng
) -> tuple[Verdict, list[float]]:
    """Apply the verification rule to the target's rows (one per tree node). Also returns the target's
    top-1 − top-2 margin at each row on the accepted path, root first: what ``provenance`` reports."""
    if params.greedy:
        tops: dict[int, tuple[int, float]] = {}

        def argmax_at(node: int) -> int:
            tops[node] = argmax_margin(target_rows[node])  # each visited row read once
            return tops[node][0]

        verdict = verify_greedy(tree, argmax_at)
        # Every path node was visited, except a LONGEST node (mcsd-target-init's root): its children
        # are the target's candidates, walked without its argmax.
        tops_on_path = [tops.get(node) or argmax_margin(target_rows[node]) for node in verdict.path]
    else:
        verdict = verify_sampling(tree, lambda node: target_probs(target_rows[node], params), rng)
        tops_on_path = [argmax_margin(target_rows[node]) for node in verdict.path]
    return verdict, [margin for _, margin in tops_on_path]


def provenance(tree: DraftTree, verdict: Verdict, path_margins: list[float]) -> tuple[EmittedToken, ...]:
    """The committed tokens: accepted drafts (decided at their parent's row), then the target's own;
    each with the target's margin at the row that decided it (``path_margins``: from ``decide``)."""
    emitted = [
        EmittedToken(tree.token_ids[node], _source(tree, node), margin)
        for node, margin in zip(verdict.path[1:], path_margins)
    ]
    emitted.append(EmittedToken(verdict.next_token, Provenance.TARGET, path_margins[-1]))
    return tuple(emitted)


def _source(tree: DraftTree, node: int) -> Provenance:
    """Who proposed an accepted node: a GSD replica, a copy from the conversation (also when the
    draft proposed it too: copying alone would have), or the draft."""
    if tree.merged_flags[node]:
        return Provenance.MERGED
    return Provenance.COPIED if tree.copied_flags[node] else Provenance.DRAFT
