"""`edgespec train parallel`: train a ParallelSpec parallel drafter for a pair (needs the train extra)."""

from __future__ import annotations

import sys
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("train", help="train drafters (needs: pip install 'edgespec[train]')")
    kinds = p.add_subparsers(dest="kind", metavar="KIND", required=True)
    q = kinds.add_parser(
        "parallel",
        help="a ParallelSpec parallel drafter: LoRA + K mask tokens on the pair's draft",
        description="Self-distillation data from the pair's target, group-wise parallel training of the "
        "draft (LoRA on its linear layers plus K [MASK] embedding rows), export as a GGUF LoRA adapter. "
        "Every stage resumes: answered prompts are skipped, --resume continues from the checkpoint.",
    )
    q.add_argument("--pair", default=None, help="registry pair (default: the default pair)")
    q.add_argument("--target", default=None, help="target name or .gguf (with --draft, instead of --pair)")
    q.add_argument("--draft", default=None, help="draft model name or .gguf")
    q.add_argument("--work", type=Path, default=None, help="work directory (default: in the edgespec home)")
    q.add_argument("--out", type=Path, default=None, help="adapter (default WORK/parallelspec-k{K}.gguf)")
    q.add_argument("--prompts", type=int, default=240, help="training prompts answered by the target")
    q.add_argument("--max-tokens", type=int, default=128, help="answer length per prompt")
    q.add_argument("--k", type=int, default=4, help="mask tokens per group (the drafter's depth - 1)")
    q.add_argument("--mask-base", type=int, default=None, help="MASK_k = base + k (default Qwen2.5's 151664)")
    q.add_argument("--rank", type=int, default=8, help="LoRA rank")
    q.add_argument("--alpha", type=float, default=16.0, help="LoRA alpha (scale alpha/rank)")
    q.add_argument("--groups", type=int, default=24, help="parallel groups per training sequence")
    q.add_argument("--decay", type=float, default=0.8, help="loss weight of MASK_k: decay**k")
    q.add_argument("--lr", type=float, default=5e-4)
    q.add_argument("--accum", type=int, default=2, help="sequences per optimiser step")
    q.add_argument("--steps", type=int, default=1000, help="optimiser steps")
    q.add_argument("--minutes", type=float, default=0.0, help="stop training after this long (0: no limit)")
    q.add_argument("--checkpoint-every", type=int, default=10, help="optimiser steps between checkpoints")
    q.add_argument("--threads", type=int, default=1, help="CPU threads for data and training")
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--resume", action="store_true", help="continue training from WORK/checkpoint.pt")
    q.add_argument("--data-only", action="store_true", help="only generate the data")
    q.add_argument("--skip-data", action="store_true", help="train on WORK/data.jsonl as it is")
    q.set_defaults(run=run_parallel)


def run_parallel(args) -> int:
    from ..train.distill import DistillSettings
    from ..train.pipeline import ParallelJob, default_train_settings, run_job

    target, draft, name = _resolve(args)
    work = args.work or _default_work(name)
    train = default_train_settings(
        k=args.k, mask_base=args.mask_base, groups=args.groups, decay=args.decay, lr=args.lr,
        accum=args.accum, steps=args.steps, max_minutes=args.minutes, checkpoint_every=args.checkpoint_every,
        seed=args.seed,
    )
    job = ParallelJob(
        target=target, draft=draft, work=work, out=args.out or work / f"parallelspec-k{args.k}.gguf",
        prompts=args.prompts, distill=DistillSettings(max_tokens=args.max_tokens, threads=args.threads),
        train=train, rank=args.rank, alpha=args.alpha, threads=args.threads, resume=args.resume,
        data_only=args.data_only, skip_data=args.skip_data,
    )
    run_job(job, say=lambda line: print(line, file=sys.stderr, flush=True))
    return 0


def _resolve(args) -> tuple[str, str, str]:
    from ..models.store import ModelStore

    store = ModelStore()
    if args.target or args.draft:
        if not (args.target and args.draft):
            from ..errors import EdgespecError

            raise EdgespecError("--target and --draft go together (or name a --pair).")
        name = f"{Path(args.target).stem}+{Path(args.draft).stem}"
        return str(store.ensure(args.target)), str(store.ensure(args.draft)), name
    target, draft, spec = store.ensure_pair(args.pair)
    return str(target), str(draft), spec.name


def _default_work(name: str) -> Path:
    from ..models.paths import home_dir

    return home_dir() / "train" / "parallelspec" / name
