"""Self-distillation data: the pair's target answers the training prompts; the token ids are the data.

ParallelSpec trains the drafter on the target's own outputs (the paper's best setting, §5): the
drafter learns to predict what the target will say, which is what speculation is scored on. One JSON
line per prompt, ``{"index", "prompt", "prompt_ids", "answer_ids", "finish"}``; ``prompt_ids`` is the
templated prompt exactly as the target saw it, ``answer_ids`` the target's greedy answer (plus the
end-of-turn token when it stopped by itself). A rerun skips the prompt indices already in the file.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

from .progress import progress


@dataclass(frozen=True)
class DistillSettings:
    max_tokens: int = 128  # answer budget per prompt
    threads: int = 1  # llama.cpp threads: leave the other cores to the rest of the machine
    n_ctx: int = 1024
    temperature: float = 0.0  # 0 → greedy (the target's argmax path)


def done_indices(path: Path) -> set[int]:
    """Prompt indices already answered in ``path`` (a torn last line from an interruption is ignored)."""
    done: set[int] = set()
    if not path.is_file():
        return done
    for line in path.read_text().splitlines():
        try:
            done.add(int(json.loads(line)["index"]))
        except (ValueError, KeyError, TypeError):
            continue
    return done


def read_records(path: Path) -> list[dict]:
    """Every complete record of a data file."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def _end_of_turn(model) -> list[int]:
    """The chat template's end-of-turn token when it is one EOG token (Qwen: <|im_end|>), else []."""
    for text in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
        ids = model.tokenize(text, add_special=False, parse_special=True)
        if len(ids) == 1 and model.is_eog(ids[0]):
            return ids
    return []


def generate_data(
    target_path: str, prompts: Sequence[str], out: Path, settings: DistillSettings = DistillSettings()
) -> dict:
    """Answer every prompt not yet in ``out``; returns counts (prompts, answer tokens, seconds)."""
    from ..decoding.chat import ChatSettings, Message, prompt_tokens, stream_reply
    from ..decoding.sampling import SamplingParams
    from ..engine.pair import EngineSettings, ModelPair

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = done_indices(out)
    todo = [i for i in range(len(prompts)) if i not in done]
    chat = ChatSettings(sampling=SamplingParams(temperature=settings.temperature, seed=0),
                        max_tokens=settings.max_tokens)
    engine = EngineSettings(n_ctx=settings.n_ctx, threads=settings.threads, max_tree_nodes=1)
    start, produced = perf_counter(), 0
    with ModelPair(target_path, None, engine) as pair, out.open("a") as sink, \
            progress("distil", len(prompts), len(done)) as update:
        eot = _end_of_turn(pair.target.model)
        for n, index in enumerate(todo):
            messages = [Message("user", prompts[index])]
            ids, _ = prompt_tokens(pair, messages, chat)
            answer, finish = [], None
            for event in stream_reply(pair, None, messages, chat):
                answer.extend(event.token_ids)
                finish = event.finish_reason or finish
            if finish == "stop":
                answer.extend(eot)
            record = {"index": index, "prompt": prompts[index], "prompt_ids": ids, "answer_ids": answer,
                      "finish": finish}
            sink.write(json.dumps(record) + "\n")
            sink.flush()
            produced += len(answer)
            rate = produced / max(perf_counter() - start, 1e-9)
            update(len(done) + n + 1, f"{produced} tokens, {rate:.1f} tok/s")
    return {"prompts": len(prompts), "new": len(todo), "answer_tokens": produced,
            "seconds": round(perf_counter() - start, 1)}
