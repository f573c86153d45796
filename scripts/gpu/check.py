"""The prepared GPU device check, one stage per call (``scripts/gpu/check.sh`` runs them all, each under
its own time limit; see scripts/gpu/README.md). Each stage writes ``OUT/result.json`` and ``OUT/summary.md``
when it ends, so a timeout later in the run loses nothing before it.

Stages:

- ``sanity``: the library loads, sees the CUDA device (``--dry``: any device), and one plain decode runs.
- ``lossless``: every strategy's greedy tokens equal plain decoding's, or first differ where plain
  decoding's top-2 logit gap is under ``--near-tie`` (a batch sums in another order than one token);
  flash attention on and off; draft ≠ target and draft = target; the target's rows reduced by numpy
  and by llama.cpp's backend samplers. Random weights leave margins of ~0.1, so each emitted token is
  also checked to be the argmax of its own row of the verify batch (``rowcheck.py``; numpy's
  reductions, where the engine hands the decoder whole rows).
- ``auto``: auto against plain decoding, paired (alternating runs, tokens/s).
- ``sampling``: the engine's reductions on the GPU (llama.cpp's backend samplers) against numpy's,
  paired, for plain, chain and auto; greedy tokens equal. Skipped when the engine has no such setting.
- ``curves``: c_t(n), c_d(n), plain tokens/s and chains as run (``kit.measure_target``) for each target
  at full and half offload.
- ``binary``: the CUDA binary's ``--help`` and one answer on the GPU.

``--dry``: the same logic on the CPU with tiny random models (``randomgguf.write_tiny_gguf``; draft ≠
target by seed), every stage small: tests/engine/test_gpu_check.py runs it. ``--layers N``: the GPU
run's shapes and sizes with every model cut to N layers (the GPU path tried on any machine).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from stages import RUN, STAGES  # scripts/gpu on PYTHONPATH (check.sh)
from workload import DRY, GPU


def summary(stage: str, result: dict) -> str:
    """A few lines a reader takes in at a glance; the JSON next to it has everything."""
    state = "skipped: " + result["skipped"] if "skipped" in result else ("ok" if result["ok"] else "FAILED")
    lines = [f"# {stage}: {state}", ""]
    keys = (
        "error",
        "system_info",
        "nvidia_smi",
        "tokens_per_second",
        "rows_checked",
        "near_tie_divergences",
        "auto_over_plain",
        "answer_rc",
        "seconds",
    )
    lines += [f"- {k}: {result[k]}" for k in keys if k in result]
    lines += [f"- failure: {json.dumps(f)}" for f in result.get("failures", [])[:10]]
    lines += [
        f"- {k}: backend/numpy {v['backend_over_numpy']:.3f}, same tokens {v['same_tokens']}"
        for k, v in result.items()
        if isinstance(v, dict) and "backend_over_numpy" in v
    ]
    if "table" in result:
        lines += ["", result["table"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/gpu/check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("stage", choices=[*STAGES, "gen"])
    p.add_argument("--out", required=True, help="this stage's folder: result.json and summary.md")
    p.add_argument("--work", required=True, help="where the random GGUFs go (kept between stages)")
    p.add_argument("--tokenizer-from", default="gpu-kit/qwen2.5-tokenizer.gguf")
    p.add_argument("--dry", action="store_true", help="tiny models on the CPU: the test suite's run")
    p.add_argument("--layers", type=int, help="real shapes cut to this many layers (the GPU path on a CPU)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument(
        "--near-tie", type=float, default=0.1, help="plain's top-2 gap under which a divergence passes"
    )
    p.add_argument("--binary", default="", help="the command to run as the binary (default: none)")
    args = p.parse_args(argv)
    args.sizes = DRY if args.dry else GPU
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        result = RUN[args.stage](args)
    except Exception as err:  # recorded for the report: the next stage still runs
        result = {
            "ok": False,
            "error": f"{type(err).__name__}: {err}",
            "traceback": traceback.format_exc()[-4000:],
        }
    result["seconds"] = round(time.monotonic() - started, 1)
    (out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "summary.md").write_text(summary(args.stage, result))
    print(summary(args.stage, result), end="")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
