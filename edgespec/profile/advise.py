"""``edgespec models advise``: for this machine and each pair in the registry, whether it fits, plain
tokens/s and the best strategy's predicted speedup (``planner/advice.py``), and what that rests on.

The cost curves of a pair come from, best first:

1. ``REAL``: its own files, installed here — the cached cost profile (``costs.py``), measured now when
   missing, and its own fit (``fit.py``): how often its draft's guesses are right;
2. ``RANDOM`` (``--measure``): a random-weight GGUF of the target's shape and quantisation, timed here
   (``measure_like``, cached per machine);
3. ``FITTED``: the curves of the bundled pair measured here, rescaled to the target's and the draft's
   weights (c(1) = a + b · weights multiplied, through the bundled target and draft: ``advice.line_through``).

Without the pair's own fit, its acceptance is the bundled pair's (said so in ``acceptance``), and the
speedup at a lower acceptance is shown beside it. The result is cached in ``<data home>/advice.json``,
where the chat's first-run hint reads it (it never measures)."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from ..errors import EdgespecError
from ..models.paths import advice_path
from ..models.random_gguf import Dims, nbytes, tensor_specs
from ..models.shapes import shape_of
from ..models.specs import ModelSpec, PairSpec
from ..planner.advice import LOWER, fitted_curve, line_through, lowered, predict
from ..planner.costmodel import CostModel, DraftFit
from ..progress import Progress
from .attach import PairProfile
from .store import cpu_model, write_json

REAL = "its files, measured here"
RANDOM = "a random-weight file of its shape, measured here"
FITTED = "the bundled pair's curves here, rescaled"
OWN_FIT, BUNDLED_FIT = "its own, measured here", "the bundled pair's (assumed)"
QWEN_VOCAB = 151936  # the Qwen2.5 tokenizer's size (a shape without its own n_vocab)
KV_BYTES = 2  # f16 keys and values
HEADROOM = 0.9  # a pair fits when its files and KV caches take at most this share of the RAM


@dataclass(frozen=True)
class Machine:
    cpu: str
    cores: int
    threads: int  # the threads the curves are measured (and the pairs would run) with
    ram: int  # bytes
    gpus: tuple[str, ...] = ()  # the GPUs llama.cpp can use (none in a CPU build)
    vram: int = 0  # bytes free on them together

    def describe(self) -> str:
        gpus = f"; {', '.join(self.gpus)}, {self.vram / 2**30:.1f} GiB free" if self.gpus else "; no GPU used"
        return f"{self.cpu}, {self.cores} cores, {self.threads} threads, {self.ram / 2**30:.1f} GiB RAM{gpus}"


def this_machine(threads: int = 0) -> Machine:
    from ..engine.offload import gpu_devices

    cores = os.cpu_count() or 1
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    devices = gpu_devices()
    gpus = tuple(d.description for d in devices)
    return Machine(cpu_model(), cores, threads or cores, ram, gpus, sum(d.free for d in devices))


@dataclass(frozen=True)
class Row:
    pair: str
    installed: bool
    need: int  # bytes: both files and their KV caches at the context size
    fits: bool  # in RAM
    fits_gpu: bool | None = None  # wholly in the GPUs' free memory (None: no GPU)
    curves: str = ""  # REAL, RANDOM or FITTED ("": no prediction, see ``note``)
    acceptance: str = ""  # OWN_FIT or BUNDLED_FIT
    plain: float | None = None  # tokens/s
    speedups: dict[str, float] = field(default_factory=dict)  # "chain:n" / "auto" → speedup
    lower: dict[str, float] = field(default_factory=dict)  # the same at LOWER × the acceptance
    best: str = ""  # the best key of ``speedups``
    recommended: str = ""  # the pair's own strategy in models.toml, as a key of ``speedups``
    costs_ms: dict[str, float] = field(default_factory=dict)  # the curves at a glance: c_t(1), c_t(16), …
    note: str = ""

    @property
    def speedup(self) -> float:
        return self.speedups.get(self.best, 1.0)


# -- shapes and bytes -----------------------------------------------------------------------------
def dims_of(spec: ModelSpec) -> Dims | None:
    """The shape and quantisation of a registry model (None: a family without known shapes)."""
    try:
        return shape_of(spec.name)
    except EdgespecError:
        return None


def file_bytes(spec: ModelSpec, dims: Dims | None) -> int | None:
    if spec.size:
        return spec.size
    if dims is None:
        return None
    return sum(nbytes(s) for s in tensor_specs(dims, dims.n_vocab or QWEN_VOCAB, dims.qtype))


def kv_bytes(dims: Dims, n_ctx: int) -> int:
    """Keys and values of every layer for ``n_ctx`` tokens."""
    return 2 * dims.n_layer * dims.head_dim * dims.n_head_kv * n_ctx * KV_BYTES


def need_bytes(pair: PairSpec, n_ctx: int) -> int | None:
    """What the pair takes in memory (None: a model of unknown size)."""
    total = 0
    for spec in (pair.target, pair.draft):
        dims = dims_of(spec)
        size = file_bytes(spec, dims)
        if size is None:
            return None
        total += size + (kv_bytes(dims, n_ctx) if dims is not None else 0)
    return total


# -- curves ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Measured:
    """A pair measured here: its curves and its fit."""

    costs: CostModel
    fit: DraftFit | None


def measured(
    pair, progress: Progress | None, home: Path | None, label: str, refresh: bool = False
) -> Measured:
    """A loaded pair's curves and fit: cached, else (or with ``refresh``) measured now and cached."""
    show = progress is None
    with PairProfile(pair, progress, show, home, refresh=refresh, label=label) as profile:
        costs = profile.costs()
        if costs is None:
            raise ValueError("advise needs a pair with a draft")
        return Measured(costs, profile.fit())


