"""Training MCSD's early-stop decision model on a pair's own drafts (`edgespec tune`), and measuring it.

1. **Collect.** Run the pair with MCSD, early stop off, on a prompt set. Every drafted node of every
   step is one example: the features the planner computes in ``early_stop="model"`` mode (those of
   the distribution the node was drawn from, and the node's own draft probability — ``node_features``)
   and the label "the target accepted it" (the node is on the step's accepted path).
2. **Train.** Fit the numpy ``DecisionModel`` (fixed seed) on the examples of most prompts; the
   examples of held-out prompts give accuracy, AUC and the base rate. The AUC of the draft
   probability alone — what ``early_stop="threshold"`` uses — is reported next to it.
3. **Store.** ``<home>/decision-models/<pair>.npz`` (and a ``.json`` with the metrics), where
   ``--early-stop model`` finds it when no ``--early-stop-model PATH`` is given.

``compare`` times plain decoding against MCSD variants side by side with the bench's interleaved
schedule (``edgespec.measure.runner``: every variant between two plain runs of the same prompt) and adds
what the early-stop question needs: draft decodes and verified tokens per step, target decodes per
step, and (greedy) agreement with plain decoding.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..decoding.chat import ChatSettings, Message, prompt_tokens, stream_reply
from ..decoding.events import GenerationStats, StepEvent
from ..decoding.sampling import SamplingParams
from ..errors import EdgespecError
from ..planner.base import Planner
from ..planner.earlystop import DecisionModel, accuracy, auc, feature_matrix
from ..planner.mcsd import MCSDPlanner
from ..planner.tree import ChildRule, DraftTree, TreeBuilder
from .prompts import ENGINE_PROMPTS, PromptCase, load_prompts


# -- prompts --------------------------------------------------------------------------------------
def load_cases(spec: str) -> list[PromptCase]:
    """``engine`` (the engine tests' varied prompts), a built-in set name (``code``, ``chat``, …,
    ``quick``, ``all``; comma-separated works) or a ``.jsonl`` file."""
    if spec == "engine":
        return [PromptCase(f"engine/{i + 1}", "engine", (("user", t),)) for i, t in enumerate(ENGINE_PROMPTS)]
    return load_prompts(spec)


# -- collection -------------------------------------------------------------------------------------
def node_features(tree: DraftTree, nodes: Sequence[int]) -> np.ndarray:
    """(len(nodes), F): exactly what ``MCSDPlanner.predicted_acceptance`` feeds the model in model mode —
    the features of the distribution each node was drawn from (its parent's) and its draft probability."""
    return feature_matrix(
        [tree.dists[int(tree.parents[u])] for u in nodes], [tree.draft_prob[u] for u in nodes]
    )


def reached_nodes(tree: DraftTree, accepted_path: Sequence[int]) -> list[int]:
    """The drafted nodes the verifier decided on, in index order: the children of every accepted node,
    in the order they were tried, up to the one it accepted — all of them below the last accepted node,
    where every one was rejected. The rest were never reached (their parent was rejected, or an
    earlier sibling accepted): they are not rejections, and labelling them so teaches the model to stop
    early at depth."""
    reached: list[int] = []
    for i, node in enumerate(accepted_path):
        if tree.child_rule[node] == ChildRule.LONGEST:
            continue  # mcsd-target-init's root: the target's own tokens, not draft tokens it judged
        children = tree.children(node)
        if i + 1 < len(accepted_path):
            children = children[: children.index(accepted_path[i + 1]) + 1]
        reached.extend(children)
    return sorted(reached)


def step_examples(tree: DraftTree, accepted_path: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One example per drafted node the verifier reached (``reached_nodes``): (features (n, F),
    accepted (n,) bool, depth (n,)).

    GSD's merged nodes are left out (they were not drawn from a distribution of their own).
    """
    nodes = [u for u in reached_nodes(tree, accepted_path) if not tree.merged[u]]
    on_path = set(int(u) for u in accepted_path)
    labels = np.array([u in on_path for u in nodes], dtype=bool)
    return node_features(tree, nodes), labels, tree.depth[nodes].astype(np.int32)


@dataclass
class Examples:
    """Labelled features from real runs."""

    x: np.ndarray  # (n, F) node_features
    y: np.ndarray  # (n,) bool: accepted
    prompt: np.ndarray  # (n,) index of the prompt the example came from
    depth: np.ndarray  # (n,) the node's depth in its tree
    stats: list[GenerationStats] = field(default_factory=list)  # one per prompt

    @classmethod
    def empty(cls) -> Examples:
        from ..planner.earlystop import FEATURE_NAMES

        none = np.zeros(0, dtype=np.int32)
        return cls(np.zeros((0, len(FEATURE_NAMES))), np.zeros(0, dtype=bool), none, none.copy())

    def add(self, events: Iterable[StepEvent], prompt_index: int) -> None:
        xs, ys, ds = [self.x], [self.y], [self.depth]
        for event in events:
            if event.tree is None or event.tree.size < 2:
                continue
            x, y, d = step_examples(event.tree, event.accepted_path)
            xs.append(x)
            ys.append(y)
            ds.append(d)
        n_new = sum(len(y) for y in ys[1:])
        self.x, self.y, self.depth = np.concatenate(xs), np.concatenate(ys), np.concatenate(ds)
        self.prompt = np.concatenate([self.prompt, np.full(n_new, prompt_index, dtype=np.int32)])


def run_prompt(pair, planner: Planner | None, case: PromptCase, max_tokens: int, sampling: SamplingParams):
    """One answer through the chat template; returns (events with output, their statistics)."""
    stats = GenerationStats()
    settings = ChatSettings(sampling=sampling, max_tokens=max_tokens)
    messages = [Message(role, content) for role, content in case.messages]
    events = list(stream_reply(pair, planner, messages, settings, stats=stats))
    return [e for e in events if e.verified_nodes], stats


def collect(
    pair,
    planner: MCSDPlanner,
    cases: Sequence[PromptCase],
    max_tokens: int,
    sampling: SamplingParams,
    on_prompt: Callable[[int], None] | None = None,
) -> Examples:
    """Run every prompt with ``planner`` (early stop must be off, or the data only covers what it kept)."""
    if planner.early_stop != "off":
        raise EdgespecError("collect the training data with early stop off (it would hide the deeper nodes)")
    examples = Examples.empty()
    for i, case in enumerate(cases):
        events, stats = run_prompt(pair, planner, case, max_tokens, sampling)
        examples.add(events, i)
        examples.stats.append(stats)
        if on_prompt is not None:
            on_prompt(i)
    return examples


# -- training ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TuneReport:
    split: str  # "by prompt (…)" or "random 80/20"
    n_train: int
    n_held_out: int
    base_rate: float  # share of accepted examples among the held-out ones
    accuracy: float  # held-out accuracy at 0.5
    majority_accuracy: float  # the accuracy of always answering the majority label
    auc: float  # held-out AUC of the model
    auc_draft_prob: float  # held-out AUC of the draft probability alone (threshold mode's predictor)
    held_out_prompts: tuple[int, ...] = ()  # prompt indices held out (a split by prompt)

    def as_dict(self) -> dict:
        return asdict(self)


def split(examples: Examples, held_out: float, seed: int) -> tuple[np.ndarray, np.ndarray, str, tuple]:
    """Boolean train mask, held-out mask, description, held-out prompts.

    By prompt when there are ≥ 4 prompts (examples of one answer are correlated, so a random split
    flatters the model), else a random split of the examples.
    """
    rng = np.random.default_rng(seed)
    prompts = np.unique(examples.prompt)
    if prompts.size >= 4:
        n_out = max(1, round(held_out * prompts.size))
        out = tuple(int(p) for p in np.sort(rng.choice(prompts, n_out, replace=False)))
        test = np.isin(examples.prompt, out)
        test_mask_ok = test.any() and (~test).any() and np.unique(examples.y[test]).size == 2
        if test_mask_ok:
            return ~test, test, f"by prompt ({len(out)} of {prompts.size} held out)", out
    test = rng.random(examples.y.shape[0]) < held_out
    return ~test, test, f"random {round(100 * (1 - held_out))}/{round(100 * held_out)}", ()


def train(
    examples: Examples, held_out: float = 0.2, seed: int = 0, hidden: int = 16, epochs: int = 400
) -> tuple[DecisionModel, TuneReport]:
    """Fit on the training part, evaluate on the held-out part; the returned model is the one evaluated."""
    y = examples.y
    if y.size < 10 or y.all() or not y.any():
        raise EdgespecError(
            f"too little training data ({y.size} examples, {int(y.sum())} accepted): "
            "use more prompts or --max-tokens"
        )
    train_mask, test_mask, how, out = split(examples, held_out, seed)
    model = DecisionModel.fit(examples.x[train_mask], y[train_mask], hidden=hidden, epochs=epochs, seed=seed)
    y_test = y[test_mask]
    scores = model.predict_proba(examples.x[test_mask])
    draft_prob = examples.x[test_mask, -1]  # the chosen token's probability: the last feature
    both = np.unique(y_test).size == 2
    base = float(y_test.mean()) if y_test.size else float("nan")
    report = TuneReport(
        split=how,
        n_train=int(train_mask.sum()),
        n_held_out=int(test_mask.sum()),
        base_rate=base,
        accuracy=accuracy(y_test, scores) if y_test.size else float("nan"),
        majority_accuracy=max(base, 1 - base) if y_test.size else float("nan"),
        auc=auc(y_test, scores) if both else float("nan"),
        auc_draft_prob=auc(y_test, draft_prob) if both else float("nan"),
        held_out_prompts=out,
    )
    return model, report


def save(
    model: DecisionModel,
    report: TuneReport,
    path: Path,
    meta: dict | None = None,
    cases: Sequence[PromptCase] = (),
) -> Path:
    """Write the model (``.npz``) and its metrics (the same name, ``.json``), with the names of the
    held-out prompts among ``cases`` (the training prompts)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(path)
    names = [cases[i].name for i in report.held_out_prompts] if cases else []
    info = {**(meta or {}), "held_out": report.as_dict(), "held_out_names": names}
    path.with_suffix(".json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return path


def held_out_cases(path: Path, cases: Sequence[PromptCase]) -> list[PromptCase]:
    """The prompts of ``cases`` the model at ``path`` was not trained on (all of them when its
    metrics do not name any: a random split, or no record)."""
    try:
        names = set(json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))["held_out_names"])
    except (OSError, ValueError, KeyError):
        names = set()
    return [c for c in cases if c.name in names] or list(cases)


# -- side-by-side comparison ------------------------------------------------------------------------
def compare(
    pair,
    variants: dict[str, Planner],
    cases: Sequence[PromptCase],
    max_tokens: int,
    sampling: SamplingParams,
    progress: Callable[[str, int, int], None] | None = None,
) -> list[dict]:
    """Plain decoding and each variant on the same prompts with the bench's schedule (P V1 P V2 … P per
    prompt: every variant between two plain runs) and its summary; one row per variant, plain first.

    Rows add the target decodes per step (2 for mcsd-target-init, whose root is decoded alone first),
    for greedy runs the agreement with plain decoding: the share of the adjacent plain run's tokens
    reproduced before the first divergence, averaged over prompts; and a quality measure for lossy
    variants: the target's mean log-probability per token of what the variant produced, and its
    difference from the adjacent plain run's (negative: the target finds the text less likely).
    """
    from .runner import PLAIN, BenchConfig, Variant, run_bench, summarise

    config = BenchConfig(max_tokens=max_tokens, sampling=sampling, warmup_tokens=4)
    entries = [Variant(key, planner.name, None, planner) for key, planner in variants.items()]
    result = run_bench(pair, cases, entries, config, progress)
    summary = summarise(result)
    base = summary["baseline"]
    loglik = {}  # (prompt index, run index) → the target's mean log p per token of that run's text
    for i, prompt in enumerate(result.prompts):
        messages = [Message(role, content) for role, content in prompt.case.messages]
        tokens = prompt_tokens(pair, messages, ChatSettings(max_tokens=max_tokens))[0]  # as the bench
        for j, run in enumerate(prompt.runs):
            loglik[i, j] = target_log_likelihood(pair, tokens, run.tokens)
    plain_loglik = [v for (i, j), v in loglik.items() if result.prompts[i].runs[j].variant == PLAIN]
    rows = [_row("plain", base, 1, 1.0, 1.0, 1.0, _mean(plain_loglik), 0.0)]
    for entry in summary["results"]:
        planner = variants[entry["key"]]
        agree, own, versus = [], [], []
        for i, prompt in enumerate(result.prompts):  # each variant run comes right after a plain run
            for j, (before, run) in enumerate(zip(prompt.runs, prompt.runs[1:])):
                if run.variant == entry["key"] and before.variant == PLAIN:
                    own.append(loglik[i, j + 1])
                    versus.append(loglik[i, j + 1] - loglik[i, j])
                    if sampling.greedy:
                        agree.append(agreement(run.tokens, before.tokens))
        decodes = 2 if planner.needs_target_root else 1
        label = f"{planner.name} {planner.describe()}" + (" (lossy)" if planner.lossy else "")
        row = _row(
            label,
            entry,
            decodes,
            entry["speedup"],
            entry["pooled_speedup"],
            _mean(agree),
            _mean(own),
            _mean(versus),
        )
        spread = entry["speedup_spread"]
        row["speedup_range"] = (spread["min"], spread["max"])  # over the paired runs
        rows.append(row)
    return rows


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if not np.isnan(v)]
    return float(np.mean(finite)) if finite else float("nan")


