"""Run plain decoding and each strategy on the same prompts, interleaved, and pair the results.

Order per prompt, for strategies S1 … Sk:  P S1 P S2 P … Sk P  (P = plain decoding), the strategies
rotated by one place from prompt to prompt; a strategy with ``repeats`` r > 1 comes back in later
rounds (P S1 P S2 P S1 P …). Every strategy run sits between two plain runs of the same prompt, so
its **paired ratio** — its tokens/s over the tokens/s of the two plain runs around it — cancels slow
drift of the machine (thermal state, other processes starting or stopping) to first order.
Summaries use the median and spread of these ratios over all runs of the strategy.

Timing: the prompt is decoded into both caches before the clock starts (prefill is reported apart,
once per prompt: later runs of the same prompt find it in the cache); the clock then covers the
whole generation loop — draft, verify, planning and bookkeeping, detokenisation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from statistics import median
from time import perf_counter

import numpy as np

from ..decoding.chat import ChatSettings, Message, prompt_tokens
from ..decoding.decoder import Request, generate
from ..decoding.events import GenerationStats
from ..decoding.sampling import SamplingParams
from .prompts import PromptCase

PLAIN = "plain"
Progress = Callable[[str, int, int], None]  # (what, done, total)


@dataclass(frozen=True)
class Variant:
    """One strategy at one budget, and the planner that runs it (kept for the whole bench)."""

    key: str  # unique: "chain:4", "tsd:8", "auto"
    strategy: str
    budget: int | None
    planner: object
    repeats: int = 1  # runs per prompt, each between two plain runs (more pairs: a tighter median)


@dataclass(frozen=True)
class Run:
    """One generation."""

    variant: str  # a Variant key, or PLAIN
    prompt: str  # PromptCase name
    tokens: tuple[int, ...]
    seconds: float  # wall clock of the generation loop (prefill excluded)
    stats: GenerationStats
    plain_steps: int  # steps that drafted nothing

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0


@dataclass
class PromptResult:
    case: PromptCase
    prompt_tokens: int
    prefill_target: float  # seconds
    prefill_draft: float
    runs: list[Run] = field(default_factory=list)  # in the order they ran

    def plain_runs(self) -> list[Run]:
        return [r for r in self.runs if r.variant == PLAIN]

    def paired(self, key: str) -> list[tuple[Run, list[Run]]]:
        """Every run of a strategy, with the plain runs right before and after it."""
        out = []
        for i, run in enumerate(self.runs):
            if run.variant == key:
                around = [self.runs[j] for j in (i - 1, i + 1) if 0 <= j < len(self.runs)]
                out.append((run, [r for r in around if r.variant == PLAIN]))
        return out

    def ratios(self, key: str) -> list[float]:
        """Per run of the strategy: its tokens/s ÷ tokens/s of the adjacent plain runs (pooled)."""
        out = []
        for run, plains in self.paired(key):
            seconds = sum(p.seconds for p in plains)
            if plains and seconds > 0:
                plain_tps = sum(len(p.tokens) for p in plains) / seconds
                if plain_tps > 0:
                    out.append(run.tokens_per_second / plain_tps)
        return out

    def ratio(self, key: str) -> float | None:
        """The strategy's paired ratio on this prompt (geometric mean over its runs)."""
        return _geometric_mean(self.ratios(key))

    def placebo_ratios(self) -> list[float]:
        """The machine's noise, measured as a strategy is: each plain run that has plain runs on both
        sides (one strategy run apart) ÷ those two, pooled — what a strategy that changed nothing scores."""
        plain = self.plain_runs()
        out = []
        for before, run, after in zip(plain, plain[1:], plain[2:]):
            seconds = before.seconds + after.seconds
            if seconds > 0 and run.seconds > 0:
                out.append(run.tokens_per_second / ((len(before.tokens) + len(after.tokens)) / seconds))
        return out


def _geometric_mean(values: Sequence[float]) -> float | None:
    return float(np.exp(np.mean(np.log(values)))) if values else None


@dataclass
class BenchConfig:
    max_tokens: int = 128
    sampling: SamplingParams = SamplingParams()
    warmup_tokens: int = 8  # every variant generates this much once before timing starts
    seed: int = 1234  # sampling seed of prompt i is seed + i (the same for every variant)


@dataclass
class BenchResult:
    config: BenchConfig
    variants: list[Variant]
    prompts: list[PromptResult]
    warmup_seconds: float = 0.0
    of_prompts: int = 0  # prompts asked for; more than ``len(prompts)`` when stopped (Ctrl-C) early

    @property
    def stopped(self) -> bool:
        return len(self.prompts) < self.of_prompts


def schedule(
    variant_keys: Sequence[str], rotation: int = 0, repeats: Sequence[int] | None = None
) -> list[str]:
    """P S1 P S2 P … Sk P — every strategy run between two plain runs; the strategies rotated by
    ``rotation`` places; a strategy with r repeats appears in rounds 1…r."""
    keys = list(variant_keys)
    counts = dict(zip(keys, repeats or [1] * len(keys)))
    if keys:
        shift = rotation % len(keys)
        keys = keys[shift:] + keys[:shift]
    order = [PLAIN]
    for round_ in range(max(counts.values(), default=0)):
        for key in keys:
            if counts[key] > round_:
                order += [key, PLAIN]
    return order


