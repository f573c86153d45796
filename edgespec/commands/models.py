"""`edgespec models`: list, pull, verify, remove and locate model files."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from ..models.drafters import shipped_adapter
from ..models.paths import format_bytes, user_registry_path
from ..models.specs import PairSpec
from ..models.store import ModelStatus, ModelStore


def register(sub) -> None:
    p = sub.add_parser(
        "models",
        help="list, pull, verify and remove model files",
        description="Manage the GGUF files edgespec uses. Models and pairs come from models.toml; "
        f"add your own in {user_registry_path()}.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    p.set_defaults(run=run_list, json=False)

    ls = actions.add_parser("list", help="models and pairs: role, size, installed, verified, path")
    ls.add_argument("--json", action="store_true", help="print a JSON list of models and pairs")
    ls.set_defaults(run=run_list)

    pull = actions.add_parser("pull", help="install a model or both models of a pair")
    pull.add_argument("name", metavar="NAME|PAIR")
    pull.set_defaults(run=run_pull)

    verify = actions.add_parser("verify", help="recompute sha256 of installed models (all, or NAME|PAIR)")
    verify.add_argument("name", nargs="?", metavar="NAME|PAIR")
    verify.set_defaults(run=run_verify)

    rm = actions.add_parser("rm", help="delete an installed model file")
    rm.add_argument("name", metavar="NAME")
    rm.set_defaults(run=run_rm)

    path = actions.add_parser("path", help="print where a model file is (a local .gguf path prints itself)")
    path.add_argument("name", metavar="NAME")
    path.set_defaults(run=run_path)

    advise = actions.add_parser(
        "advise",
        help="which pair pays on this machine: fits, plain tok/s, best strategy's predicted speedup",
        description="For this machine and each registry pair: whether it fits in RAM, plain tokens/s and "
        "the best strategy's predicted speedup, from cost curves measured here (the pair's own files "
        "when installed, else the bundled pair's curves rescaled to the pair's weights, or with "
        "--measure a random-weight file of its shape) and the pair's acceptance (its own where it has "
        "run here, else the bundled pair's). Measurements are cached per machine.",
    )
    advise.add_argument("--pair", help="only this pair (default: every pair in the registry)")
    advise.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores, as bench)")
    advise.add_argument("--ctx", type=int, default=4096, help="context size the KV caches are counted at")
    advise.add_argument(
        "--measure", action="store_true", help="time random-weight files of absent targets' shapes (minutes)"
    )
    advise.add_argument("--refresh", action="store_true", help="measure the installed pairs' curves again")
    advise.add_argument("--json", action="store_true", help="print the advice as JSON")
    advise.set_defaults(run=run_advise)


def run_list(args) -> int:
    store = ModelStore()
    statuses = store.statuses()
    if args.json:
        rows = [_model_json(s) for s in statuses] + [
            _pair_json(store, p) for p in store.registry.pairs.values()
        ]
        print(json.dumps(rows, indent=2))
        return 0
    console = Console()
    wide = console.width >= 120
    console.print(_models_table(statuses, store.models_dir, wide))
    console.print(_pairs_table(store, wide))
    for pair in store.registry.pairs.values():
        drafter = _drafter(pair)
        if drafter is not None:
            console.print(
                f"parallel drafter of {pair.name}: {drafter['file']} "
                f"(K={drafter['k']}; --strategy parallelspec)"
            )
    console.print(f"models dir: {store.models_dir}")
    console.print(f"registry:   {', '.join(store.registry.files)}")
    if str(user_registry_path()) not in store.registry.files:
        console.print(f"            (add your own models and pairs in {user_registry_path()})")
    return 0


def run_pull(args) -> int:
    store = ModelStore()
    names = _model_names(store, args.name)
    before = {name: store.is_installed(name) for name in names}
    for name, path in zip(names, store.pull(args.name), strict=True):
        print(f"{name}: {'already installed' if before[name] else 'installed'} at {path}")
    return 0


def run_verify(args) -> int:
    store = ModelStore()
    if args.name:
        names = _model_names(store, args.name)
    else:
        names = [name for name in store.registry.models if store.is_installed(name)]
        if not names:
            print("no models installed; nothing to verify")
            return 0
    results = [store.verify(name) for name in names]
    for result in results:
        print(f"{result.status:<9} {result.name}  {result.describe()}")
    return 0 if all(result.ok for result in results) else 1


def run_rm(args) -> int:
    path = ModelStore().remove(args.name)
    print(f"removed {path}")
    return 0


def run_path(args) -> int:
    print(ModelStore().path_for(args.name))
    return 0


def run_advise(args) -> int:
    from contextlib import contextmanager

    from .. import options
    from ..models.pairs import available_pairs
    from ..profile import advise

    store = ModelStore()
    registry = store.registry
    pairs = {args.pair: registry.pair(args.pair)} if args.pair else dict(registry.pairs)
    bundled = registry.pairs[registry.default_pair_name]
    machine = advise.this_machine(args.threads)

    @contextmanager
    def load(name: str):
        parser = argparse.ArgumentParser()
        options.add_model_args(parser)  # every other flag at its default: the settings bench runs with
        flags = ["--pair", name, "--threads", str(args.threads), "--ctx", str(args.ctx)]
        with options.load(parser.parse_args(flags))[1] as pair:
            yield pair

    measure_like = None
    if args.measure:
        from ..profile.like import measure_like as measure_shape
        from ..progress import progress_bar

        def measure_like(name: str):
            with progress_bar(f"advise: timing a random-weight {name} (once; cached)") as bar:
                return measure_shape(name, threads=machine.threads, progress=bar).model()

    rows = advise.advise(
        pairs,
        set(available_pairs()),
        bundled,
        load,
        machine,
        args.ctx,
        measure_like=measure_like,
        refresh=args.refresh,
    )
    doc = advise.document(machine, rows)
    if not args.pair:
        advise.save(doc)  # the chat's first-run hint reads the whole registry's advice
    best = advise.best_pair(rows)
    commands = _advise_commands(best)
    if args.json:
        print(json.dumps({**doc, "best": best.pair if best else None, "commands": commands}, indent=2))
        return 0
    console = Console()
    console.print(f"this machine: {machine.describe()}")
    console.print(_advice_table(rows, console.width >= 100))
    console.print(
        f"rests on: the curves/the acceptance. Curves: files = {advise.REAL}; fitted = {advise.FITTED} "
        f"to its weights; random = {advise.RANDOM}. Acceptance: own = {advise.OWN_FIT}; bundled = the "
        f"bundled pair's, assumed. ({advise.LOWER:g}): the speedup were the draft's guesses right "
        f"{advise.LOWER:g}× as often."
    )
    for note in sorted({f"{r.pair}: {r.note}" for r in rows if r.note}):
        console.print(note)
    for line in commands:
        console.print(line)
    return 0


def _advise_commands(best) -> list[str]:
    if best is None:
        return []
    pull = [] if best.installed else [f"edgespec models pull {best.pair}"]
    strategy, _, gamma = best.best.partition(":")
    budget = f" --budget {gamma}" if gamma else ""
    return [*pull, f"edgespec chat --pair {best.pair} --strategy {strategy}{budget}"]


def _advice_table(rows, wide: bool) -> Table:
    from ..profile import advise

    short = {advise.REAL: "files", advise.RANDOM: "random", advise.FITTED: "fitted"}
    own = {advise.OWN_FIT: "own", advise.BUNDLED_FIT: "bundled"}
    table = Table(
        title="which pair for this machine", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False
    )
    for column in ("pair", "fits", "tok/s", "best", f"speedup ({advise.LOWER:g})", "rests on"):
        table.add_column(column, no_wrap=column != "rests on", min_width=12 if column == "rests on" else None)
    for r in rows:
        fits = ("yes" if r.fits else "[red]no[/]") if r.need else "?"
        if r.need and wide:
            fits += f" {format_bytes(r.need)}"
        if r.fits_gpu is not None:
            fits += f", GPU {'yes' if r.fits_gpu else 'no'}"
        if r.plain is None:
            table.add_row(r.pair, fits, "-", "-", "-", "- (below)")
            continue
        low = r.lower.get(r.best, 1.0)
        rests = f"{short.get(r.curves, r.curves)}/{own.get(r.acceptance, r.acceptance)}"
        table.add_row(r.pair, fits, f"{r.plain:.1f}", r.best, f"{r.speedup:.2f}× ({low:.2f}×)", rests)
    return table


def _model_names(store: ModelStore, name_or_pair: str) -> list[str]:
    if name_or_pair in store.registry.pairs:
        pair = store.registry.pairs[name_or_pair]
        return [pair.target.name, pair.draft.name]
    return [store.registry.model(name_or_pair).name]


def _model_json(status: ModelStatus) -> dict:
    spec = status.spec
    return {
        "kind": "model",
        "name": spec.name,
        "role": status.role,
        "installed": status.installed,
        "verified": status.verified,
        "path": str(status.path),
        "size": status.size,
        "sha256": spec.sha256,
        "quant": spec.quant,
        "tokenizer": spec.tokenizer,
        "source": spec.describe_source(),
    }


def _pair_json(store: ModelStore, pair: PairSpec) -> dict:
    members = [store.status(pair.target.name), store.status(pair.draft.name)]
    return {
        "kind": "pair",
        "name": pair.name,
        "role": "pair",
        "installed": all(m.installed for m in members),
        "verified": all(m.verified for m in members),
        "path": None,
        "target": pair.target.name,
        "draft": pair.draft.name,
        "strategy": pair.strategy,
        "budget": pair.budget,
        "params": dict(pair.params),
        "default": pair.name == store.registry.default_pair_name,
        "parallel_drafter": _drafter(pair),
    }


def _models_table(statuses: list[ModelStatus], models_dir: Path, wide: bool) -> Table:
    """One row per model. Narrow terminals get the columns that fit in 80; wide ones add the file
    (by name when it is in the store — the folder is printed below the tables) or the source."""
    table = Table(title="models", title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("name", "role", "quant", "size", "state"):
        table.add_column(column, no_wrap=True)
    if wide:
        table.add_column("file / source", overflow="fold")
    for s in statuses:
        if s.verified:
            state = "[green]verified[/]"
        else:
            state = "[yellow]unverified[/]" if s.installed else "missing"
        row = [s.spec.name, s.role or "-", s.spec.quant, format_bytes(s.size) if s.size else "?", state]
        if wide and s.installed:
            row.append(s.path.name if s.path.parent == models_dir else str(s.path))
        elif wide:
            row.append(s.spec.describe_source())
        table.add_row(*row)
    return table


def _pairs_table(store: ModelStore, wide: bool) -> Table:
    table = Table(title="pairs", title_justify="left", box=box.SIMPLE_HEAD)
    columns = (
        ("name", "target", "draft", "strategy", "budget", "params")
        if wide
        else ("name", "strategy", "budget", "params")
    )
    for column in columns:
        table.add_column(column, no_wrap=column == "name", overflow="fold")
    for pair in store.registry.pairs.values():
        default = " [bold](default)[/]" if pair.name == store.registry.default_pair_name else ""
        params = ", ".join(f"{k}={v}" for k, v in pair.params.items())
        members = [pair.target.name, pair.draft.name] if wide else []
        table.add_row(pair.name + default, *members, pair.strategy, str(pair.budget), params)
    return table


def _drafter(pair: PairSpec) -> dict | None:
    """The ParallelSpec drafter shipped for the pair's draft (``edgespec train parallel``), if any."""
    found = shipped_adapter(pair.draft.sha256, check=False) if pair.draft.sha256 else None
    if found is None:
        return None
    return {"file": found.path.name, "k": found.k, "sha256": found.sha256, "path": str(found.path)}
