"""`edgespec generate PROMPT`: one answer, streamed to stdout, or one JSON object with --json."""

from __future__ import annotations

import json
import sys
from time import perf_counter

from .. import options
from ..decoding import checks
from ..decoding.chat import ChatSettings, Message, prompt_tokens, stream_reply
from ..decoding.events import GenerationStats
from ..engine.limits import check_engine
from ..errors import EdgespecError
from ..profile.attach import attach
from ..strategy import make_planner, needs_draft

STDIN_MAX_BYTES = 64 * 2**20  # --ctx's most tokens (2**24) at ~4 bytes a token


def register(sub) -> None:
    p = sub.add_parser(
        "generate",
        help="answer one prompt (streams text, or --json for tokens and statistics)",
        description="Answer one prompt with speculative decoding. The prompt is sent as a user message "
        "through the model's chat template unless --raw is given.",
    )
    p.add_argument("prompt", help="the prompt text ('-' reads standard input)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--system", default="", help="system prompt")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object with text, tokens and stats")
    p.add_argument("--steps", action="store_true", help="with --json: include per-step statistics")
    options.add_run_args(p)
    p.set_defaults(run=run)


def read_prompt(given: str) -> str:
    """The prompt argument, or standard input for '-' (UTF-8; anything else is refused, not mangled)."""
    if given != "-":
        return given
    stdin = getattr(sys.stdin, "buffer", None)
    if stdin is None:  # `edgespec generate - <&-`: no standard input at all
        raise EdgespecError(
            "the prompt is '-' but standard input is closed; pipe the prompt in, or give it as an argument."
        )
    try:
        data = stdin.read(STDIN_MAX_BYTES + 1)
    except OSError as exc:  # e.g. `< /some/directory`
        raise EdgespecError(
            f"standard input cannot be read ({exc.strerror or exc}); pipe the prompt in from a file."
        ) from None
    if len(data) > STDIN_MAX_BYTES:
        raise EdgespecError(
            f"standard input is longer than {STDIN_MAX_BYTES // 2**20} MiB, more than any context window "
            "holds; send a shorter prompt."
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EdgespecError(
            f"standard input is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            "convert it first, e.g. with iconv -t utf-8."
        ) from None


def run(args) -> int:
    checks.check_max_tokens(args.max_tokens)
    settings = ChatSettings(
        sampling=options.sampling_params(args),
        max_tokens=args.max_tokens,
        system_prompt=args.system,
        stop=tuple(args.stop),
    )
    prompt = read_prompt(args.prompt)
    checks.check_text(prompt, "the prompt")
    checks.check_text(args.system, "--system")
    checks.check_stops(args.stop, "--stop")
    check_engine(options.engine_settings(args))  # --ctx, --max-tree-nodes …: before anything loads
    resolved, pair = options.load(args, need_draft=needs_draft(args.strategy))
    with pair:
        prompt_tokens(pair, [Message("user", prompt)], settings)  # too long? say so before profiling costs
        choice = options.strategy_choice(args)
        planner = make_planner(choice, resolved.defaults)
        attach(planner, pair, show_progress=True)  # what it asks for: auto's costs and fit, OPT-Tree's μ
        stats = GenerationStats()
        text, tokens, margins, steps = [], [], [], []
        finish = None
        start = perf_counter()
        for event in stream_reply(pair, planner, [Message("user", prompt)], settings, stats=stats):
            text.append(event.text)
            tokens.extend(event.token_ids)
            margins.extend(round(t.margin, 4) for t in event.tokens)
            finish = event.finish_reason or finish
            if args.steps and event.verified_nodes:
                steps.append(_step_record(event))
            if not args.json:
                print(event.text, end="", flush=True)
        wall = perf_counter() - start
    if args.json:
        out = {
            "text": "".join(text),
            "tokens": tokens,
            "finish_reason": finish,
            "pair": resolved.name,
            "strategy": args.strategy if planner is None else planner.name,
            "strategy_params": "" if planner is None else planner.describe(),
            "reductions": pair.reductions,
            "runs_on": pair.runs_on_json(),  # device and layers on it, per model
            "stats": {**stats.as_dict(), "wall_seconds": wall},
            "margins": margins,
        }
        if args.steps:
            out["steps"] = steps
        print(json.dumps(out, ensure_ascii=False))
    else:
        print()
        print(
            f"[{stats.tokens} tokens, {stats.tokens_per_second:.1f} tok/s, "
            f"MAL {stats.mean_accepted_length:.2f}, acceptance {stats.acceptance_rate:.0%}]",
            file=sys.stderr,
        )
    return 0


def _step_record(event) -> dict:
    return {
        "tokens": len(event.tokens),
        "accepted": event.accepted,
        "drafted": event.drafted,
        "verified_nodes": event.verified_nodes,
        "depth": event.depth,
        "leaves": event.leaves,
        "draft_decodes": event.draft_decodes,
        "python_ms": round(event.timings.python * 1000, 3),  # step wall time outside llama_decode
        "expected_accept": round(event.expected_accept, 4),
        "merges": event.merges,
        "graph_success": event.graph_success,
        "provenance": [t.provenance.value for t in event.tokens],
    }