def _sampling_for(config: BenchConfig, index: int) -> SamplingParams:
    s = config.sampling
    if s.greedy:
        return s
    return SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, seed=config.seed + index)


def timed_run(
    pair, planner, key: str, case_name: str, prompt: Sequence[int], max_tokens: int, sampling
) -> Run:
    """One generation; the prompt is already in the caches (``sync`` is a no-op inside ``generate``)."""
    pair.target.sync(prompt[:-1])
    if planner is not None:
        pair.draft.sync(prompt)
    stats = GenerationStats()
    tokens: list[int] = []
    plain_steps = 0
    request = Request(prompt=list(prompt), max_tokens=max_tokens, sampling=sampling)
    start = perf_counter()
    for event in generate(pair, planner, request):
        tokens.extend(event.token_ids)
        if event.verified_nodes:
            stats.add(event)
            plain_steps += int(event.drafted == 0)
    seconds = perf_counter() - start
    stats.prompt_tokens = len(prompt)
    return Run(key, case_name, tuple(tokens), seconds, stats, plain_steps)


def run_bench(
    pair,
    cases: Sequence[PromptCase],
    variants: Sequence[Variant],
    config: BenchConfig,
    progress: Progress | None = None,
    tokenize: Callable[[PromptCase], list[int]] | None = None,
) -> BenchResult:
    """Warm up every variant once, then run each prompt in the interleaved order of ``schedule``.

    ``tokenize`` turns a prompt into token ids (default: the target's chat template). Stopped (Ctrl-C)
    after one or more prompts, it returns those whole (the prompt under way is dropped: its runs are
    paired only with each other); stopped before, it raises ``KeyboardInterrupt``."""
    keys, repeats = [v.key for v in variants], [v.repeats for v in variants]
    planners = {v.key: v.planner for v in variants}
    planners[PLAIN] = None
    total = len(cases) * len(schedule(keys, 0, repeats)) + 1
    done = 0

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(what, done, total)

    tokenize = tokenize or (lambda case: _chat_tokens(pair, case, config.max_tokens))
    prompts = [tokenize(case) for case in cases]
    start = perf_counter()
    if cases and config.warmup_tokens > 0:
        first = prompts[0]
        pair.target.sync(first[:-1])
        pair.draft.sync(first)
        for key in [PLAIN, *(v.key for v in variants)]:
            timed_run(
                pair, planners[key], key, "warm-up", first, config.warmup_tokens, _sampling_for(config, 0)
            )
    warmup = perf_counter() - start
    tick("warm-up")
    results: list[PromptResult] = []
    try:
        for index, (case, prompt) in enumerate(zip(cases, prompts)):
            t0 = perf_counter()
            pair.target.sync(prompt[:-1])
            t1 = perf_counter()
            pair.draft.sync(prompt)
            t2 = perf_counter()
            result = PromptResult(case, len(prompt), t1 - t0, t2 - t1)
            sampling = _sampling_for(config, index)
            for key in schedule(keys, index, repeats):
                if progress is not None:
                    progress(f"{case.name}: {key}", done, total)
                result.runs.append(
                    timed_run(pair, planners[key], key, case.name, prompt, config.max_tokens, sampling)
                )
                tick(f"{case.name}: {key}")
            results.append(result)
    except KeyboardInterrupt:
        if not results:
            raise
    return BenchResult(config, list(variants), results, warmup, of_prompts=len(cases))


def _chat_tokens(pair, case: PromptCase, max_tokens: int) -> list[int]:
    messages = [Message(role, content) for role, content in case.messages]
    tokens, _ = prompt_tokens(pair, messages, ChatSettings(max_tokens=max_tokens))
    return tokens


# -- summaries ------------------------------------------------------------------------------------------
def _spread(values: Sequence[float]) -> dict:
    if not values:
        return {"median": None, "min": None, "max": None, "p25": None, "p75": None}
    arr = np.asarray(values, dtype=np.float64)
    return {
        "median": float(median(values)),
        "min": float(arr.min()),
        "max": float(arr.max()),
        "p25": float(np.percentile(arr, 25)),
        "p75": float(np.percentile(arr, 75)),
    }


def merged_stats(parts: Sequence[GenerationStats]) -> GenerationStats:
    """The totals of several generations (every counter summed, timings added)."""
    total = GenerationStats()
    for part in parts:
        for f in fields(GenerationStats):
            setattr(total, f.name, getattr(total, f.name) + getattr(part, f.name))
    return total


