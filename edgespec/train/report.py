"""The training record as a plot (loss per depth over steps) and a short markdown summary."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def smooth(values: np.ndarray, window: int = 20) -> np.ndarray:
    """Trailing mean over ``window`` steps (one step is two sequences: the raw curve is noisy)."""
    out = np.empty_like(values, dtype=float)
    for i in range(len(values)):
        out[i] = values[max(0, i - window + 1) : i + 1].mean()
    return out


def plot_curve(record: dict, out: Path, window: int = 20) -> Path:
    """PNG of the cross-entropy per depth (0: next token, k: MASK_k) against optimiser steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = record["loss_curve"]["columns"]
    rows = np.array(record["loss_curve"]["rows"], dtype=float)
    step = rows[:, columns.index("step")]
    fig, ax = plt.subplots(figsize=(7, 4))
    for k in range(record["k"] + 1):
        label = "next token (depth 0)" if k == 0 else f"MASK_{k} (token t+{k + 1})"
        ax.plot(step, smooth(rows[:, columns.index(f"ce{k}")], window), label=label)
    ax.set_yscale("log")
    ax.set_xlabel("optimiser step (2 sequences each)")
    ax.set_ylabel(f"cross-entropy (trailing mean of {window})")
    ax.set_title(f"ParallelSpec drafter, {record['base_model']}, K={record['k']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def summary_markdown(record: dict) -> str:
    """A table: held-out CE and top-1 per depth before and after training, and the run's totals."""
    before, after = record["eval_before"], record["eval_after"]
    lines = ["| depth | predicts | held-out rows | CE before | CE after | top-1 before | top-1 after |",
             "|---|---|---|---|---|---|---|"]
    for k in range(record["k"] + 1):
        what = "x_{t+1} (last real token)" if k == 0 else f"x_{{t+{k + 1}}} (MASK_{k})"
        lines.append(f"| {k} | {what} | {after['rows'][k]} | {before['ce'][k]:.3f} | {after['ce'][k]:.3f} | "
                     f"{before['top1'][k]:.1%} | {after['top1'][k]:.1%} |")
    return "\n".join(lines)
