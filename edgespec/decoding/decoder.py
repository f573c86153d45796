"""Plain decoding and the speculative loop: plan → pack → verify → commit.

Each step makes exactly one target decode (two for a planner that ``needs_target_root``: the root
first, alone) and yields a ``StepEvent`` with the tokens it committed, each marked with its
provenance. The loop reaches the models only through ``engine.ports`` (``Pair``, ``Target``,
``Draft``): the real engine, or a small fake in unit tests.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from time import perf_counter

import numpy as np

from ..engine.interrupts import Cancelled
from ..engine.ports import Draft, DraftWork, Pair, Pending, Target, Verified, Vocab
from ..planner.base import Planner
from ..planner.inputs import PlanContext, Prepaid
from ..planner.tree import DraftTree, SparseDist, TreeBuilder
from .events import EmittedToken, Provenance, StepEvent, StepTimings
from .sampling import SamplingParams, sample
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
    pair: Pair, planner: Planner | None, request: Request, cancel: threading.Event | None = None
) -> Iterator[StepEvent]:
    """Stream the answer to ``request``; ``planner=None`` decodes plainly (one token per step)."""
    rng = np.random.default_rng(request.sampling.seed)
    start = perf_counter()
    root = int(request.prompt[-1])
    draft = None
    if planner is not None and planner.needs_draft:
        pair.set_up_draft(planner.draft_setup())  # the plain draft, or a parallel drafter (ParallelSpec)
        draft = pair.draft
    if draft is not None:
        draft.defer(request.prompt)  # read with the first draft level: after the first token
        draft.begin_step(request.sampling.temperature)
    pair.target.use_sampling(request.sampling)
    # The prompt's new part in one target decode, its last token with logits: the first token's row.
    try:
        pending = pair.target.start_prefill(request.prompt, cancel)
        if draft is not None and _may_overlap(planner, pending):
            # over RPC the draft catches up and guesses past the prompt while the target decodes it
            _overlap(pair, TreeBuilder(root).freeze(), pending)
        prefilled = pending.result()
        cached = prefilled.cached
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
            step = first_token(pair, planner, root, prefilled.first, request.sampling, rng)
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
            if draft is not None:
                draft.drop_ahead()  # the cache holds the conversation only, as between replies
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


def _cut(
    tokens: tuple[EmittedToken, ...], model: Vocab, budget: int
) -> tuple[tuple[EmittedToken, ...], str | None]:
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
def plain_step(target: Target, root: int, params: SamplingParams, rng: np.random.Generator) -> _Step:
    start, decoding = perf_counter(), target.llama_seconds
    out = target.decode_root(root)
    verified = perf_counter()
    token, margin = choose(out, 0, params, rng)
    emitted = (EmittedToken(token, Provenance.TARGET, margin),)
    end = perf_counter()
    python = end - start - (target.llama_seconds - decoding)
    timings = StepTimings(verify=verified - start, bookkeeping=end - verified, python=python)
    event = StepEvent(tokens=emitted, text="", drafted=0, accepted=0, timings=timings)
    return _Step(emitted, token, event)


def first_token(
    pair: Pair, planner: Planner | None, root: int, first: Verified, params: SamplingParams, rng
) -> _Step:
    """A reply's first token, from the target's output at the prompt's last token (``root``, decoded with the
    prompt): no draft work waited for. The draft, which reads the rest of the prompt with its first
    level later (over RPC: what it did not read while the target decoded the prompt), queues the token
    as its next root — or, when it guessed it during that decode, keeps what it decoded past it."""
    start = perf_counter()
    token, margin = choose(first, 0, params, rng)
    emitted = (EmittedToken(token, Provenance.TARGET, margin),)
    tree = TreeBuilder(root).freeze()  # the root alone, as a step that drafted nothing
    if planner is not None and planner.needs_draft and pair.draft is not None:
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


def choose(out: Verified, node: int, params: SamplingParams, rng: np.random.Generator) -> tuple[int, float]:
    """The target's token after ``node`` (its argmax, or a draw from p) and its top-1 − top-2 margin.
    The same draw as ``verify_sampling`` at a node without children."""
    best, margin = out.top(node)
    return (best if params.greedy else sample(out.probs(node, params), rng)), margin


# -- speculative decoding ---------------------------------------------------------------------------
class _NoDraft:
    """The draft for planners that need none (``needs_draft = False``): no work, no time."""

    top_k = vocab_limit = 0
    llama_seconds = 0.0
    work = DraftWork()
    pending: Sequence[int] = ()

    def expand(self, tree: TreeBuilder, nodes: Sequence[int]) -> list[SparseDist]:
        raise RuntimeError("a planner that needs no draft expanded a node (planner bug)")

    def parallel_dists(self, tree: TreeBuilder, k: int) -> list[SparseDist]:
        raise RuntimeError("a planner that needs no draft asked for a parallel pass (planner bug)")

    def piece(self, token: int) -> bytes:
        raise RuntimeError("a planner that needs no draft read the draft's vocabulary (planner bug)")

    def known(self, path: Sequence[int]) -> bool:
        return False

    def defer(self, tokens: Sequence[int]) -> int:
        return 0

    def begin_step(self, temperature: float) -> None:
        pass

    def commit(self, tree: DraftTree, path: Sequence[int], next_token: int) -> None:
        pass

    def drop_ahead(self) -> None:
        pass


def speculative_step(
    pair: Pair,
    planner: Planner,
    root: int,
    params: SamplingParams,
    rng: np.random.Generator,
    max_nodes: int,
    fresh: bool = True,
) -> _Step:
    """One step; ``fresh``: the request's first (the history may differ from the last request's)."""
    draft: Draft = pair.draft if planner.needs_draft and pair.draft is not None else _NoDraft()
    target = pair.target
    start = step_start = perf_counter()
    decoding = _llama_seconds(target, draft)
    # mcsd-target-init: the target decodes the root alone first (committing it); its output is the
    # distribution the root's children are taken from, and node 0 of the verification below.
    root_out = target.decode_root(root) if planner.needs_target_root else None  # read before the verify
    root_seconds = perf_counter() - start
    history = target.committed if root_out is None else target.committed[:-1]  # before the root
    root_dist = None if root_out is None else root_out.candidates(0, params, draft.top_k, draft.vocab_limit)
    ctx = PlanContext(
        sampling=not params.greedy,
        rng=rng,
        max_nodes=max_nodes,
        history=history,
        fresh=fresh,
        turn_tokens=target.turn_tokens,
        prepaid=Prepaid(draft.known, target.sizes_decoded),
        root_dist=root_dist,
    )
    tree, plan_seconds = plan(draft, planner, root, params.temperature, ctx)
    start = perf_counter()
    pending = target.start_verify(tree, root_out)  # pack + the one target decode
    if _may_overlap(planner, pending):
        _overlap(pair, tree, pending)  # over RPC the draft looks ahead (or catches up) meanwhile
    out = pending.result()
    verified = perf_counter()
    if tree.size == 1 and root_out is None:
        # Nothing drafted (auto's plain steps, a copier without a match): plain decoding, committed
        # already; no walking or re-tagging a one-node tree. Same token, same draw.
        token, margin = choose(out, 0, params, rng)
        verdict = Verdict((0,), token)
        emitted: tuple[EmittedToken, ...] = (EmittedToken(token, Provenance.TARGET, margin),)
    else:
        verdict, path_margins = decide(tree, out, params, rng)
        emitted = provenance(tree, verdict, path_margins)
        target.commit(tree, verdict.path, root_committed=root_out is not None)
    draft.commit(tree, verdict.path, verdict.next_token)
    end, work = perf_counter(), draft.work
    timings = StepTimings(
        draft=work.seconds,
        plan=plan_seconds - work.seconds,
        verify=verified - start + root_seconds,
        bookkeeping=end - verified,
        # the look-ahead's draft decodes overlapped the target's (counted in full): not Python either
        python=end - step_start - (_llama_seconds(target, draft) - decoding - work.ahead_seconds),
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
        draft_decodes=work.decodes,
        reused=work.reused,
        guess=work.guess,
        depth=tree.height,
        leaves=len(tree.leaves),
        expected_accept=tree.stats.expected_accept,
        merges=tree.stats.merges,
        graph_success=any(tree.merged_flags[node] for node in verdict.path),
    )
    planner.observe(event)  # planners that learn from outcomes (auto, the copiers' acceptance rates)
    return _Step(emitted, verdict.next_token, event)


def _llama_seconds(target: Target, draft: Draft) -> float:
    """Time both models have spent inside their decodes so far (a running total: take differences)."""
    return target.llama_seconds + draft.llama_seconds


def _may_overlap(planner: Planner | None, pending: Pending) -> bool:
    """Whether the draft may work while the target decodes: only while the decode is still running (a
    target on RPC servers; here it is over already) and where the planner says drafting meanwhile
    pays (``Planner.may_look_ahead``, asked only then: auto's answer costs a forecast)."""
    if pending.done.is_set() or planner is None:
        return False
    return planner.needs_draft and planner.may_look_ahead


def _overlap(pair: Pair, tree: DraftTree, pending) -> None:
    """The pair's work while the target decodes ``tree`` (``Pair.overlap``: the look-ahead over RPC).
    The target's result is waited for even when that work fails: the model is busy until then."""
    try:
        pair.overlap(tree, pending)
    except BaseException:
        pending.result()
        raise


def plan(
    draft: Draft, planner: Planner, root: int, temperature: float, ctx: PlanContext
) -> tuple[DraftTree, float]:
    """Grow this step's draft tree from ``root`` (the draft model decodes level by level inside, its
    distributions taken at ``temperature``); returns it and the seconds it took."""
    start = perf_counter()
    draft.begin_step(temperature)
    tree = planner.plan(root, draft, ctx)  # ``_NoDraft`` for planners that need none
    return tree, perf_counter() - start


def decide(tree: DraftTree, out: Verified, params: SamplingParams, rng) -> tuple[Verdict, list[float]]:
    """Apply the verification rule to the target's output at each tree node. Also returns the target's
    top-1 − top-2 margin at each node on the accepted path, root first: what ``provenance`` reports."""
    if params.greedy:
        # Every path node is visited, except a LONGEST node (mcsd-target-init's root): its children
        # are the target's candidates, walked without its argmax.
        verdict = verify_greedy(tree, lambda node: out.top(node)[0])
    else:
        verdict = verify_sampling(tree, lambda node: out.probs(node, params), rng)
    return verdict, [out.top(node)[1] for node in verdict.path]


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