def _totals(runs: Sequence[Run]) -> dict:
    stats = merged_stats([run.stats for run in runs])
    tokens = sum(len(r.tokens) for r in runs)
    seconds = sum(r.seconds for r in runs)
    steps = stats.target_calls or 1
    draft = stats.timings.draft / seconds if seconds else 0.0
    verify = stats.timings.verify / seconds if seconds else 0.0
    return {
        "runs": len(runs),
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_second": tokens / seconds if seconds else 0.0,
        "target_calls": stats.target_calls,
        "mal": stats.mean_accepted_length,
        "acceptance_rate": stats.acceptance_rate,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "verified_per_step": stats.verified_nodes / steps,
        "draft_decodes_per_step": stats.draft_decodes / steps,
        # what each unit of work buys: committed tokens per draft forward pass (the GPU's serial
        # draft cost) and per token the target verified (its batch cost)
        "mal_per_draft_pass": stats.committed / stats.draft_decodes if stats.draft_decodes else None,
        "mal_per_verified_token": stats.committed / stats.verified_nodes if stats.verified_nodes else 0.0,
        "merges_per_step": stats.merges / steps,  # GSD: τ-redundant nodes merged per graph
        "graph_success_share": stats.graph_successes / steps,  # accepted path went through a merge
        "plain_step_share": sum(r.plain_steps for r in runs) / steps,
        "time_split": {"draft": draft, "verify": verify, "overhead": max(1.0 - draft - verify, 0.0)},
        # edgespec's own cost per step: wall time outside both models' llama_decode calls
        "python_ms_per_step": stats.timings.python / steps * 1000,
    }


def summarise(result: BenchResult) -> dict:
    """Baseline, one entry per strategy/budget, and the per-prompt numbers (the JSON's core)."""
    all_plain = [r for p in result.prompts for r in p.plain_runs()]
    entries = [_entry(result, variant) for variant in result.variants]
    per_prompt = []
    for pr in result.prompts:
        variants = {}
        for v in result.variants:
            runs = [run for run, _ in pr.paired(v.key)]
            if runs:
                variants[v.key] = {
                    "tokens": [len(run.tokens) for run in runs],
                    "tokens_per_second": [run.tokens_per_second for run in runs],
                    "ratios": pr.ratios(v.key),
                    "ratio": pr.ratio(v.key),
                    "mal": runs[0].stats.mean_accepted_length,
                    **_per_step(merged_stats([run.stats for run in runs])),
                }
        per_prompt.append(
            {
                "prompt": pr.case.name,
                "category": pr.case.category,
                "prompt_tokens": pr.prompt_tokens,
                "prefill_target_seconds": pr.prefill_target,
                "prefill_draft_seconds": pr.prefill_draft,
                "plain_tokens_per_second": [r.tokens_per_second for r in pr.plain_runs()],
                "order": [r.variant for r in pr.runs],
                "variants": variants,
            }
        )
    placebo = {pr.case.name: pr.placebo_ratios() for pr in result.prompts}
    per_prompt_placebo = [g for g in map(_geometric_mean, placebo.values()) if g is not None]
    return {
        "baseline": {
            "strategy": PLAIN,
            **_totals(all_plain),
            # plain against plain, paired as a strategy is: the spread a no-op strategy would show
            "noise": {
                "per_run": _spread([r for ratios in placebo.values() for r in ratios]),
                "per_prompt": _spread(per_prompt_placebo),
            },
        },
        "results": entries,
        "per_prompt": per_prompt,
    }


def _per_step(stats: GenerationStats) -> dict:
    steps = stats.target_calls or 1
    return {
        "python_ms_per_step": stats.timings.python / steps * 1000,
        "draft_decodes_per_step": stats.draft_decodes / steps,
        "verified_per_step": stats.verified_nodes / steps,
    }


def _entry(result: BenchResult, variant: Variant) -> dict:
    runs, adjacent, ratios, same = [], [], [], []
    by_prompt = []  # per prompt: Python ms and draft passes per step
    for pr in result.prompts:
        for run, plains in pr.paired(variant.key):
            runs.append(run)
            adjacent.extend(plains)
            if plains:
                same.append(run.tokens == plains[0].tokens)
        ratios.extend(pr.ratios(variant.key))
        prompt_runs = [run.stats for run, _ in pr.paired(variant.key)]
        if prompt_runs:
            by_prompt.append(_per_step(merged_stats(prompt_runs)))
    totals = _totals(runs)
    plain_tps = _totals(adjacent)["tokens_per_second"] if adjacent else 0.0
    spread = _spread(ratios)
    speedup = spread["median"]
    return {
        "key": variant.key,
        "strategy": variant.strategy,
        "budget": variant.budget,
        "params": variant.planner.describe(),
        **totals,
        "repeats": variant.repeats,
        "speedup": speedup,  # median paired ratio over every run of the strategy
        "speedup_spread": spread,
        "pooled_speedup": totals["tokens_per_second"] / plain_tps if plain_tps else None,
        "paired_ratios": ratios,
        # medians over prompts (the figures): Python ms per step, draft passes per step
        "python_ms_per_step_median": median(p["python_ms_per_step"] for p in by_prompt)
        if by_prompt
        else None,
        "draft_decodes_per_step_median": (
            median(p["draft_decodes_per_step"] for p in by_prompt) if by_prompt else None
        ),
        "efficiency": speedup / totals["mal"] if speedup and totals["mal"] else None,
        # greedy: share of runs whose output equals plain decoding's (near-tie flips aside)
        "identical_to_plain": sum(same) / len(same) if same and result.config.sampling.greedy else None,
    }
