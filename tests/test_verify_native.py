"""The target's greedy verification in one compiled call (``engine/_verify.c``) against the Python path it
replaces (``Target.verify``, then ``decoder.decide`` at temperature 0): the same batch, verdict, margins
and KV cells, so whole generations are identical event by event."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from realmodels import chat_prompt

from edgespec.decoding.decoder import Request, decide, generate
from edgespec.decoding.sampling import SamplingParams
from edgespec.engine import _verify, runners
from edgespec.measure.prompts import ENGINE_PROMPTS
from edgespec.planner.dyspec import DySpecPlanner
from edgespec.planner.gsd import GSDPlanner
from edgespec.planner.tree import ChildRule, PlanContext, TreeBuilder

I32 = partial(np.array, dtype=np.int32)


def test_bad_arguments_are_errors_not_crashes():
    # ctx, batch, n_batch, n_seq_max, n_vocab, tokens, parents, child_rule, first_position, seq_counts,
    # seq_ids
    args = [1, 1, 512, 4, 100, I32([5, 6]), I32([-1, 0]), np.zeros(2, np.int8), 0, I32([1, 1]), I32([0, 0])]
    with pytest.raises(RuntimeError, match="closed context"):
        _verify.greedy_verify(0, *args[1:])  # a NULL context never reaches llama.cpp
    for at, bad in [
        (5, I32([])),  # no node
        (5, ["5", 6]),  # not an int
        (6, I32([0, 0])),  # the root has a parent
        (6, I32([-1, 1])),  # a parent after its child
        (7, np.zeros(3, np.int8)),  # one rule too many
        (9, I32([1, 5])),  # more ids than the context has
        (10, I32([0, 4])),  # an id out of range
        (10, I32([0, 0, 0])),  # more ids than the counts add up to
        (2, 1),  # more nodes than n_batch
    ]:
        broken = list(args)
        broken[at] = bad
        with pytest.raises((ValueError, TypeError)):
            _verify.greedy_verify(*broken)
    broken = list(args)
    broken[5] = [5, 2**40]
    with pytest.raises(OverflowError, match="int32"):  # a token that does not fit
        _verify.greedy_verify(*broken)
    with pytest.raises(ValueError, match="four function addresses"):
        _verify.bind(1, 1, 1, 0)


def verify_in_python(target, tree):
    """The reference: pack and decode (``Target.verify``), then the greedy rule over the rows."""
    layout, rows = target.verify(tree)
    verdict, margins = decide(tree, rows, SamplingParams(temperature=0.0), None)
    return layout, verdict.path, verdict.next_token, margins


@pytest.mark.model
@pytest.mark.parametrize("planner", [partial(DySpecPlanner, budget=16), partial(GSDPlanner, budget=16)])
def test_compiled_verification_equals_the_python_rule(pair, planner):
    def steps():
        prompt = chat_prompt(pair, ENGINE_PROMPTS[1])
        events = generate(pair, planner(), Request(prompt=prompt, max_tokens=40))
        runs = [
            ([(t.id, t.provenance, t.margin) for t in e.tokens], e.verified_nodes, e.accepted)
            for e in events
        ]
        cells = [pair.target.ctx.seq_pos_max(seq) for seq in range(pair.target.n_seq)]
        return runs, cells, pair.target.committed[:]

    compiled = steps()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runners.Target, "verify_greedy", verify_in_python)
        in_python = steps()
    assert compiled == in_python  # tokens, provenances, margins, trees and the target's cells, exactly
    assert any(nodes > 2 and accepted > 1 for _, nodes, accepted in compiled[0])  # trees were walked deep


@pytest.mark.model
def test_one_tree_has_the_same_path_margins_and_cells(pair):
    """A branching DySpec tree verified both ways from the same cache: identical verdicts and cells; and
    a LONGEST node is refused, not walked."""
    prompt = chat_prompt(pair, ENGINE_PROMPTS[0])
    pair.target.sync(prompt[:-1])
    pair.draft.sync(prompt)
    pair.draft.begin_step(0.0)
    ctx = PlanContext(sampling=False, rng=np.random.default_rng(0), max_nodes=32)
    tree = DySpecPlanner(budget=24).plan(prompt[-1], pair.draft, ctx)
    assert np.unique(tree.parents[1:]).size > 1  # a tree, not a chain
    results = []
    for verify in (runners.Target.verify_greedy, verify_in_python):
        layout, path, token, margins = verify(pair.target, tree)
        cells = [pair.target.ctx.seq_pos_max(seq) for seq in range(layout.n_leaves)]
        results.append((tuple(path), token, margins, cells))
        pair.target.ctx.seq_rm(-1, len(pair.target.committed))  # the speculative cells: the same cache again
    assert results[0] == results[1]
    assert len(results[0][2]) == len(results[0][0])  # a margin per path node

    longest = TreeBuilder(prompt[-1])
    longest.add(0, int(tree.tokens[1]), 1.0)
    longest.set_children_rule(0, ChildRule.LONGEST)
    with pytest.raises(ValueError, match="LONGEST"):
        pair.target.verify_greedy(longest.freeze())
    pair.target.ctx.seq_rm(-1, len(pair.target.committed))
