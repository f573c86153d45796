"""Regenerate docs/benchmarks.md from the kept bench runs listed in docs/bench/page.toml.

    python scripts/benchmarks_page.py            # write docs/benchmarks.md
    python scripts/benchmarks_page.py --check    # exit 1 if the committed page differs from the runs

To add a run: `edgespec bench ... --json docs/bench/NAME.json`, add a [[run]] for it to the list, run this.
The page is generated from the runs so that it cannot drift from them; tests/unit/test_benchmarks_page.py
checks the committed one against them. A development tool: it is not part of the package.

The list's format::

    intro = "markdown before the tables"
    outro = "markdown after them"

    [[machine]]                       # one section per machine, in this order
    id = "xeon"
    title = "Intel Xeon, 2 cores"     # the section's heading
    cpu = "Intel(R) Xeon(R) Processor"  # must equal the runs' recorded hardware.cpu
    amx = true                        # what the JSON cannot say: AMX on the CPU (builds never use it)
    note = "markdown under the heading"

    [[run]]                           # one bench --json file each, relative to the list
    file = "xeon-copy-edit.json"
    machine = "xeon"
    keys = ["hybrid"]                 # optional: only these strategies of the run
    label = "+20 ms"                  # optional: what sets this run apart, after its prompts
    note = "optional, after the run's command"

Per machine: the CPU as recorded (model, cores, the instruction sets llama.cpp was built with), one table
of every kept strategy against plain decoding in the same run (paired speedup and its range, MAL, verified
tokens and draft passes per step, tokens/s), then each run's command — as recorded, with the program shown
as ``edgespec``, ``--json`` as the file's place in the repository and ``--plot`` left out.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from edgespec.errors import EdgespecError
from edgespec.measure.document import read_json
from edgespec.measure.report import _num

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

VERIFY_EXAMPLE = 16  # the runs' cost profiles are summarised as "verifying 16 tokens costs c_t(16)/c_t(1)"


@dataclass(frozen=True)
class Machine:
    id: str
    title: str
    cpu: str  # hardware.cpu as the runs recorded it
    amx: bool = False  # AMX on the CPU (a bench JSON records only what llama.cpp was built with)
    note: str = ""


@dataclass(frozen=True)
class Run:
    path: Path  # the bench --json file
    machine: str
    keys: tuple[str, ...] = ()  # only these results (all when empty)
    note: str = ""
    label: str = ""  # shown after the prompts: what sets this run apart (a network delay, say)


@dataclass(frozen=True)
class PageList:
    path: Path  # the list file itself
    intro: str
    outro: str
    machines: tuple[Machine, ...]
    runs: tuple[Run, ...]


def load_list(path: str | Path) -> PageList:
    """The TOML list (module docstring), checked: every run names a known machine and an existing file."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EdgespecError(f"cannot read the benchmark page list {path}: {exc}") from exc
    try:
        machines = tuple(Machine(**m) for m in data.get("machine", []))
        runs = tuple(
            Run(
                path.parent / r["file"],
                r["machine"],
                tuple(r.get("keys", ())),
                r.get("note", ""),
                r.get("label", ""),
            )
            for r in data.get("run", [])
        )
    except (KeyError, TypeError) as exc:
        raise EdgespecError(f"{path}: a [[machine]] or [[run]] entry is malformed ({exc})") from exc
    known = {m.id for m in machines}
    for run in runs:
        if run.machine not in known:
            raise EdgespecError(
                f"{path}: run {run.path.name} names machine {run.machine!r}; add it as a [[machine]]"
            )
        if not run.path.is_file():
            raise EdgespecError(f"{path}: run file {run.path} does not exist")
    return PageList(path, data.get("intro", "").strip(), data.get("outro", "").strip(), machines, runs)


