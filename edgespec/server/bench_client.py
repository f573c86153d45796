"""The bench prompts against any OpenAI-compatible server (edgespec serve, llama-server with `-md`, …).

Each prompt is one non-streaming request with greedy sampling; the table reports wall-clock tokens/s per
prompt and, where the server sends llama-server-style ``timings``, its decode speed and draft acceptance —
so edgespec and llama-server's own speculation are measured by the same client on the same prompts.
"""

from __future__ import annotations

import argparse
import json
import sys
from time import perf_counter

import httpx

from ..measure.prompts import load_prompts


def run_prompts(
    url: str, prompts: str, max_tokens: int, api_key: str | None, model: str | None
) -> list[dict]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    rows = []
    for case in load_prompts(prompts):
        body = {
            "messages": [{"role": role, "content": text} for role, text in case.messages],
            "max_tokens": max_tokens,
            "temperature": 0,
            **({"model": model} if model else {}),
        }
        start = perf_counter()
        response = httpx.post(url.rstrip("/") + "/chat/completions", json=body, headers=headers, timeout=600)
        wall = perf_counter() - start
        response.raise_for_status()
        reply = response.json()
        tokens = reply.get("usage", {}).get("completion_tokens", 0)
        timings = reply.get("timings", {})
        rows.append(
            {
                "prompt": case.name,
                "tokens": tokens,
                "wall_tokens_per_second": tokens / wall if wall else 0.0,
                "decode_tokens_per_second": timings.get("predicted_per_second"),
                "draft_n": timings.get("draft_n"),
                "draft_n_accepted": timings.get("draft_n_accepted"),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("url", help="the server's base URL, e.g. http://127.0.0.1:8080/v1")
    p.add_argument("--prompts", default="quick", help="built-in sets (quick, code, chat, …, all) or a .jsonl")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--api-key")
    p.add_argument("--model", help="model id to send (llama-server and edgespec accept none)")
    p.add_argument("--json", metavar="OUT", help="also write the rows as JSON")
    args = p.parse_args(argv)
    rows = run_prompts(args.url, args.prompts, args.max_tokens, args.api_key, args.model)
    print(f"{'prompt':32} {'tokens':>6} {'wall tok/s':>10} {'decode tok/s':>12} {'accepted/drafted':>17}")
    for r in rows:
        decode = f"{r['decode_tokens_per_second']:.1f}" if r["decode_tokens_per_second"] else "-"
        accepted = f"{r['draft_n_accepted']}/{r['draft_n']}" if r["draft_n"] is not None else "-"
        wall = f"{r['wall_tokens_per_second']:.1f}"
        print(f"{r['prompt']:32} {r['tokens']:>6} {wall:>10} {decode:>12} {accepted:>17}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
