"""How well the copies' estimates predict what the target accepts (greedy; counts only, so load does
not change them), per prompt set:

- by agreement a (the tokens the context shares with the copied text): how often a *tested* copy
  (its parent accepted) was accepted, next to the prior r₀(a) of ``planner/ngram.py``;
- by predicted E[A] = Σ p̂ of a step's copies: the accepted tokens per step against the prediction.

    python lab/scripts/copy_calibration.py edit,prose,quick 128 ngram docs/copy-calibration-cpu.json
"""

import collections
import json
import sys

import numpy as np

from edgespec.decoding.chat import ChatSettings, Message, stream_reply
from edgespec.engine.pair import EngineSettings
from edgespec.measure.prompts import load_prompts
from edgespec.models.pairs import open_pair, resolve_pair
from edgespec.planner import ngram
from edgespec.profile.attach import attach
from edgespec.strategy import StrategyChoice, make_planner

E_BINS = (0.0, 1.0, 2.0, 4.0, 8.0, 1e9)  # E[A] bins: [0, 1), [1, 2), [2, 4), [4, 8), [8, …)
AGREE_BINS = ((1, 3), (4, 5), (6, 8), (9, 12), (13, 23))  # agreement ranges, inclusive
tested: collections.Counter = collections.Counter()  # (agreement, accepted) → copies, current set

# What the copier notes about its last tree, kept here through its public methods: per copier, the
# tree it proposed last and each copied node's agreement (as ``Copier.note`` bins it).
notes: dict[int, dict[int, int]] = {}
trees: dict[int, object] = {}
propose, note = ngram.Copier.propose, ngram.Copier.note
remember, learn = ngram.Copier.remember, ngram.Copier.observe


def proposing(copier, *args, **kwargs):
    notes[id(copier)], trees[id(copier)] = {}, None
    return propose(copier, *args, **kwargs)


def noting(copier, tree_node, trie, node):
    notes.setdefault(id(copier), {})[tree_node] = min(int(trie.agree[node]), ngram.AGREE_BINS - 1)
    note(copier, tree_node, trie, node)


def remembering(copier, tree):
    trees[id(copier)] = tree
    return remember(copier, tree)


def observe(copier, tree, path):
    """Count the copies the target tested (their parent accepted) before the copier learns from them."""
    meta = notes.get(id(copier), {})
    if tree is not None and tree is trees.get(id(copier)) and meta:
        on_path = set(int(n) for n in path)
        counted = [(a, node in on_path) for node, a in meta.items() if int(tree.parents[node]) in on_path]
        for key in counted:
            tested[key] += 1
        if counted:  # the copier forgets a tree once it has learnt from it
            notes[id(copier)] = {}
    learn(copier, tree, path)


ngram.Copier.propose, ngram.Copier.note = proposing, noting
ngram.Copier.remember, ngram.Copier.observe = remembering, observe
sets, names = sys.argv[1].split(","), sys.argv[3].split(",")
max_tokens, out_path = int(sys.argv[2]), sys.argv[4]
prior = ngram.prior_rate(np.arange(ngram.AGREE_BINS))
resolved = resolve_pair()
report = {"max_tokens": max_tokens, "runs": {}}
with open_pair(resolved, EngineSettings(threads=2)) as pair:
    for name in names:
        for prompt_set in sets:
            tested.clear()
            by_e = collections.defaultdict(lambda: np.zeros(4))  # steps, predicted, accepted, verified
            for case in load_prompts(prompt_set):
                planner = attach(make_planner(StrategyChoice(name, {}), resolved.defaults), pair)
                messages = [Message(role, text) for role, text in case.messages]
                for event in stream_reply(pair, planner, messages, ChatSettings(max_tokens=max_tokens)):
                    if event.drafted and event.tree is not None and event.tree.copied.any():
                        b = next(i for i in range(len(E_BINS) - 1) if event.expected_accept < E_BINS[i + 1])
                        by_e[b] += (1, event.expected_accept, event.accepted, event.verified_nodes)
            agreement = {}
            for lo, hi in AGREE_BINS:
                yes = sum(tested[a, True] for a in range(lo, hi + 1))
                n = yes + sum(tested[a, False] for a in range(lo, hi + 1))
                if n:
                    agreement[f"{lo}-{hi}"] = dict(tested=n, accepted=yes / n, prior=[prior[lo], prior[hi]])
            predicted = {
                f"[{E_BINS[b]:g}, {E_BINS[b + 1]:g})": dict(
                    steps=int(s), predicted_per_step=p / s, accepted_per_step=a / s, verified_per_step=v / s
                )
                for b, (s, p, a, v) in sorted(by_e.items())
            }
            report["runs"][f"{name} {prompt_set}"] = dict(by_agreement=agreement, by_prediction=predicted)
            print(name, prompt_set, json.dumps(report["runs"][f"{name} {prompt_set}"]), flush=True)
with open(out_path, "w") as f:
    json.dump(report, f, indent=1)
