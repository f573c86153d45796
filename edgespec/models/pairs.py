"""Which model files a user's choice means, and loading them: the facade the CLI, the chat app and
the server share (model store → resolved pair → ``ModelPair``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import EdgespecError

StageProgress = Callable[[str, int, int], None]  # (stage, done bytes, total bytes; 0 = unknown)


@dataclass(frozen=True)
class PairDefaults:
    """What a pair contributes to its planners (``edgespec.strategy.make_planner``): its name (decision
    models are per pair) and its models.toml entry (recommended strategy, budget, parameters); empty
    for local files."""

    name: str
    strategy: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)  # budget and strategy parameters
    draft_sha256: str | None = None  # its draft's (registry pairs): finds the shipped parallel drafter


@dataclass(frozen=True)
class ResolvedPair:
    name: str
    target_path: str
    draft_path: str | None
    strategy_defaults: dict[str, Any] = field(default_factory=dict)  # models.toml: strategy, budget, params
    draft_sha256: str | None = None  # the registry's, for a registry pair
    rpc: tuple[str, ...] = ()  # models.toml: RPC servers for the target (unless --rpc says otherwise)
    tensor_split: tuple[float, ...] = ()

    @property
    def defaults(self) -> PairDefaults:
        params = {k: v for k, v in self.strategy_defaults.items() if k != "strategy"}
        return PairDefaults(self.name, self.strategy_defaults.get("strategy"), params, self.draft_sha256)


def resolve_pair(
    pair: str | None = None,
    target: str | None = None,
    draft: str | None = None,
    need_draft: bool = True,
    on_progress: StageProgress | None = None,
) -> ResolvedPair:
    """The model files for a registry pair (default: the bundled pair), or for local/registry models
    given as ``target`` (+ ``draft``); bundled models are assembled on first use (with Rich bars on
    stderr, or through ``on_progress``)."""
    from .store import ModelStore

    store = ModelStore()

    def ensure(name: str) -> str:
        if on_progress is None:
            return str(store.ensure(name))
        label = Path(name).name
        return str(
            store.ensure(
                name, progress=False, on_progress=lambda d, t: on_progress(f"assembling {label}", d, t)
            )
        )

    if draft and not target:
        raise EdgespecError("--draft needs --target too: give both, or --pair NAME alone.")
    if target:
        if need_draft and not draft:
            raise EdgespecError(
                "--target needs --draft too (or use --strategy none for plain decoding, or ngram to copy "
                "from the conversation)."
            )
        draft_path = ensure(draft) if draft else None  # checked even where the strategy drafts nothing
        draft_path = draft_path if need_draft else None
        name = "+".join(Path(m).stem if m.endswith(".gguf") else m for m in (target, draft) if m)
        return ResolvedPair(name, ensure(target), draft_path)
    spec = store.registry.pair(pair) if pair else store.registry.default_pair
    target_path = ensure(spec.target.name)
    draft_path = ensure(spec.draft.name) if need_draft else None
    defaults = {"strategy": spec.strategy, "budget": spec.budget, **dict(spec.params)}
    return ResolvedPair(
        spec.name, target_path, draft_path, defaults, spec.draft.sha256, spec.rpc, spec.tensor_split
    )


def available_pairs() -> list[str]:
    """Registry pairs whose models are installed (or can be assembled offline from bundled parts)."""
    from .store import ModelStore

    store = ModelStore()
    return [
        name
        for name, spec in store.registry.pairs.items()
        if _available(store, spec.target) and _available(store, spec.draft)
    ]


def _available(store, spec) -> bool:
    if store.is_installed(spec.name):
        return True
    if not spec.bundled:
        return False
    from . import bundled

    try:
        bundled.part_files(spec.name, spec.source)
    except EdgespecError:
        return False
    return True


def open_pair(resolved: ResolvedPair, settings):
    """Load the resolved pair (``settings``: ``EngineSettings``) into memory; backend probes are remembered
    in the data home, and a draft the store has hashed is known by its hash."""
    from dataclasses import replace

    from ..engine.interrupts import held_interrupt
    from ..engine.limits import check_engine
    from ..engine.pair import ModelPair
    from .paths import home_dir
    from .store import model_identity

    check_engine(settings)
    if settings.probe_dir is None:
        settings = replace(settings, probe_dir=home_dir() / "probes")
    if settings.rpc is None and resolved.rpc:  # neither --rpc nor $EDGESPEC_RPC: the pair's servers
        settings = replace(
            settings, rpc=resolved.rpc, tensor_split=settings.tensor_split or resolved.tensor_split
        )
    draft_sha256 = model_identity(resolved.draft_path)["sha256"] if resolved.draft_path else None
    with held_interrupt():  # Ctrl-C during a load: raised when llama.cpp returns, not lost in a callback
        return ModelPair(resolved.target_path, resolved.draft_path, settings, draft_sha256)
