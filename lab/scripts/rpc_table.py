#!/usr/bin/env python3
"""Issue 38's table: the bundled target split over two RPC servers on this machine, at added one-way
delays, edgespec's strategies paired against plain decoding next to llama.cpp's own
``llama-speculative-simple --rpc`` on the same servers, through the same delaying proxies.

Two ``edgespec rpc-server`` processes (1 thread each) hold a third of the target each; this machine
keeps the last third, the logits and the draft (``--tensor-split 1,1,1``). For each delay, a
``DelayProxy`` per server adds the delay each way, and

- ``edgespec bench --rpc … --strategies …`` runs plain and each strategy interleaved per prompt
  (auto measures its cost profile over that link first: the profile is keyed by the proxies' ports,
  one port pair per delay);
- llama.cpp runs each prompt with its plain loop (an n-gram key that never matches), its draft chain at
  the default (3) and longer ``--spec-draft-n-max``, and an n-gram type, between two plain runs. llama.cpp
  cannot keep this machine's CPU after the RPC devices in its device list: ``-ngl`` offloads the last
  layers instead, so it runs the first third here and the rest on the servers (same split, other order;
  the logits come back over the link).

    python lab/scripts/rpc_table.py BUILD/bin OUTDIR [--delays 0,5,20,50] [--prompts 3] [--tokens 32]
        [--rounds R] [--llama-modes "draft n-max default,draft n-max 4,ngram-mod"]

``--rounds`` R > 1: each delay runs both sides R times, in alternating order (ABBA…), and writes the
rates pooled over the rounds and auto's and chain's ratio to llama.cpp's best mode (pooled-DELAYms.txt).
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from statistics import median

from edgespec.measure.prompts import load_prompts
from edgespec.models.pairs import resolve_pair

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from netdelay import DelayProxy  # noqa: E402  (scripts/netdelay.py: a dev tool, not in the package)

SERVER_PORTS = (50152, 50153)
NEVER_MATCHES = ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1024")
LLAMA_MODES = {
    "draft n-max default": ("--spec-type", "draft-simple"),
    **{
        f"draft n-max {n}": ("--spec-type", "draft-simple", "--spec-draft-n-max", str(n))
        for n in (4, 5, 6, 8, 16)
    },
    "ngram-mod": ("--spec-type", "ngram-mod"),
}


def wait_port(port: int, seconds: float = 60) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"rpc-server on {port} did not start")


def llama_run(
    binary: Path, target: str, draft: str, prompt: Path, spec, tokens: int, rpc: str, flash_attn: str
) -> dict:
    command = [
        str(binary),
        "-m",
        target,
        "-md",
        draft,
        "-f",
        str(prompt),
        *spec,
        "-n",
        str(tokens),
        "--temp",
        "0",
        "--top-k",
        "1",
        "-t",
        "1",
        "-c",
        "4096",
        "--rpc",
        rpc,
        "-ngl",
        "19",
        "-ts",
        "1,1",
        "-ngld",
        "0",
        "-fa",
        flash_attn,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    log = done.stderr
    decoded = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
    if done.returncode != 0 or decoded is None:
        raise SystemExit(f"{' '.join(command)} failed:\n{log[-3000:]}")
    n, seconds = int(decoded.group(1)), float(decoded.group(2))
    accepted = int(re.search(r"n_accept\s+= (\d+)", log).group(1))
    drafted = int(re.search(r"n_drafted\s+= (\d+)", log).group(1))
    steps = n - accepted  # a step commits its accepted drafts and one token of the target's own
    return {"tokens": n, "seconds": seconds, "steps": steps, "verified": steps + drafted}


def llama_side(binary: Path, prompts, delay_ports, tokens: int, tmp: Path, flash_attn: str, modes) -> dict:
    resolved = resolve_pair()
    target, draft = str(resolved.target_path), str(resolved.draft_path)
    rpc = ",".join(f"127.0.0.1:{p}" for p in delay_ports)
    out: dict[str, list] = {"plain": [], **{m: [] for m in modes}}
    ratios: dict[str, list] = {m: [] for m in modes}
    for i, text in enumerate(prompts):
        path = tmp / f"prompt{i}.txt"
        path.write_text(text + "\n", encoding="utf-8")  # llama.cpp strips one trailing newline from -f
        # plain, each mode, plain again: a mode's ratio is to the pooled plain runs of its prompt
        plain = [llama_run(binary, target, draft, path, NEVER_MATCHES, tokens, rpc, flash_attn)]
        runs = {
            mode: llama_run(binary, target, draft, path, spec, tokens, rpc, flash_attn)
            for mode, spec in modes.items()
        }
        plain.append(llama_run(binary, target, draft, path, NEVER_MATCHES, tokens, rpc, flash_attn))
        pooled = sum(p["tokens"] for p in plain) / sum(p["seconds"] for p in plain)
        for mode, run in runs.items():
            ratios[mode].append(run["tokens"] / run["seconds"] / pooled)
            out[mode].append(run)
            print(
                f"  llama.cpp prompt {i} {mode:20s} {run['tokens'] / run['seconds']:6.2f} tok/s  ratio "
                f"{ratios[mode][-1]:.2f}  plain {pooled:.2f} tok/s",
                flush=True,
            )
        out["plain"].extend(plain)
    summary = {}
    for mode, runs in out.items():
        tok, sec = sum(r["tokens"] for r in runs), sum(r["seconds"] for r in runs)
        steps, verified = sum(r["steps"] for r in runs), sum(r["verified"] for r in runs)
        summary[mode] = {
            "tokens_per_second": tok / sec,
            "mal": tok / steps,
            "verified_per_step": verified / steps,
            "speedup": median(ratios[mode]) if mode in ratios else 1.0,
            "runs": runs,
        }
    return summary


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("tools", type=Path, help="llama.cpp's build/bin (lab/scripts/build_llama_tools.sh)")
    parser.add_argument("out", type=Path)
    parser.add_argument("--delays", default="0,5,20,50")
    parser.add_argument("--prompts", type=int, default=3, help="the first N of the quick set")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--strategies", default="chain,dyspec:16,opt-tree:16,auto")
    parser.add_argument("--skip-llama", action="store_true")
    parser.add_argument("--rounds", type=int, default=1, help="per delay: both sides, alternating order")
    parser.add_argument("--llama-modes", default=",".join(LLAMA_MODES), help="of: " + ", ".join(LLAMA_MODES))
    parser.add_argument(
        "--llama-flash-attn",
        default="off",
        choices=("auto", "on", "off"),
        help="llama.cpp's -fa (edgespec turns flash attention off where no layer is on a GPU)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cases = load_prompts("quick")[: args.prompts]
    servers = [
        subprocess.Popen(
            [sys.executable, "-m", "edgespec.cli", "rpc-server", "--port", str(port), "--threads", "1"],
            stdout=subprocess.DEVNULL,
            stderr=open(args.out / f"rpc-server-{port}.log", "w"),
        )
        for port in SERVER_PORTS
    ]
    try:
        for port in SERVER_PORTS:
            wait_port(port)
        with tempfile.TemporaryDirectory() as tmp:
            jsonl = args.out / "rpc-prompts.jsonl"  # kept: the bench commands name it
            jsonl.write_text(
                "".join(
                    json.dumps(
                        {"name": c.name, "messages": [{"role": r, "content": t} for r, t in c.messages]}
                    )
                    + "\n"
                    for c in cases
                )
            )
            for delay in (int(d) for d in args.delays.split(",")):
                for round_ in range(args.rounds):
                    # fresh proxies (ports) each round: auto's profile, keyed by them, is measured in
                    # the bench's own process each time; the sides alternate (ABBA) to cancel drift
                    suffix = f"-r{round_ + 1}" if args.rounds > 1 else ""
                    sides = ["edgespec", "llama"] if round_ % 2 == 0 else ["llama", "edgespec"]
                    with ExitStack() as stack:
                        proxies = [DelayProxy(("127.0.0.1", p), delay / 1000) for p in SERVER_PORTS]
                        proxies = [stack.enter_context(proxy) for proxy in proxies]
                        ports = [proxy.port for proxy in proxies]
                        print(f"delay {delay} ms{suffix}: proxies {ports}", flush=True)
                        for side in sides:
                            if side == "edgespec":
                                bench = args.out / f"edgespec-{delay}ms{suffix}.json"
                                edgespec_side(args, ports, jsonl, bench)
                            elif not args.skip_llama:
                                summary = llama_side(
                                    args.tools / "llama-speculative-simple",
                                    [resolve_text(c) for c in cases],
                                    ports,
                                    args.tokens,
                                    Path(tmp),
                                    args.llama_flash_attn,
                                    {m: LLAMA_MODES[m] for m in args.llama_modes.split(",")},
                                )
                                path = args.out / f"llama-{delay}ms{suffix}.json"
                                path.write_text(json.dumps(summary, indent=1))
                if args.rounds > 1 and not args.skip_llama:
                    pooled_summary(args.out, delay, args.rounds)
    finally:
        for server in servers:
            server.terminate()
            server.wait(30)
    return 0


def edgespec_side(args, ports, jsonl: Path, bench: Path) -> None:
    rpc = ",".join(f"127.0.0.1:{p}" for p in ports)
    command = [sys.executable, "-m", "edgespec.cli", "bench", "--rpc", rpc, "--tensor-split", "1,1,1"]
    command += ["--threads", "1", "--prompts", str(jsonl), "--max-tokens", str(args.tokens)]
    command += ["--strategies", args.strategies, "--json", str(bench)]
    subprocess.run(command, check=True, timeout=3600)


def pooled_summary(out: Path, delay: int, rounds: int) -> None:
    """tokens/s of each side's modes pooled over the rounds (Σ tokens ÷ Σ seconds), and auto's and
    chain's ratio to llama.cpp's best mode, per round and pooled."""
    ours: dict[str, list] = {}
    theirs: dict[str, list] = {}
    for r in range(1, rounds + 1):
        bench = json.loads((out / f"edgespec-{delay}ms-r{r}.json").read_text())
        ours.setdefault("plain", []).append((bench["baseline"]["tokens"], bench["baseline"]["seconds"]))
        for result in bench["results"]:
            ours.setdefault(result["key"], []).append((result["tokens"], result["seconds"]))
        llama = json.loads((out / f"llama-{delay}ms-r{r}.json").read_text())
        for mode, summary in llama.items():
            runs = summary["runs"]
            pooled = (sum(x["tokens"] for x in runs), sum(x["seconds"] for x in runs))
            theirs.setdefault(mode, []).append(pooled)

    def rate(pairs, r=None):
        chosen = pairs if r is None else [pairs[r]]
        return sum(t for t, _ in chosen) / sum(s for _, s in chosen)

    lines = [f"delay {delay} ms, {rounds} rounds (ABBA), tokens/s per round and pooled:"]
    for side, table in (("edgespec", ours), ("llama.cpp", theirs)):
        for mode, pairs in table.items():
            per = " ".join(f"{rate(pairs, r):6.2f}" for r in range(rounds))
            lines.append(f"  {side:9s} {mode:20s} {per}   pooled {rate(pairs):6.2f}")
    modes = [m for m in theirs if m != "plain"]
    for r in [*range(rounds), None]:
        best = max(modes, key=lambda m: rate(theirs[m], r))
        label = f"round {r + 1}" if r is not None else "pooled"
        ratios = "  ".join(
            f"{k} {rate(ours[k], r) / rate(theirs[best], r):.2f}" for k in ("auto", "chain") if k in ours
        )
        lines.append(f"  {label}: llama.cpp's best {best} {rate(theirs[best], r):.2f} tok/s; ÷ it: {ratios}")
    text = "\n".join(lines)
    print(text, flush=True)
    (out / f"pooled-{delay}ms.txt").write_text(text + "\n")


def resolve_text(case) -> str:
    """The chat-templated prompt text llama.cpp reads (-f), as edgespec's target templates it."""
    from edgespec.engine import Model

    if not hasattr(resolve_text, "model"):
        resolve_text.model = Model(resolve_pair().target_path)
    model = resolve_text.model
    return model.apply_chat_template([{"role": r, "content": t} for r, t in case.messages])


if __name__ == "__main__":
    sys.exit(main())
