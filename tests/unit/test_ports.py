"""The decoder's ports (``edgespec.engine.ports``) and what implements them: the engine's classes and
the tests' fakes.

mypy (``scripts/test.sh``) checks each ``_as_*`` function below: its argument must be structurally a
``ports.*`` (every member, with compatible types). At run time each port's methods are checked by
name, so a method dropped from an implementation fails here too, without mypy.
"""

from __future__ import annotations

import inspect
import threading

import numpy as np
import pytest

from edgespec.decoding.decoder import _NoDraft, _overlap
from edgespec.decoding.sampling import SamplingParams
from edgespec.engine import ports
from edgespec.engine.draft import Draft
from edgespec.engine.pair import ModelPair
from edgespec.engine.rows import RowsVerified
from edgespec.engine.runners import Target
from edgespec.engine.sampled import SampledVerified
from edgespec.planner.inputs import Drafter
from edgespec.planner.tree import TreeBuilder
from tests.support.fake_llama import FakePair
from tests.support.synthetic_engine import SyntheticDraft, SyntheticEngine, SyntheticTarget


def _as_pair(pair: ModelPair | FakePair | SyntheticEngine) -> ports.Pair:
    return pair


def _as_target(target: Target | SyntheticTarget) -> ports.Target:
    return target


def _as_draft(draft: Draft | SyntheticDraft | _NoDraft) -> ports.Draft:
    return draft


def _as_verified(out: RowsVerified | SampledVerified | ports.Joined) -> ports.Verified:
    return out


def _members(port: type) -> set[str]:
    """A Protocol's own members and those of the Protocols it extends."""
    names: set[str] = set()
    for cls in port.__mro__:
        if cls is object or cls.__name__ in {"Protocol", "Generic"}:
            continue
        names |= {n for n in vars(cls) if not n.startswith("_")} | set(vars(cls).get("__annotations__", {}))
    return names


def _methods(port: type) -> set[str]:
    """The members an implementation must define on its class (the rest may be set by ``__init__``)."""
    return {n for n in _members(port) if callable(inspect.getattr_static(port, n, None))}


@pytest.mark.parametrize(
    "port, implementations",
    [
        (ports.Pair, [ModelPair, FakePair, SyntheticEngine]),
        (ports.Target, [Target, SyntheticTarget]),
        (ports.Draft, [Draft, SyntheticDraft, _NoDraft]),
        (ports.Verified, [RowsVerified, SampledVerified, ports.Joined]),
    ],
)
def test_every_implementation_has_every_member_of_its_port(port, implementations):
    methods = _methods(port)
    assert methods, port
    for cls in implementations:
        missing = sorted(name for name in methods if not callable(getattr(cls, name, None)))
        assert not missing, f"{cls.__name__} lacks {missing} of ports.{port.__name__}"


def test_the_ports_stay_narrow():
    """What the loop may ask of the models stays a short list (34 members before the ports; the
    target's ``use_sampling`` since backend reductions)."""
    own = {port: _members(port) for port in (ports.Pair, ports.Target)}
    draft_own = _members(ports.Draft) - _members(Drafter)  # beyond what the planners see
    assert len(own[ports.Pair]) <= 5 and len(own[ports.Target]) <= 11 and len(draft_own) <= 9


def test_joined_reads_the_root_then_the_batch_after_it():
    rows = np.array([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 1.0, 5.0]], dtype=np.float32)
    out = ports.Joined(RowsVerified(rows[:1]).detach(), RowsVerified(rows[1:]))
    assert [out.top(node) for node in range(3)] == [(1, 2.0), (0, 1.0), (2, 4.0)]
    greedy, sampled = SamplingParams(), SamplingParams(temperature=1.0, top_k=2)
    assert out.candidates(2, greedy, k=2, vocab_limit=3).ids.tolist() == [2, 1]
    e = np.exp(-1.0)  # row 1 at T = 1, top-2: logits 2 and 1 kept
    np.testing.assert_allclose(out.probs(1, sampled), [1 / (1 + e), 0.0, e / (1 + e)])
    rows[:] = 0  # the next decode overwrites llama.cpp's buffer: the detached root is a copy
    assert out.top(0) == (1, 2.0) and sorted(out.probs(2, sampled)) == [0.0, 0.5, 0.5]  # row 2: all 0 now


def test_a_decode_pending_is_waited_for_even_when_the_work_meanwhile_fails():
    """The target stays busy until ``result()``: ``decoder._overlap`` waits for it, then re-raises."""
    waited = []
    pending = ports.Pending(threading.Event(), lambda: waited.append(True))

    class Failing:
        def overlap(self, tree, pending):
            raise RuntimeError("the draft's look-ahead failed")

    with pytest.raises(RuntimeError, match="look-ahead failed"):
        _overlap(Failing(), TreeBuilder(1).freeze(), pending)
    assert waited == [True]
    assert ports.Pending.ready(3).then(lambda x: x + 1).result() == 4
