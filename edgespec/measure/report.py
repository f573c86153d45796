"""What a bench run shows: the Rich table, auto's verdict, the cost profile, the PNG plot and the
comparison of two runs. The JSON document they read (its schema) is ``document``'s.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

AUTO_FLOOR = 0.98  # auto must keep at least this paired tokens/s ratio against plain decoding


# -- table ----------------------------------------------------------------------------------------------
def _x(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}×"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def _num(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def results_table(doc: dict) -> Table:
    base = doc["baseline"]
    n_prompts = len(doc.get("per_prompt", []))
    timing_only = f"TIMING ONLY ({doc['timing_only_why']}). " if doc.get("timing_only") else ""
    table = Table(
        title=f"edgespec bench — {doc['pair'].get('name', '')}{' — timing only' if timing_only else ''}",
        caption=(
            f"{timing_only}speedup: median over the strategy's runs ({n_prompts} prompts) of the paired "
            "ratio (tokens/s ÷ tokens/s of the plain runs just before and after, same prompt); "
            "range = min–max. efficiency = speedup ÷ MAL. py ms/step: wall time per step outside both "
            "models' llama_decode (median over prompts). MAL/pass, MAL/verified: tokens committed per draft "
            "forward pass, per token the target verified."
        ),
        caption_justify="left",
    )
    for col, justify in (
        ("strategy", "left"),
        ("params", "left"),
        ("tok/s", "right"),
        ("speedup", "right"),
        ("range", "right"),
        ("MAL", "right"),
        ("accept", "right"),
        ("verified/step", "right"),
        ("draft dec/step", "right"),
        ("draft|verify|other", "right"),
        ("py ms/step", "right"),
        ("MAL/pass", "right"),
        ("MAL/verified", "right"),
        ("efficiency", "right"),
    ):
        table.add_column(col, justify=justify)
    split = base["time_split"]
    table.add_row(
        "plain",
        "",
        _num(base["tokens_per_second"], 1),
        "1.00×",
        "",
        _num(base["mal"]),
        "–",
        _num(base["verified_per_step"]),
        "0",
        f"{split['draft']:.0%}|{split['verify']:.0%}|{split['overhead']:.0%}",
        _num(base.get("python_ms_per_step")),
        "",
        _num(base.get("mal_per_verified_token")),
        "",
    )
    for r in doc["results"]:
        spread = r["speedup_spread"]
        split = r["time_split"]
        table.add_row(
            r["key"],
            r.get("params", ""),
            _num(r["tokens_per_second"], 1),
            _x(r["speedup"]),
            f"{_num(spread['min'])}–{_num(spread['max'])}" if spread["min"] is not None else "",
            _num(r["mal"]),
            _pct(r["acceptance_rate"]) if r["drafted"] else "–",
            _num(r["verified_per_step"]),
            _num(r["draft_decodes_per_step"]),
            f"{split['draft']:.0%}|{split['verify']:.0%}|{split['overhead']:.0%}",
            _num(r.get("python_ms_per_step_median", r.get("python_ms_per_step"))),
            _num(r.get("mal_per_draft_pass")),
            _num(r.get("mal_per_verified_token")),
            _num(r["efficiency"]),
        )
    return table


def auto_lines(doc: dict) -> list[str]:
    """The check that matters for ``auto``: never slower than plain decoding (paired ratio ≥ 0.98)."""
    lines = []
    for r in doc["results"]:
        if r["strategy"] != "auto" or r["speedup"] is None:
            continue
        s = r["speedup_spread"]
        verdict = "OK" if r["speedup"] >= AUTO_FLOOR else "BELOW"
        lines.append(
            f"{r['key']} vs plain: paired tokens/s ratio median {s['median']:.3f} (IQR {s['p25']:.3f}–"
            f"{s['p75']:.3f}, min {s['min']:.3f}, max {s['max']:.3f}; pooled {r['pooled_speedup']:.3f}) "
            f"over {len(r['paired_ratios'])} runs on {len(doc.get('per_prompt', []))} prompts — {verdict} "
            f"(floor {AUTO_FLOOR}); "
            f"plain steps {r['plain_step_share']:.0%}"
        )
        worst = worst_prompt(doc, r["key"])
        if worst and len(doc["per_prompt"]) > 1:
            lines[-1] += f"; worst prompt {worst[1]:.3f} ({worst[0]})"
    return lines


def worst_prompt(doc: dict, key: str) -> tuple[str, float] | None:
    """The prompt on which the strategy ``key`` did worst (its paired ratio there, as bench reports it)."""
    ratios = [
        (p["prompt"], p["variants"][key]["ratio"])
        for p in doc.get("per_prompt", [])
        if p["variants"].get(key, {}).get("ratio") is not None
    ]
    return min(ratios, key=lambda item: item[1]) if ratios else None


def noise_line(doc: dict) -> str | None:
    """Plain decoding against itself, paired the same way: how far a ratio moves with nothing changed."""
    noise = doc["baseline"].get("noise")
    if not noise or noise["per_run"]["min"] is None:
        return None
    run, prompt = noise["per_run"], noise["per_prompt"]
    return (
        f"noise (each plain run ÷ the plain runs before and after it, same prompt: what a strategy that "
        f"changed nothing scores): per run {run['min']:.2f}–{run['max']:.2f}× (IQR {run['p25']:.2f}–"
        f"{run['p75']:.2f}), per prompt {prompt['min']:.2f}–{prompt['max']:.2f}×"
    )


def print_report(doc: dict, console: Console | None = None) -> None:
    console = console or Console()
    console.print(results_table(doc))
    for line in auto_lines(doc):
        console.print(line)
    noise = noise_line(doc)
    if noise:
        console.print(noise, style="dim")
    prefill = doc.get("per_prompt", [])
    if prefill:
        t = sum(p["prefill_target_seconds"] for p in prefill)
        d = sum(p["prefill_draft_seconds"] for p in prefill)
        console.print(
            f"prefill (not in tokens/s): target {t:.1f} s, draft {d:.1f} s over {len(prefill)} prompts",
            style="dim",
        )


# -- profile table --------------------------------------------------------------------------------------
def profile_table(profile) -> Table:
    table = Table(
        title="cost profile (median seconds per decode)",
        caption="rel = cost ÷ cost of one token: 1.0 everywhere would be free batching (memory-bound), "
        "n everywhere compute-bound. target: verify of n tokens; draft: one level of n nodes; "
        "catch-up: the draft decoding n committed tokens.",
        caption_justify="left",
    )
    for col in ("n", "target ms", "rel", "draft ms", "rel", "catch-up ms", "rel"):
        table.add_column(col, justify="right")

    def ms(v):
        return "" if v is None else f"{v * 1e3:.1f}"

    def rel(v):
        return "" if v is None else f"{v:.2f}"

    for row in profile.rows():
        table.add_row(
            str(row["n"]),
            ms(row["target"]),
            rel(row["target_rel"]),
            ms(row["draft"]),
            rel(row["draft_rel"]),
            ms(row["catchup"]),
            rel(row["catchup_rel"]),
        )
    return table


# -- plot -----------------------------------------------------------------------------------------------
def plot(doc: dict, path: str | Path) -> None:
    """Speedup (median, min–max whiskers) and MAL per strategy/budget, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = doc["results"]
    keys = [r["key"] for r in results]
    speedup = [r["speedup"] or 0.0 for r in results]
    low = [max((r["speedup"] or 0.0) - (r["speedup_spread"]["min"] or 0.0), 0.0) for r in results]
    high = [max((r["speedup_spread"]["max"] or 0.0) - (r["speedup"] or 0.0), 0.0) for r in results]
    mal = [r["mal"] for r in results]
    x = range(len(keys))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(8, 1.4 * len(keys) + 4), 4.5))
    # green: faster than plain decoding; grey: within the 2 % auto is held to; red: slower
    colors = ["tab:green" if v > 1.0 else "tab:gray" if v >= AUTO_FLOOR else "tab:red" for v in speedup]
    ax1.bar(x, speedup, yerr=[low, high], capsize=4, color=colors, alpha=0.8)
    ax1.axhline(1.0, color="black", linewidth=1, linestyle="--", label="plain decoding")
    ax1.set_xticks(list(x), keys, rotation=30, ha="right")
    ax1.set_ylabel("speedup vs plain (median paired ratio)")
    ax1.set_title("tokens/s ÷ plain (whiskers: min–max over runs)")
    ax1.set_ylim(0, max([1.15, *(s + h + 0.1 for s, h in zip(speedup, high))]))
    ax1.legend(loc="upper left", fontsize=8)
    for i, (v, h) in enumerate(zip(speedup, high)):
        ax1.annotate(
            f"{v:.2f}×",
            (i, v + h),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, 2),
            textcoords="offset points",
        )
    ax2.bar(x, mal, color="tab:blue", alpha=0.8)
    ax2.axhline(1.0, color="black", linewidth=1, linestyle="--")
    ax2.set_xticks(list(x), keys, rotation=30, ha="right")
    ax2.set_ylabel("MAL (tokens per target call)")
    ax2.set_title("mean accepted length")
    for i, m in enumerate(mal):
        ax2.annotate(
            f"{m:.2f}",
            (i, m),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, 2),
            textcoords="offset points",
        )
    hw = doc.get("hardware", {})
    threads = hw.get("threads", "?")
    fig.suptitle(
        f"{doc['pair'].get('name', '')} — {hw.get('cpu', '')}, {threads} thread{'' if threads == 1 else 's'}"
        + (f", GPU {', '.join(hw['gpus'])}" if hw.get("gpus") else "")
        + f" — {doc['settings'].get('max_tokens')} tokens, T={doc['settings'].get('temperature')}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- compare --------------------------------------------------------------------------------------------
def compare(a: dict, b: dict, names: tuple[str, str] = ("A", "B")) -> tuple[Table, list[str]]:
    """Per strategy/budget: speedup, MAL and tokens/s of two runs side by side, with the differences;
    plus the lines where the two runs' setups differ."""
    table = Table(title=f"bench comparison: {names[0]} → {names[1]}")
    for col in (
        "strategy",
        f"speedup {names[0]}",
        f"speedup {names[1]}",
        "Δ speedup",
        f"MAL {names[0]}",
        f"MAL {names[1]}",
        "Δ MAL",
        f"tok/s {names[0]}",
        f"tok/s {names[1]}",
        "Δ tok/s",
    ):
        table.add_column(col, justify="left" if col == "strategy" else "right")
    rows_a = {"plain": a["baseline"], **{r["key"]: r for r in a["results"]}}
    rows_b = {"plain": b["baseline"], **{r["key"]: r for r in b["results"]}}
    for key in list(dict.fromkeys([*rows_a, *rows_b])):
        ra, rb = rows_a.get(key), rows_b.get(key)
        get = _getter(key)
        sa, sb = get(ra, "speedup"), get(rb, "speedup")
        ma, mb = get(ra, "mal"), get(rb, "mal")
        ta, tb = get(ra, "tokens_per_second"), get(rb, "tokens_per_second")
        table.add_row(
            key,
            _x(sa),
            _x(sb),
            _signed(sa, sb),
            _num(ma),
            _num(mb),
            _signed(ma, mb),
            _num(ta, 1),
            _num(tb, 1),
            "–" if not ta or tb is None else f"{(tb / ta - 1):+.1%}",
        )
    notes = []
    for section, fields in (
        ("hardware", ("cpu", "gpus", "threads", "target_gpu_layers", "draft_gpu_layers")),
        ("software", ("edgespec", "llama_cpp_python")),
        ("settings", ("max_tokens", "temperature", "prompts")),
    ):
        for field in fields:
            va, vb = a.get(section, {}).get(field), b.get(section, {}).get(field)
            if va != vb:
                notes.append(f"{section}.{field}: {va} → {vb}")
    for role in ("target", "draft"):
        sa_, sb_ = (doc.get("pair", {}).get(role) or {} for doc in (a, b))
        if sa_.get("sha256") != sb_.get("sha256"):
            notes.append(f"{role} model sha256: {sa_.get('sha256')} → {sb_.get('sha256')}")
    return table, notes


def _getter(key: str):
    def get(row: dict | None, field: str):
        if row is None:
            return None
        return 1.0 if key == "plain" and field == "speedup" else row.get(field)

    return get


def _signed(a: float | None, b: float | None) -> str:
    return "–" if a is None or b is None else f"{b - a:+.2f}"
