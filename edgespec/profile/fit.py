"""The pair's fit: how well the draft predicts the target, measured once per pair and cached.

``auto`` forecasts a draft tree's yield from the draft's confidence (its top-j probabilities) and r,
accepted ÷ predicted. Before it has drafted it can only assume a typical draft (top-1 0.6, r = 1), and
on a flat cost curve — the target behind a slow link — that forecast says "plain" for a draft whose
real top-1 is 0.8; short answers never earn a probe that would teach it otherwise. So the fit is
measured instead, on the target's own greedy answers to a few built-in requests (``FIT_REQUESTS``,
``FIT_TOKENS`` tokens each) — what greedy speculation verifies:

1. the target answers greedily: its token x_i at each position is its argmax there;
2. the draft reads the same prompt and answer as one chain, each level one decode (``Draft.expand``:
   the distributions its trees are grown from), giving its top-k distribution q_i at each position;
3. profile = mean over i of q_i's top-j probabilities; r = Σ [argmax q_i = x_i] ÷ Σ max q_i — a
   one-token draft at position i is accepted exactly when its top-1 is the target's token;
4. runs[n − 1] = share of positions i from which argmax q = x holds n times in a row (i … i + n − 1):
   how often a greedy chain of n − 1 is accepted whole and the draft guesses the token after it too
   (what the draft's look-ahead over RPC needs: ``auto.calibration``).

It depends on the two model files only (not the threads, the offload or the link), so it is cached
beside the cost profiles, keyed by them: ``<data home>/profiles/fit-<key>.json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ..decoding.chat import ChatSettings, Message, prompt_tokens
from ..decoding.decoder import Request, generate
from ..errors import EngineError
from ..planner.auto.tuning import PROFILE_LEN
from ..planner.costmodel import DraftFit
from ..planner.tree import TreeBuilder
from .store import file_key, llama_version, profile_path, write_json

FIT_VERSION = 3  # 2: runs; 3: six kinds of request
RUN_LEN = 8  # longest run of right guesses counted
FIT_TOKENS = 32  # target tokens per request
# One request per kind of work the bench's prompt sets cover (code, chat, maths, summaries, translation,
# edits), none of them a bench prompt: how often the draft is right differs by kind far more than
# within one. On the bundled pair a chain of 4 commits, per step, 2.58 (chat) to 4.53 (maths, edits)
# tokens by request; the first two alone (FIT_VERSION 2's) forecast 2.97, where `bench --quick`
# committed 3.46 and these six forecast 3.69 (2-core Xeon, lab/runs/xeon-advise-check-*.json).
FIT_REQUESTS = (
    "Write a Python function that merges overlapping intervals, with a docstring.",
    "Explain in a few sentences why the sky is blue.",
    "A train leaves at 14:20 and travels 180 km at 80 km/h. When does it arrive? Show the steps.",
    "Summarise in two sentences: The city council voted to close the old harbour bridge to cars from "
    "next spring. Cyclists and pedestrians may still cross, and a ferry will run every twenty minutes "
    "until the new bridge opens in three years. Shop owners near the harbour fear losing customers.",
    "Translate into French: 'The meeting has moved to Thursday at ten. Please bring the quarterly "
    "figures and tell me if you cannot attend.'",
    "Rename the variable `lst` to `numbers` in this function and change nothing else:\n\n```python\n"
    "def total(lst):\n    s = 0\n    for x in lst:\n        s += x\n    return s\n```",
)
Progress = Callable[[str, int, int], None]


def fit_key(pair) -> dict:
    return {
        "version": FIT_VERSION,
        "target": file_key(pair.target),
        "draft": file_key(pair.draft),
        "llama_cpp_python": llama_version(),
        "requests": list(FIT_REQUESTS),
        "tokens": FIT_TOKENS,
    }


def fit_path(key: dict, home: Path | None = None) -> Path:
    return profile_path(key, home, kind="fit")


def load_fit(pair, home: Path | None = None) -> DraftFit | None:
    """The pair's cached fit (None: not measured yet)."""
    try:
        data = json.loads(fit_path(fit_key(pair), home).read_text())
        profile = np.asarray(data["profile"], dtype=np.float64)
        return DraftFit(profile, float(data["ratio"]), int(data["tokens"]), tuple(map(float, data["runs"])))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def measure_and_save_fit(pair, progress: Progress | None = None, home: Path | None = None) -> DraftFit | None:
    """Measure the pair's fit and cache it; None when the target ends every request at once (nothing to
    measure the draft on: auto keeps its prior, and the next start tries again)."""
    fit = measure_fit(pair, progress=progress)
    if fit is not None:
        save_fit(pair, fit, home)
    return fit


def save_fit(pair, fit: DraftFit, home: Path | None = None) -> Path:
    key = fit_key(pair)
    record = {"key": key, "profile": fit.profile.tolist(), "ratio": fit.ratio, "tokens": fit.tokens}
    record["runs"] = list(fit.runs)
    return write_json(fit_path(key, home), record)


