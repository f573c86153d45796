"""Cost curves of a model shape that is not here: a random-weight GGUF of that shape (``models.shapes``)
as the target, with the bundled draft (real), in a temporary directory that goes when done.

Costs depend on the shapes and the quantisation, not on the weights, so the curves are the real
model's on this machine; the text is noise, so acceptance (MAL, speedups) says nothing: every figure
measured this way is **timing only**. The curves are cached per machine in ``<data home>/profiles/``
under the shape's name instead of the (temporary) file's identity, beside the machine and build keys
``costs.profile_key`` uses: a second ``measure_like`` is instant.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace

from ..engine import EngineSettings
from ..errors import EdgespecError
from ..models.pairs import ResolvedPair, open_pair
from ..models.shapes import like_key, make_like, shape_of
from ..progress import Progress, progress_bar
from .costs import CostProfile, load_or_measure, profile_key, save
from .store import profile_path

TIMING_ONLY = (
    "random weights: the text is noise, so acceptance, MAL and speedups say nothing of the real model; "
    "tokens/s and cost curves are this shape's timings on this machine"
)


def shape_profile_key(name: str, settings: EngineSettings, draft: str) -> dict:
    """``pair_shape_key`` of the pair ``name``'s random target and ``draft`` make once loaded with
    ``settings`` (GPU layers as counts): known before writing or loading anything."""
    runner = SimpleNamespace  # what profile_key reads of a loaded runner: its model's path
    stand_in = SimpleNamespace(
        settings=settings,
        target=runner(model=runner(path=draft)),
        draft=runner(model=runner(path=draft)),
    )
    return pair_shape_key(stand_in, name)


def pair_shape_key(pair, name: str) -> dict:
    """``costs.profile_key`` of a loaded pair whose target is ``name``'s random one, the target known by
    its shape instead of its (temporary) file."""
    return {**profile_key(pair), "target": {"like": like_key(name)}}


def load_like(key: dict, home: Path | None = None) -> CostProfile | None:
    """The cached curves of a shape's key (``shape_profile_key``), or None."""
    try:
        profile = CostProfile.from_dict(json.loads(profile_path(key, home).read_text()))
    except (OSError, ValueError, KeyError):
        return None
    return None if profile.busy else profile


def keep_like(profile: CostProfile, key: dict, home: Path | None = None) -> CostProfile:
    """``profile`` cached under a shape's key (unless measured beside other work: ``busy``)."""
    profile = replace(profile, key=key)
    if not profile.busy:
        save(profile, home)
    return profile


def bundled_draft() -> str:
    """The bundled pair's draft file (assembled from its packages on first use)."""
    from ..models.store import ModelStore

    store = ModelStore()
    return str(store.ensure(store.registry.default_pair.draft.name))


@dataclass(frozen=True)
class LikeRun:
    """A random-weight target of a shape with the bundled draft, ready to load (``open_pair``)."""

    resolved: ResolvedPair
    scratch: Path  # a data home inside the temporary directory: this pair's profiles by its files
    key: dict = field(default_factory=dict)  # the shape's curves' cache key, once loaded (``open_like``)


@contextmanager
def like_pair(name: str, settings: EngineSettings, *, progress: Progress | None = None) -> Iterator[LikeRun]:
    """Write ``name``'s random target into a temporary directory (deleted after, on Ctrl-C too) and
    give it with the bundled draft; ``scratch`` is a data home in that directory: profiles keyed by the
    temporary file go there, and with it (``open_like`` puts the shape's cached curves there first)."""
    shape_of(name)  # an unknown shape fails here, before the draft is assembled
    draft = bundled_draft()
    with tempfile.TemporaryDirectory(prefix="edgespec-like-") as tmp:
        if progress is None:
            with progress_bar(f"writing a random {like_key(name)}") as bar:

                def in_mib(what: str, done: int, total: int) -> None:
                    bar("MiB", done >> 20, total >> 20)

                target = make_like(name, tmp, tokenizer_from=Path(draft), progress=in_mib)
        else:
            target = make_like(name, tmp, tokenizer_from=Path(draft), progress=progress)
        label = f"{like_key(name)} (random weights)+{Path(draft).stem}"
        scratch = Path(tmp) / "home"
        yield LikeRun(ResolvedPair(label, str(target), draft), scratch)


def check_like_models(pair: str | None, target: str | None, draft: str | None) -> None:
    """``--like`` names the target (a random one) and its draft (the bundled one): no model flags beside."""
    given = [flag for flag, value in (("--pair", pair), ("--target", target), ("--draft", draft)) if value]
    if given:
        raise EdgespecError(
            f"--like times a random-weight target with the bundled draft: leave out {', '.join(given)}, or "
            "leave out --like to measure those models."
        )


def open_like(name: str, settings: EngineSettings, stack: ExitStack, home: Path | None = None):
    """(``LikeRun`` with its ``key``, loaded pair) of ``name``'s random target: the temporary directory
    is ``stack``'s (closed after the pair, it goes; on a failure here it goes at once); the shape's
    cached curves (from ``home``) are in ``run.scratch`` under the pair's own key."""
    try:
        run = stack.enter_context(like_pair(name, settings))
        pair = open_pair(run.resolved, settings)
    except BaseException:
        stack.close()
        raise
    key = pair_shape_key(pair, name)
    cached = load_like(key, home)
    if cached is not None:
        save(replace(cached, key=profile_key(pair)), run.scratch)
    return replace(run, key=key), pair


def measure_like(
    name: str, *, threads: int, home: Path | None = None, progress: Progress | None = None
) -> CostProfile:
    """The quick cost curves of ``name``'s shape (``models.shapes.shape_of``) as the target, with the
    bundled draft, on this machine's CPU: cached per machine (instant the second time), else measured
    through ``load_or_measure`` on a random-weight file written to a temporary directory (gone after).
    ``progress``: writing the file (bytes), then measuring (samples)."""
    settings = EngineSettings(threads=threads, target_gpu_layers=0, draft_gpu_layers=0)
    key = shape_profile_key(name, settings, bundled_draft())
    cached = load_like(key, home)
    if cached is not None:
        return cached
    with like_pair(name, settings, progress=progress) as run:
        with open_pair(run.resolved, settings) as pair:
            profile = load_or_measure(pair, quick=True, progress=progress, home=run.scratch)
            key = pair_shape_key(pair, name)  # the same, from the loaded pair itself
    return keep_like(profile, key, home)