# -- pieces ---------------------------------------------------------------------------------------------
def shown_command(command: str, json_path: str, inputs: dict[str, str] | None = None) -> str:
    """The recorded command with the program as ``edgespec``, ``--json`` as ``json_path``, ``--plot`` left
    out and a ``--prompts`` file named by ``inputs`` (basename → its path here). Refuses a command that
    still names a path of the machine it ran on."""
    words = shlex.split(command)
    if "bench" not in words:
        raise EdgespecError(f"not a bench command: {command!r}")
    rest = words[words.index("bench") :]
    out = ["edgespec"]
    i = 0
    while i < len(rest):
        word = rest[i]
        value = rest[i + 1] if i + 1 < len(rest) else None
        if word == "--plot":
            i += 2
            continue
        if word == "--json":
            out += [word, json_path]
            i += 2
            continue
        if word == "--prompts" and value is not None and inputs and Path(value).name in inputs:
            out += [word, inputs[Path(value).name]]
            i += 2
            continue
        out.append(word)
        i += 1
    machine_paths = [w for w in out if w.startswith("/") or w.startswith("~")]
    if machine_paths:
        raise EdgespecError(f"{json_path}: the command names its machine's paths: {machine_paths}")
    return shlex.join(out)


def instruction_sets(doc: dict) -> str:
    """The instruction sets llama.cpp was built with (hardware.llama_system_info), e.g.
    "AVX2, AVX-512 (VBMI, VNNI, BF16)"."""
    info = doc.get("hardware", {}).get("llama_system_info", "")
    on = [f.split("=")[0].strip() for f in info.split("|") if f.strip().endswith("= 1")]
    sets = [name for name in ("AVX2", "AVX_VNNI") if name in on]
    sets = [s.replace("_", "-") for s in sets]
    if "AVX512" in on:
        subsets = [f.removeprefix("AVX512_") for f in on if f.startswith("AVX512_")]
        sets.append("AVX-512" + (f" ({', '.join(subsets)})" if subsets else ""))
    if any(f.startswith("AMX") for f in on):
        sets.append("AMX")
    return ", ".join(sets) or "not recorded"


def cpu_features(hardware: dict) -> str:
    """" (AVX2, AVX-512)" or " (AVX2, no AVX-512)": what the CPU itself has, where the run recorded it
    (a virtual machine's model name, "AMD EPYC", may not tell)."""
    flags = hardware.get("cpu_features")
    if flags is None:
        return ""
    avx2 = "AVX2" if "avx2" in flags else "no AVX2"
    return f" ({avx2}, {'AVX-512' if 'avx512f' in flags else 'no AVX-512'})"


def verify_cost(doc: dict, n: int = VERIFY_EXAMPLE) -> float | None:
    """c_t(n) / c_t(1) from the run's cost profile (None when the run measured none)."""
    target = (doc.get("cost_profile") or {}).get("target") or {}
    if "1" not in target or str(n) not in target:
        return None
    return target[str(n)] / target["1"]


def draft_cost(doc: dict) -> float | None:
    """c_d(1) / c_t(1): one draft pass of one token in target decodes (None without a cost profile)."""
    profile = doc.get("cost_profile") or {}
    target, draft = profile.get("target") or {}, profile.get("draft") or {}
    if "1" not in target or "1" not in draft:
        return None
    return draft["1"] / target["1"]


def _prompts(doc: dict) -> str:
    settings = doc["settings"]
    name = str(settings.get("prompts", ""))
    name = Path(name).name if name.endswith(".jsonl") else name.replace(",", ", ")
    return f"{name} ({len(settings.get('prompt_names', []))})"


def _speedup(value: float) -> str:
    text = f"{value:.2f}×"
    return f"**{text}**" if value > 1.0 else text


def _settings(doc: dict) -> str:
    s, hw = doc["settings"], doc["hardware"]
    threads = hw.get("threads")
    sampling = "greedy" if not s.get("temperature") else f"temperature {s['temperature']}"
    parts = [
        doc["created"][:10],
        f"{threads} thread{'' if threads == 1 else 's'}",
        f"{s['max_tokens']} tokens per answer",
        sampling,
    ]
    cost, draft = verify_cost(doc), draft_cost(doc)
    if cost is not None:
        parts.append(f"verifying {VERIFY_EXAMPLE} tokens cost {cost:.1f} target decodes")
    if draft is not None:
        parts[-1] += f", one draft pass {draft:.2f}"
    return ", ".join(parts)