def weights_multiplied(dims: Dims) -> int:
    """Weights a decoded token multiplies: every matrix but the embedding table (looked up, one row a
    token) unless the output reuses it."""
    specs = tensor_specs(dims, dims.n_vocab or QWEN_VOCAB, dims.qtype)
    return sum(
        int(np.prod(s.ne, dtype=np.int64))
        for s in specs
        if len(s.ne) == 2 and (s.name != "token_embd.weight" or dims.tied_output)
    )


def fitted(reference: Measured, bundled: PairSpec, pair: PairSpec) -> CostModel | None:
    """The bundled pair's curves rescaled to ``pair``'s weights (module docstring, 3)."""
    dims = {spec.name: dims_of(spec) for spec in (bundled.target, bundled.draft, pair.target, pair.draft)}
    if any(d is None for d in dims.values()):
        return None
    n = {name: weights_multiplied(d) for name, d in dims.items() if d is not None}
    ref = reference.costs
    # one token's decode, c(1) = a + b · N, through the target's and the draft's measured c(1) (the
    # draft's catch-up of one token is its plain decode)
    k1, t1 = float(ref.k(1)), float(ref.t(1))
    a, b = line_through(n[bundled.draft.name], k1, n[bundled.target.name], t1)
    return CostModel(
        target=fitted_curve(ref.target, a + b * n[pair.target.name]),
        draft=ref.draft * ((a + b * n[pair.draft.name]) / k1),
        catchup=ref.catchup * ((a + b * n[pair.draft.name]) / k1),
        overhead=ref.overhead,
    )


def row(
    pair: PairSpec,
    installed: bool,
    machine: Machine,
    n_ctx: int,
    costs: CostModel | None,
    curves: str,
    fit: DraftFit | None,
    own_fit: bool,
    why: str = "",
) -> Row:
    need = need_bytes(pair, n_ctx)
    fits = need is not None and need <= HEADROOM * machine.ram
    fits_gpu = (need is not None and need <= machine.vram) if machine.gpus else None
    base = Row(pair.name, installed, need or 0, fits, fits_gpu, recommended=f"{pair.strategy}:{pair.budget}")
    if costs is None or fit is None:
        return replace(base, note=f"no prediction: {why or 'its draft guessed nothing in the fit'}")
    now, low = predict(costs, fit), predict(costs, lowered(fit))
    speedups = {**{f"chain:{n}": s for n, s in now.chains.items()}, "auto": now.auto}
    best, _ = now.best
    return replace(
        base,
        curves=curves,
        acceptance=OWN_FIT if own_fit else BUNDLED_FIT,
        plain=now.plain,
        speedups=speedups,
        lower={**{f"chain:{n}": s for n, s in low.chains.items()}, "auto": low.auto},
        best=best,
        costs_ms={
            "t1": 1e3 * float(costs.t(1)),
            "t16": 1e3 * float(costs.t(16)),
            "d1": 1e3 * float(costs.d(1)),
            "k1": 1e3 * float(costs.k(1)),
        },
    )


Loader = Callable[[str], AbstractContextManager]  # a pair's name → the loaded pair (a ``with`` block)


def advise(
    pairs: dict[str, PairSpec],
    installed: set[str],
    bundled: PairSpec,
    load: Loader,
    machine: Machine,
    n_ctx: int,
    *,
    measure_like: Callable[[str], CostModel] | None = None,
    progress: Progress | None = None,
    home: Path | None = None,
    refresh: bool = False,
) -> list[Row]:
    """One row per pair of ``pairs``: installed ones measured on their files (``refresh``: measured
    again), the others from the bundled pair's curves (``fitted``) or, with ``measure_like``, a
    random-weight shape's."""
    reference: Measured | None = None
    if bundled.name in installed:
        with load(bundled.name) as loaded:
            label = f"advise: measuring {bundled.name} (once; cached)"
            reference = measured(loaded, progress, home, label, refresh)
    rows = []
    for name, spec in pairs.items():
        if name == bundled.name and reference is not None:
            rows.append(row(spec, True, machine, n_ctx, reference.costs, REAL, reference.fit, True))
        elif name in installed:
            with load(name) as loaded:
                own = measured(loaded, progress, home, f"advise: measuring {name} (once; cached)", refresh)
            fit = own.fit or (reference.fit if reference else None)
            rows.append(row(spec, True, machine, n_ctx, own.costs, REAL, fit, own.fit is not None))
        else:
            if measure_like is not None and dims_of(spec.target) is not None:
                costs, curves, why = measure_like(spec.target.name), RANDOM, ""
            elif reference is None:
                costs, curves = None, ""
                why = f"no curves to rescale: install {bundled.name} (edgespec models pull) or use --measure"
            else:
                costs, curves = fitted(reference, bundled, spec), FITTED
                why = "no shape known for its models"
            fit = reference.fit if reference is not None else None
            rows.append(row(spec, False, machine, n_ctx, costs, curves, fit, False, why))
    return rows


def best_pair(rows: list[Row]) -> Row | None:
    """The fastest predicted pair that fits (by plain tokens/s × speedup)."""
    ok = [r for r in rows if r.fits and r.plain is not None]
    return max(ok, key=lambda r: (r.plain or 0.0) * r.speedup, default=None)


# -- the cache the chat's hint reads ------------------------------------------------------------------
def document(machine: Machine, rows: list[Row]) -> dict:
    return {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": asdict(machine),
        "lower_acceptance": LOWER,
        "pairs": [{**asdict(r), "speedup": r.speedup} for r in rows],
    }


def save(doc: dict, home: Path | None = None) -> Path:
    return write_json(advice_path(home), doc)
