"""The chat's first-run hint: where `edgespec models advise` has cached a pair predicted at least
``PAYS`` × faster than plain decoding, that fits this machine and is not installed, one notification
says so with its pull command — once per data home (a marker remembers it was shown). Nothing is
measured here: without cached advice there is no hint."""

from __future__ import annotations

import json
from pathlib import Path

from textual.app import App

from edgespec.models.paths import advice_path, home_dir

PAYS = 1.5  # predicted speedup a pair needs for the hint
MARKER = "advise-hint-shown"  # in the data home: the hint was shown (and so dismissed for good)


def hint(advice: dict) -> str | None:
    """The hint's line for an advice document (``edgespec.profile.advise.document``), None when no
    pair qualifies; the fastest qualifying pair by predicted tokens/s."""
    rows = [
        r
        for r in advice.get("pairs", [])
        if r.get("fits") and not r.get("installed") and r.get("plain") and r.get("speedup", 0) >= PAYS
    ]
    if not rows:
        return None
    best = max(rows, key=lambda r: r["plain"] * r["speedup"])
    return (
        f"{best['pair']} is predicted {best['speedup']:.1f}× faster than plain decoding on this machine "
        f"({best['best']}; see `edgespec models advise`). Get it: edgespec models pull {best['pair']}"
    )


def first_run_hint(home: Path | None = None) -> str | None:
    """The hint if it was never shown in this data home, marking it shown; else None."""
    marker = (home or home_dir()) / MARKER
    if marker.exists():
        return None
    try:
        advice = json.loads(advice_path(home).read_text())
    except (OSError, ValueError):
        return None
    line = hint(advice)
    if line is not None:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(line + "\n")
    return line


def show_first_run_hint(app: App, home: Path | None = None) -> None:
    """Notify ``app`` of the hint, when there is one to show (called once, on mount)."""
    line = first_run_hint(home)
    if line is not None:
        app.notify(line, title="a faster pair for this machine", timeout=30)