def target_log_likelihood(pair, prompt: Sequence[int], tokens: Sequence[int]) -> float:
    """The target's mean log-probability per token of ``tokens`` after ``prompt`` (softmax at T = 1):
    one verify of the chain prompt[-1], tokens[:-1], whose row i predicts tokens[i]. The verified
    cells are speculative; the next ``sync`` drops them."""
    if not tokens:
        return float("nan")
    target = pair.target
    target.sync(list(prompt[:-1]))
    chain = TreeBuilder(prompt[-1])
    node = 0
    for token in tokens[:-1]:
        node = chain.add(node, token, 1.0)
    softmax = SamplingParams(temperature=1.0)
    target.use_sampling(softmax)  # whole rows: backend reductions keep only a top-k
    out = target.start_verify(chain.freeze()).result()
    # log p(tokens[i] | the chain before it): the softmax at node i
    chosen = [np.log(out.probs(i, softmax)[token]) for i, token in enumerate(tokens)]
    target.sync(list(prompt[:-1]))
    return float(np.mean(chosen))


def _row(
    label: str,
    totals: dict,
    target_decodes: int,
    speedup,
    pooled,
    agree: float,
    loglik: float,
    vs_plain: float,
) -> dict:
    return {
        "variant": label,
        "tokens": totals["tokens"],
        "mal": totals["mal"],  # tokens per verify step
        "target_decodes_per_step": target_decodes,
        "draft_decodes_per_step": totals["draft_decodes_per_step"],
        "verified_per_step": totals["verified_per_step"],
        "acceptance_rate": totals["acceptance_rate"],
        "tokens_per_second": totals["tokens_per_second"],
        "speedup": float("nan") if speedup is None else speedup,  # median paired ratio vs plain
        "pooled_speedup": float("nan") if pooled is None else pooled,
        "agreement": agree,
        "target_loglik": loglik,  # the target's mean log p per produced token (T = 1)
        "loglik_vs_plain": vs_plain,  # minus the adjacent plain run's, averaged over runs
    }


def agreement(tokens: Sequence[int], reference: Sequence[int]) -> float:
    """Share of ``reference`` reproduced before the first divergence."""
    if not reference:
        return 1.0
    same = 0
    for a, b in zip(tokens, reference):
        if a != b:
            break
        same += 1
    return same / len(reference)


def format_table(rows: Sequence[dict]) -> str:
    """A Markdown table of ``compare`` rows."""
    lines = [
        "| variant | MAL | target decodes/step | draft decodes/step | verified/step | tok/s "
        "| × plain (median paired) | × plain (pooled) | agreement | target log p/token (vs plain) |",
        "|" + "---|" * 10,
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['mal']:.2f} | {r['target_decodes_per_step']} | "
            f"{r['draft_decodes_per_step']:.2f} | {r['verified_per_step']:.1f} | "
            f"{r['tokens_per_second']:.2f} | {r['speedup']:.2f} | {r['pooled_speedup']:.2f} | "
            f"{r['agreement']:.2f} | {r['target_loglik']:.3f} ({r['loglik_vs_plain']:+.3f}) |"
        )
    return "\n".join(lines)
