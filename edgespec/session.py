"""The chat facade: what `edgespec chat` (the TUI) and `edgespec serve` share to load a pair, build its
planners and stream replies. Nothing here knows about a screen or about HTTP.

    backend = ChatBackend.from_args(args)            # or ChatBackend(LoadRequest(pair=..., choice=...))
    loaded = backend.load(None, on_progress)         # LoadedPair: engine, name, defaults (its first choice)
    planner = backend.make_planner(loaded.defaults)  # via edgespec.strategy.make_planner; None: plain
    draft_problem(planner, loaded)                   # why it cannot run on this pair, or None
    loaded.engine.prepare(planner, on_progress)      # the pair's cost profile, if cached already
    for event in loaded.engine.stream(planner, messages, settings, cancel, stats): ...

The chat app runs these steps itself (it switches pairs and strategies while it runs); a server runs
them once through ``start_session`` and answers every request with the ``ChatSession`` it returns.

The protocols are the seam: a ``ChatEngine`` is anything that streams ``StepEvent``s for chat messages
(``PairEngine`` wraps a ``ModelPair``; tests/support/tui_fakes.py has a fake), and a ``Backend`` anything that
loads one (``ChatBackend``; the fake's ``FakeBackend``), so the app, the server and their tests run
the same code. Modules that need llama_cpp are imported inside functions: importing this module needs
neither llama_cpp nor Textual.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from .decoding.events import GenerationStats, StepEvent
from .errors import EdgespecError
from .planner.base import Planner
from .strategy import CHOICES, PairDefaults, StrategyChoice, make_planner, needs_draft

if TYPE_CHECKING:
    import argparse

    from .decoding.chat import ChatSettings, Message
    from .decoding.completion import CompletionPrompt
    from .engine.pair import EngineSettings, ModelPair
    from .models.pairs import ResolvedPair

MIB = 1024 * 1024
MEASURING_SCOPE = ("measuring the pair",)  # the prompt cache's scope of the profile's own tokens
LoadCallback = Callable[[str, int, int], None]  # (stage, done bytes, total bytes; 0 = unknown)


def where_text(runs_on: dict[str, dict]) -> str:
    """The status bar's word on where the models run (``ModelPair.runs_on_json``): "CPU", or each model
    off the CPU with its device and share: "target: NVIDIA H200 29/29 · draft: NVIDIA H200 25/25"."""
    away = {name: place for name, place in runs_on.items() if place["device"] != "CPU"}
    if not away:
        return "CPU"
    share = lambda p: f" {p['gpu_layers']}/{p['layers']}" if p["gpu_layers"] else ""  # noqa: E731
    return " · ".join(f"{name}: {place['device']}{share(place)}" for name, place in away.items())


class ChatEngine(Protocol):
    """A loaded pair, as the chat app and the server use it. Not thread-safe: one thread drives it."""

    n_ctx: int  # the context window
    has_draft: bool  # False when loaded for plain decoding (and copying) only

    def piece(self, token: int) -> str:
        """A token's text (for drawing tree nodes)."""
        ...

    def context_used(self) -> int:
        """Tokens in the target's cache (prompt + answer so far)."""
        ...

    def prepare(self, planner: Planner | None, on_progress: LoadCallback) -> None:
        """Give ``planner`` what it asks of this pair's profile before it drafts (``Planner.prepare``:
        auto's cost curves and fit, OPT-Tree's μ), as far as it is measured (``measure``): it never
        waits for measuring. Runs on the thread that then streams."""
        ...

    def stream(
        self,
        planner: Planner | None,
        messages: Sequence[Message],
        settings: ChatSettings,
        cancel: threading.Event,
        stats: GenerationStats,
    ) -> Iterator[StepEvent]:
        """The assistant's reply to ``messages`` step by step (its last event has a ``finish_reason``);
        it stops at the next step once ``cancel`` is set; totals accumulate into ``stats``."""
        ...

    def complete(
        self,
        planner: Planner | None,
        prompt: CompletionPrompt,
        settings: ChatSettings,
        cancel: threading.Event,
        stats: GenerationStats,
    ) -> Iterator[StepEvent]:
        """The continuation of a raw prompt, or the middle between its text and ``suffix`` (fill in the
        middle); like ``stream`` otherwise."""
        ...

    def forget(self) -> None:
        """Empty the KV caches and the saved conversations, so nothing cached can change the next
        answer (``edgespec serve --no-prompt-cache``)."""
        ...

    def idle(self) -> bool:
        """Between replies: a little of the work the next reply would start with (the draft reading
        the last reply), at most a fraction of a second; True while more is left."""
        ...

    def measure(self, stop: Callable[[], bool], on_progress: LoadCallback) -> bool:
        """Between replies: measure the pair's profile (what ``prepare`` gives planners; no reply waits
        for it) piece by piece until it is complete (True; at once when it is) or ``stop()``, asked
        between pieces of well under a second. The next reply's planner is prepared with it."""
        ...

    def cache_info(self) -> dict:
        """The prompt cache's state (conversations kept, bytes, budget, saves, restores) and the tokens
        the contexts hold: numbers only, never text (/health shows them to a key holder)."""
        ...

    def close(self) -> None: ...