# -- the page -------------------------------------------------------------------------------------------
TABLE_HEAD = (
    "| strategy | prompts | speedup | range | MAL | verified / step | draft passes / step "
    "| tok/s (plain) | run |\n|---|---|---:|---:|---:|---:|---:|---:|---:|"
)


def _machine_section(machine: Machine, runs: list[tuple[Run, dict]], root: Path, inputs: dict) -> list[str]:
    first = runs[0][1]
    hw = first["hardware"]
    sets = instruction_sets(first)
    if "AMX" in sets:
        amx = "AMX used"
    elif machine.amx:
        amx = "AMX on the CPU, not used (llama.cpp's AMX kernels are built off)"
    else:
        amx = "no AMX"
    lines = [
        f"## {machine.title}",
        "",
        f"Recorded CPU `{hw['cpu']}`{cpu_features(hw)}, {hw.get('cpu_cores')} cores, {hw.get('machine')}; "
        f"llama.cpp built with {sets}; {amx}.",
    ]
    if machine.note:
        lines += ["", machine.note.strip()]
    lines += ["", TABLE_HEAD]
    for number, (run, doc) in enumerate(runs, 1):
        base = doc["baseline"]["tokens_per_second"]
        results = [r for r in doc["results"] if not run.keys or r["key"] in run.keys]
        missing = set(run.keys) - {r["key"] for r in results}
        if missing:
            raise EdgespecError(f"{run.path}: no results for {sorted(missing)}")
        for r in results:
            spread = r["speedup_spread"]
            lines.append(
                f"| `{r['key']}` | {_prompts(doc)}{', ' + run.label if run.label else ''} | "
                f"{_speedup(r['speedup'])} | "
                f"{_num(spread['min'])}–{_num(spread['max'])} | {_num(r['mal'])} | "
                f"{_num(r['verified_per_step'], 1)} | {_num(r['draft_decodes_per_step'])} | "
                f"{_num(r['tokens_per_second'], 1)} ({_num(base, 1)}) | {number} |"
            )
    lines += ["", "Runs:", ""]
    for number, (run, doc) in enumerate(runs, 1):
        shown = run.path.relative_to(root).as_posix()
        lines.append(f"{number}. `{shown_command(doc['command'], shown, inputs)}`")
        lines.append(f"   — {_settings(doc)}." + (f" {run.note.strip()}" if run.note else ""))
    return lines


def render(page: PageList, root: str | Path, generated_by: str) -> str:
    """The page's markdown. ``root``: the directory paths are shown relative to (the repository);
    ``generated_by``: the command that regenerates the page, named in its first line."""
    root = Path(root)
    inputs = {
        p.name: p.relative_to(root).as_posix() for p in page.path.parent.iterdir() if p.suffix == ".jsonl"
    }
    docs = [(run, read_json(run.path)) for run in page.runs]
    source = page.path.relative_to(root).as_posix()
    lines = [f"<!-- Generated by `{generated_by}` from {source}: edit that. -->"]
    lines += ["", page.intro]
    for machine in page.machines:
        runs = [(run, doc) for run, doc in docs if run.machine == machine.id]
        if not runs:
            continue
        for run, doc in runs:
            if doc.get("hardware", {}).get("cpu") != machine.cpu:
                raise EdgespecError(
                    f"{run.path} ran on {doc.get('hardware', {}).get('cpu')!r}, not on machine "
                    f"{machine.id!r} ({machine.cpu!r}): fix the run's machine in {page.path.name}"
                )
        lines += ["", *_machine_section(machine, runs, root, inputs)]
    if page.outro:
        lines += ["", page.outro]
    return "\n".join(lines) + "\n"


# -- the command ------------------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent
LIST = ROOT / "docs" / "bench" / "page.toml"
PAGE = ROOT / "docs" / "benchmarks.md"
COMMAND = "python scripts/benchmarks_page.py"


def build() -> str:
    return render(load_list(LIST), ROOT, COMMAND)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="compare with the committed page instead of writing")
    args = p.parse_args(argv)
    text = build()
    if args.check:
        if PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE.relative_to(ROOT)} is out of date: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