def measure_fit(
    pair, requests: Sequence[str] = FIT_REQUESTS, progress: Progress | None = None
) -> DraftFit | None:
    """Steps 1–3 of the module's docstring over ``requests`` (None: the target answered none of them);
    leaves both caches to be synced again."""
    measurement = FitMeasurement(pair, requests)
    measurement.run(progress=progress)
    return measurement.result()


def _never() -> bool:
    return False


class FitMeasurement:
    """The fit measured in pieces: each request's target answer, then the draft's chain over it, token
    by token, with ``stop()`` asked before each token. A stopped request starts again the next time
    ``run`` is called (32 tokens: a few seconds); the requests done are kept, in memory."""

    def __init__(self, pair, requests: Sequence[str] = FIT_REQUESTS):
        self.pair, self.requests = pair, tuple(requests)
        self.rows: list[tuple[list[np.ndarray], list[float]]] = []  # per request done: (tops, agree)

    @property
    def total(self) -> int:
        return len(self.requests) * FIT_TOKENS * 2

    @property
    def done(self) -> int:
        return len(self.rows) * FIT_TOKENS * 2

    @property
    def complete(self) -> bool:
        return len(self.rows) == len(self.requests)

    def run(self, stop: Callable[[], bool] = _never, progress: Progress | None = None) -> bool:
        """Measure requests until all are done (True) or ``stop()`` (False)."""
        while not self.complete:
            r = len(self.rows)

            def tick(what: str, i: int, r: int = r) -> bool:
                if progress is not None:
                    progress(f"draft fit: {what}", r * FIT_TOKENS * 2 + i, self.total)
                return stop()

            prompt = _prompt(self.pair, self.requests[r])
            answer = _greedy_answer(self.pair, prompt, lambda i: tick("target", i))
            if answer is None:
                return False
            tops, agree = [], []
            chain = _draft_chain(self.pair.draft, prompt, answer, lambda i: tick("draft", i))
            for dist, token in zip(chain, answer):
                row = np.zeros(PROFILE_LEN)
                k = min(PROFILE_LEN, dist.probs.shape[0])
                row[:k] = dist.probs[:k]
                tops.append(row)
                agree.append(float(dist.ids[0] == token))
            if len(agree) < len(answer):  # stopped on the way
                return False
            self.rows.append((tops, agree))
        return True

    def result(self) -> DraftFit | None:
        """The fit of the requests measured (None: the target answered none of them)."""
        tops = [row for rows, _ in self.rows for row in rows]
        if not tops:
            return None
        agree = [a for _, answer in self.rows for a in answer]
        rights = [np.asarray(answer, dtype=bool) for _, answer in self.rows]
        profile = np.mean(tops, axis=0)
        ratio = float(np.sum(agree) / max(np.sum(np.asarray(tops)[:, 0]), 1e-9))
        return DraftFit(profile, ratio, len(tops), _runs(rights))


def _runs(rights: Sequence[np.ndarray]) -> tuple[float, ...]:
    """Step 4: for n = 1 … RUN_LEN, of the positions with n answer tokens from there, the share where
    the draft was right at all n."""
    hits, seen = np.zeros(RUN_LEN), np.zeros(RUN_LEN)
    for right in rights:
        for n in range(1, min(RUN_LEN, right.shape[0]) + 1):
            windows = np.lib.stride_tricks.sliding_window_view(right, n).all(axis=1)
            hits[n - 1] += windows.sum()
            seen[n - 1] += windows.shape[0]
    return tuple(float(h / s) if s else 0.0 for h, s in zip(hits, seen))


def _prompt(pair, request: str) -> list[int]:
    """The request in the target's chat template; as plain text for a model without one."""
    try:
        tokens, _ = prompt_tokens(pair, [Message("user", request)], ChatSettings(max_tokens=FIT_TOKENS))
    except EngineError:  # no chat template (a base model, run with --raw)
        tokens = pair.target.model.tokenize(request)
    return tokens


def _greedy_answer(pair, prompt: Sequence[int], tick: Callable[[int], bool]) -> list[int] | None:
    """x_1 … x_n: the target's greedy answer (plain decoding), FIT_TOKENS at most; None when ``tick``
    (asked after each token) says stop."""
    answer: list[int] = []
    for event in generate(pair, None, Request(prompt=list(prompt), max_tokens=FIT_TOKENS)):
        answer.extend(event.token_ids)
        if tick(len(answer)):
            return None
    return answer


def _draft_chain(draft, prompt: Sequence[int], answer: Sequence[int], tick: Callable[[int], bool]):
    """q_1 … q_n: the draft's distribution before each answer token, the answer read as one chain; it
    ends early when ``tick`` (asked after each level) says stop. Leaves no speculative bookkeeping."""
    draft.sync(prompt)  # holds the prompt but its last token: the chain's root
    draft.begin_step(1.0)
    tree, node = TreeBuilder(int(prompt[-1])), 0
    try:
        for i, token in enumerate(answer):
            (dist,) = draft.expand(tree, [node])
            yield dist
            node = tree.add(node, int(token), dist.prob_of(int(token)))
            if tick(FIT_TOKENS + i + 1):
                return
    finally:
        draft.begin_step(1.0)