@dataclass
class LoadedPair:
    engine: ChatEngine
    name: str  # shown in the status bar, saved with each answer, the server's model id by default
    defaults: StrategyChoice  # the first strategy: the command line's, under the pair's models.toml entry


class Backend(Protocol):
    """What loads pairs and builds their planners (``ChatBackend``; the tests' ``FakeBackend``)."""

    strategies: tuple[str, ...]  # selectable strategy names, "none" (plain decoding) first

    def pairs(self) -> list[str]:
        """Registry pairs whose models are installed (or can be assembled offline)."""
        ...

    def load(self, pair: str | None, on_progress: LoadCallback) -> LoadedPair:
        """Load ``pair`` (None: the one the request names, else the default pair). Slow: not on a UI
        thread. The previous pair stays loaded: close its engine first to free its memory."""
        ...

    def make_planner(self, choice: StrategyChoice) -> Planner | None:
        """The planner for ``choice`` on the last loaded pair (None: plain decoding); ``EdgespecError``,
        ``ValueError`` or ``TypeError`` when the choice's parameters are wrong."""
        ...


def draft_problem(planner: Planner | None, loaded: LoadedPair) -> str | None:
    """Why ``planner`` cannot run on ``loaded`` (it drafts, and the pair was loaded without a draft
    model), or None when it can."""
    if planner is None or not planner.needs_draft or loaded.engine.has_draft:
        return None
    return (
        f"{loaded.name} was loaded without a draft model, so only plain decoding ('none') and copying "
        "from the conversation ('ngram') work. Give --draft to speculate."
    )


# -- on real models -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoadRequest:
    """Which pair to load and how: a registry pair by name, or model files (``target`` and, to draft,
    ``draft``); the engine settings; the strategy to start with."""

    pair: str | None = None  # a registry pair; None: the default pair (unless ``target`` is given)
    target: str | None = None  # a local .gguf or registry model; without ``draft``: plain decoding only
    draft: str | None = None
    choice: StrategyChoice = StrategyChoice("auto")
    engine: EngineSettings | None = None  # None: EngineSettings()
    cache_ram: int = 0  # bytes of host memory for saved conversations' KV (engine/kv_cache.py); 0: none

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LoadRequest:
        """What `edgespec chat` or `edgespec serve` was asked for on the command line."""
        from . import options

        choice, engine = options.strategy_choice(args), options.engine_settings(args)
        cache_ram = int(getattr(args, "cache_ram", 0) * MIB) if getattr(args, "prompt_cache", True) else 0
        return cls(args.pair, args.target, args.draft, choice, engine, cache_ram)


