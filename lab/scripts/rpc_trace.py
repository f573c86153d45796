#!/usr/bin/env python3
"""Per-step trace of ``edgespec bench`` with the target over two local rpc-servers behind delaying
proxies, as ``rpc_table.py`` sets them up, but on fixed ports: ``auto``'s cost profile (keyed by the
servers' addresses) is measured by the first run and reused by the next ones.

    python lab/scripts/rpc_trace.py DELAY_MS PROMPTS.jsonl [bench flags …] > trace.txt

Each step: n tokens verified, acc drafts accepted, tok committed, dd draft decodes, ver/dr ms verifying/
drafting, provenance (d draft, t target, c copy), and for ``auto`` its mode, why, a and b (the draft's
acceptance curve, ``auto/acceptance.py``), bf/df (batch and draft factors), the step's tree size and the
draft's top-1 probability at its root (when the tree holds the root's distribution).

``TREE_DUMP=1``: every node of each tree over 16 nodes (depth, parent, q, Π q).
``GROWTH_LOG=1``: each level ``auto``'s growth chose (its nodes, how many the look-ahead had decoded,
the drafting seconds charged so far), and the size it kept.
``NO_LOOK_AHEAD=1``: ``auto`` never lets the draft look ahead during a verify (to see
what the look-ahead's decodes cost the verifies they overlap on this machine's cores).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from edgespec import cli
from edgespec.measure import runner
from edgespec.planner.auto import AutoPlanner
from edgespec.planner.auto.trees import AutoGrowth

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from netdelay import DelayProxy  # noqa: E402  (scripts/netdelay.py: a dev tool, not in the package)

SERVERS = (50162, 50163)
PROXIES = (50172, 50173)  # + 2 × the delay in ms: a profile per delay (it is keyed by the addresses)


def spy(generate):
    def traced(pair, planner, request, cancel=None):
        name = type(planner).__name__ if planner is not None else "plain"
        print(f"--- {name}", flush=True)
        for event in generate(pair, planner, request, cancel):
            if event.verified_nodes:
                provenance = "".join(t.provenance.value[0] for t in event.tokens)
                line = (
                    f"n={event.verified_nodes:2d} acc={event.accepted:2d} tok={len(event.tokens):2d} "
                    f"dd={event.draft_decodes} ver={event.timings.verify * 1000:5.0f} "
                    f"dr={event.timings.draft * 1000:4.0f} {provenance:8s}"
                )
                if name == "AutoPlanner":
                    cal = planner.calibration
                    root = event.tree.dists.get(0) if event.tree is not None else None
                    top = f"{root.probs[0]:.2f}" if root is not None and root.probs.shape[0] else "-"
                    line += (
                        f" mode={planner.mode} why={planner.policy.why!r} "
                        f"a={planner.acceptance.a:.2f} b={planner.acceptance.b:.2f} "
                        f"bf={cal.batch_factor:.2f} df={cal.draft_factor:.2f} size={planner.size} "
                        f"root_top1={top}"
                    )
                print(line, flush=True)
                tree = event.tree
                if os.environ.get("TREE_DUMP") and tree is not None and tree.size > 16:
                    for node in range(1, tree.size):  # depth, parent, q, Π q, copied: the big trees
                        print(
                            f"    node {node:2d} depth {tree.depths[node]:2d} "
                            f"parent {tree.parent_ids[node]:2d} "
                            f"q {tree.draft_probs[node]:.3f} path {tree.path_probs[node]:.3f}"
                            f"{' copied' if tree.copied_flags[node] else ''}",
                            flush=True,
                        )
            yield event

    return traced


def candidates_pool(policy, growth):
    """The growth's candidates' p̂, best first, and the expanded nodes' Σ p̂ and count, as ``AutoGrowth``
    weighs them (from its public ``phat`` and the growth's ``candidates`` and ``expanded``)."""
    pool = [policy.phat[u] for u in growth.candidates(policy.phat)]
    forced = [u for u in growth.expanded if u != 0]
    return pool, float(sum(policy.phat[u] for u in forced)), len(forced)


def log_growth() -> None:
    next_level, keep = AutoGrowth.next_level, AutoGrowth.keep

    def logged_level(self, growth):
        chosen = next_level(self, growth)
        known = sum(bool(self.known(growth.tree.path_tokens(u))) for u in chosen)
        print(f"    level {len(growth.levels)}: {len(chosen)} nodes, {known} looked ahead, spent "
              f"{self.spent * 1000:.0f} ms", flush=True)
        return chosen

    def logged_keep(self, growth):
        kept = keep(self, growth)
        pool, forced_e, forced_n = candidates_pool(self, growth)
        c_t = " ".join(f"{self.costs.t(n) * 1000:.0f}" for n in range(forced_n + 1, forced_n + 4))
        print(f"    kept {len(kept)}: {forced_n} expanded (E {forced_e:.2f}), best candidates' p̂ "
              f"{' '.join(f'{x:.2f}' for x in pool[:3])}, c_t({forced_n + 1}…) {c_t} ms", flush=True)
        return kept

    AutoGrowth.next_level, AutoGrowth.keep = logged_level, logged_keep


def main() -> int:
    delay, prompts, flags = float(sys.argv[1]) / 1000, sys.argv[2], sys.argv[3:]
    command = [sys.executable, "-m", "edgespec.cli", "rpc-server", "--threads", "1", "--port"]
    servers = [
        subprocess.Popen([*command, str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for port in SERVERS
    ]
    try:
        time.sleep(5)
        with ExitStack() as stack:
            proxies = [port + 2 * round(delay * 1000) for port in PROXIES]
            for server, proxy in zip(SERVERS, proxies):
                stack.enter_context(DelayProxy(("127.0.0.1", server), delay, ("127.0.0.1", proxy)))
            runner.generate = spy(runner.generate)
            if os.environ.get("GROWTH_LOG"):
                log_growth()
            if os.environ.get("NO_LOOK_AHEAD"):
                AutoPlanner.may_look_ahead = property(lambda self: False)
            rpc = ",".join(f"127.0.0.1:{p}" for p in proxies)
            argv = ["bench", "--rpc", rpc, "--tensor-split", "1,1,1", "--threads", "1", "--prompts", prompts]
            return cli.main(argv + flags)
    finally:
        for server in servers:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    sys.exit(main())