class ChatBackend:
    """Pairs from the registry and the model store (``edgespec.models.pairs``), their planners from
    ``edgespec.strategy`` — the same path as `generate` and `bench`."""

    strategies = CHOICES

    def __init__(self, request: LoadRequest):
        self.request = request
        self.pair: PairDefaults | None = None  # the last loaded pair's defaults (models.toml)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ChatBackend:
        return cls(LoadRequest.from_args(args))

    def pairs(self) -> list[str]:
        from .models.pairs import available_pairs

        return available_pairs()

    def resolve(self, pair: str | None, on_progress: LoadCallback) -> tuple[ResolvedPair, StrategyChoice]:
        """The files and the first strategy choice for ``pair`` (None: what the request names)."""
        from .models.pairs import resolve_pair

        request, choice = self.request, self.request.choice
        if pair is None and request.target:  # local files; without a draft: plain decoding only
            draft = bool(request.draft)
            resolved = resolve_pair(None, request.target, request.draft, draft, on_progress)
        else:
            resolved = resolve_pair(pair or request.pair, on_progress=on_progress)
        if resolved.draft_path is None and needs_draft(choice.name):
            choice = StrategyChoice("none")
        return resolved, choice

    def load(self, pair: str | None, on_progress: LoadCallback) -> LoadedPair:
        from .models.pairs import open_pair

        resolved, choice = self.resolve(pair, on_progress)
        on_progress(f"loading {resolved.name} into memory", 0, 0)
        engine = PairEngine(open_pair(resolved, self.request.engine), self.request.cache_ram)
        self.pair = resolved.defaults
        return LoadedPair(engine, resolved.name, choice)

    def make_planner(self, choice: StrategyChoice) -> Planner | None:
        """The pair's profile is given later, in ``ChatEngine.prepare`` (it measures, on first use)."""
        return make_planner(choice, self.pair or PairDefaults(""))


class PairEngine:
    """A ``ModelPair`` as a ``ChatEngine``: the prompt rendered by ``edgespec.decoding.chat`` (or
    ``decoding.completion``), the reply through ``decoding.chat.stream_tokens``. The contexts keep the
    longest common prefix of what they hold and each prompt; ``cache_ram`` bytes of host memory keep
    recent conversations' KV besides (``engine.kv_cache.PromptCache``)."""

    def __init__(self, pair: ModelPair, cache_ram: int = 0):
        from .engine.kv_cache import PromptCache
        from .profile.attach import PairProfile

        self.pair = pair
        self.runs_on = pair.runs_on_json()  # where each model runs: the status bar, /health
        self.n_ctx = pair.target.n_ctx
        self.has_draft = pair.draft is not None
        self._with_costs: set[int] = set()  # planners that asked this pair's profile already
        self.cache = PromptCache(pair, cache_ram)
        self.profile = PairProfile(pair, measure=False)  # what is cached; ``measure`` adds the rest
        self.profiled = pair.draft is None  # the profile is complete: nothing left to measure

    def piece(self, token: int) -> str:
        return self.pair.target.model.piece(token).decode("utf-8", errors="replace")

    def context_used(self) -> int:
        return self.pair.context_used()

    def prepare(self, planner: Planner | None, on_progress: LoadCallback) -> None:
        if planner is not None and id(planner) not in self._with_costs:
            # what it asks for (auto, OPT-Tree: the cost profile), as far as it is measured: never waits
            planner.prepare(self.profile)
            self._with_costs.add(id(planner))

    def measure(self, stop: Callable[[], bool], on_progress: LoadCallback) -> bool:
        """``ChatEngine.measure``. Measuring decodes its own tokens: the live conversation is saved
        first (within ``cache_ram``; else the next prompt decodes it again) and the contexts are left
        empty, as after ``forget``."""
        if self.profiled or stop():
            return self.profiled
        self.cache.prepare((), MEASURING_SCOPE)  # the conversation saved, the contexts emptied
        try:
            self.profiled = self.profile.measure_idle(stop, on_progress)
        finally:
            self.pair.forget()  # the measurement's tokens go: nothing of them meets a prompt
        if self.profiled:
            self._with_costs.clear()  # each planner is prepared again, with the whole profile
        return self.profiled

    def stream(self, planner, messages, settings, cancel, stats) -> Iterator[StepEvent]:
        from .decoding.chat import prompt_tokens

        tokens, stats.dropped_messages = prompt_tokens(self.pair, messages, settings)
        yield from self._continue(planner, tokens, settings, cancel, stats)

    def complete(self, planner, prompt, settings, cancel, stats) -> Iterator[StepEvent]:
        from .decoding.completion import completion_tokens

        tokens = completion_tokens(self.pair, prompt, settings)
        yield from self._continue(planner, tokens, settings, cancel, stats)

    def _continue(self, planner, tokens, settings, cancel, stats) -> Iterator[StepEvent]:
        from .decoding.chat import stream_tokens

        self.prepare(planner, _quiet)  # again once the profile is complete
        # a saved conversation of the same scope that shares more of the prompt comes back
        self.cache.prepare(tokens, settings.cache_scope)
        try:
            yield from stream_tokens(self.pair, planner, tokens, settings, cancel, stats)
        except Exception:
            self.pair.forget()  # a failed step may leave the caches out of step with their bookkeeping
            raise

    def idle(self, chunk: int = 8) -> bool:
        """The draft reads ``chunk`` more tokens of the last reply (the draft skips what it need not
        draft, and the next prompt's first token would otherwise wait for it to catch up). A request
        that arrives meanwhile waits for the chunk: 8 tokens of the draft take ~0.1 s on 2 CPU cores
        at 2,000 tokens of context (32 took 0.3 s, a third of a turn's time to first token)."""
        if self.pair.draft is None:
            return False
        try:
            return self.pair.draft.absorb(chunk)
        except Exception:
            self.pair.forget()  # as after a failed step: the next reply starts from empty caches
            return False

    def cache_info(self) -> dict:
        """The prompt cache: saved conversations, their bytes, the budget, saves and restores."""
        return {**self.cache.info(), "live_tokens": self.context_used()}

    def forget(self) -> None:
        self.cache.clear()
        self.pair.forget()

    def close(self) -> None:
        self.pair.close()


# -- one pair, one planner: a server --------------------------------------------------------------------
@dataclass(frozen=True)
class ChatSession:
    """A loaded pair and the planner it answers with. Owned by one thread (llama.cpp contexts are not
    thread-safe): ``edgespec serve``'s generation thread."""

    engine: ChatEngine
    planner: Planner | None  # None: plain decoding
    strategy: str  # the planner's strategy name ("none": plain decoding), reported with each answer
    name: str  # the pair's name
    prompt_cache: bool = True  # False: every answer starts from empty caches (``engine.forget()``)

    def stream(
        self,
        messages: Sequence[Message],
        settings: ChatSettings,
        cancel: threading.Event,
        stats: GenerationStats,
    ) -> Iterator[StepEvent]:
        """The reply to ``messages`` (see ``ChatEngine.stream``): it continues from the longest prefix
        of its prompt the caches hold, or, without ``prompt_cache``, from empty caches (an answer that
        depends on nothing before it)."""
        self._begin()
        return self.engine.stream(self.planner, messages, settings, cancel, stats)

    def complete(
        self,
        prompt: CompletionPrompt,
        settings: ChatSettings,
        cancel: threading.Event,
        stats: GenerationStats,
    ) -> Iterator[StepEvent]:
        """A raw prompt's continuation, or fill in the middle (see ``ChatEngine.complete``)."""
        self._begin()
        return self.engine.complete(self.planner, prompt, settings, cancel, stats)

    def idle(self) -> bool:
        """Work ahead between replies (``ChatEngine.idle``): nothing without the prompt cache, nor for
        a planner that will not draft with the model."""
        drafts = self.planner is not None and self.planner.may_draft
        return self.prompt_cache and drafts and self.engine.idle()

    def measure(self, stop: Callable[[], bool]) -> bool:
        """The pair's profile, between replies (``ChatEngine.measure``): True once complete."""
        return self.engine.measure(stop, _quiet)

    def _begin(self) -> None:
        if not self.prompt_cache:
            self.engine.forget()

    def close(self) -> None:
        self.engine.close()


def _quiet(stage: str, done: int, total: int) -> None:
    pass


def _never() -> bool:
    return False


def start_session(
    backend: Backend,
    on_progress: LoadCallback | None = None,
    prompt_cache: bool = True,
    measure_first: bool = False,
) -> ChatSession:
    """Load the request's pair with the planner of its first strategy, ready to answer (with its cost
    profile if cached, or with ``measure_first`` measured now; else measured between requests);
    ``EdgespecError`` when that planner needs a draft it lacks. ``prompt_cache`` False: every answer
    starts from empty caches."""
    progress = on_progress or _quiet
    loaded = backend.load(None, progress)
    try:
        planner = backend.make_planner(loaded.defaults)
        problem = draft_problem(planner, loaded)
        if problem is not None:
            raise EdgespecError(problem)
        if measure_first:
            loaded.engine.measure(_never, progress)
        loaded.engine.prepare(planner, progress)
    except BaseException:
        loaded.engine.close()
        raise
    strategy = loaded.defaults.name if planner is not None else "none"
    return ChatSession(loaded.engine, planner, strategy, loaded.name, prompt_cache)
