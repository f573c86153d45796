"""The cost profile: measured through the engine on the fake context, interpolated, cached by key."""

from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
import pytest

from edgespec.models.store import model_identity
from edgespec.profile import costs
from edgespec.profile.attach import attach
from edgespec.profile.costs import CostProfile
from edgespec.profile.store import profile_path
from tests.support.fake_llama import ChatFakePair


@pytest.fixture(scope="module")
def measured() -> tuple[ChatFakePair, CostProfile]:
    pair = ChatFakePair(n_seq=17)  # with a chat template: auto's prepare measures the fit too
    steps = []
    profile = costs.measure(
        pair, sizes=(1, 2, 4, 8), catchup_sizes=(1, 4), repeats=2, progress=lambda *a: steps.append(a)
    )
    assert steps[-1][1] == steps[-1][2]
    # The fake decodes in microseconds, so its draft's repeats can disagree by 30 % on a busy runner (the
    # busy rule reads them): the tests below take them as a quiet machine gives them (the rule's own test).
    quiet = {n: (lo, lo) for n, (lo, _) in profile.spread["draft"].items()}
    return pair, dataclasses.replace(profile, spread={**profile.spread, "draft": quiet})


def test_measure_covers_every_curve_and_size(measured):
    _, profile = measured
    assert set(profile.target) == set(profile.draft) == {1, 2, 4, 8}
    assert set(profile.catchup) == {1, 4}
    assert all(s > 0 for curve in (profile.target, profile.draft, profile.catchup) for s in curve.values())
    assert profile.repeats == 2 and profile.created
    lo, hi = profile.spread["target"][8]
    assert 0 < lo <= hi


def test_measure_leaves_the_caches_committed(measured):
    pair, _ = measured
    for runner in (pair.target, pair.draft):
        view = runner.ctx.committed_view()
        assert [pos for pos, _, _ in view] == list(range(len(runner.committed)))
        assert [tok for _, tok, _ in view] == runner.committed
        assert all(seqs == frozenset(runner.tagged_seqs) for _, _, seqs in view)
    assert len(pair.target.committed) == costs.CONTEXT_TOKENS - 1


def test_model_interpolates_and_extrapolates():
    profile = CostProfile(target={1: 1.0, 4: 4.0, 8: 6.0}, draft={1: 0.5, 8: 0.5}, catchup={1: 0.2, 4: 0.8})
    model = profile.model(n_max=12)
    assert model.target.shape == (12,)
    assert model.t(2) == pytest.approx(2.0) and model.t(6) == pytest.approx(5.0)
    assert model.t(10) == pytest.approx(7.0)  # past the last size: the last segment's slope (0.5 / token)
    assert model.t(40) == pytest.approx(6.0 + 0.5 * 32)  # past the table too
    assert model.d(5) == pytest.approx(0.5) and model.k(2) == pytest.approx(0.4)
    assert np.all(np.diff(model.target) >= 0)
    # A measured dip is kept: a CPU backend's batched kernels make 16 tokens cheaper than 15.
    dip = CostProfile(target={1: 1.0, 2: 2.0, 3: 1.5, 4: 4.0}, draft={1: 1.0}, catchup={1: 1.0}).model(4)
    assert dip.target.tolist() == [1.0, 2.0, 1.5, 4.0]


def test_profile_rows_and_json_round_trip(measured):
    _, profile = measured
    rows = profile.rows()
    assert [r["n"] for r in rows] == [1, 2, 4, 8]
    assert rows[0]["target_rel"] == 1.0 and rows[1]["catchup"] is None
    back = CostProfile.from_dict(json.loads(json.dumps(profile.as_dict())))
    assert back == profile


def test_cache_is_keyed_and_reused(measured, tmp_path, monkeypatch):
    pair, profile = measured
    assert costs.load_cached(pair, tmp_path) is None
    path = costs.save(profile, tmp_path)
    assert path.parent == tmp_path / "profiles" and path.name.startswith("costs-")
    monkeypatch.setattr(costs, "measure", lambda *a, **k: pytest.fail("measured although cached"))
    assert costs.load_or_measure(pair, home=tmp_path) == profile
    # Another thread count is another profile.
    before = pair.settings
    pair.settings = dataclasses.replace(before, threads=7)
    try:
        assert costs.profile_key(pair)["threads"] == 7
        assert costs.load_cached(pair, tmp_path) is None
    finally:
        pair.settings = before
    # Another CPU behind the same model name (a VM's "AMD EPYC", AVX2 or AVX-512), another build of the
    # same version (portable, native): another profile.
    from edgespec import engine
    from edgespec.engine import probe

    with monkeypatch.context() as patched:
        patched.setattr(probe, "cpu_identity", lambda: "model name: AMD EPYC\nflags: avx avx2 avx512f")
        assert costs.load_cached(pair, tmp_path) is None
    with monkeypatch.context() as patched:
        patched.setattr(engine, "system_info", lambda: "CPU : AVX2 = 1 | AVX512 = 1 |", raising=False)
        assert costs.load_cached(pair, tmp_path) is None
    assert costs.load_cached(pair, tmp_path) == profile


def test_attach_gives_auto_its_curves(measured, tmp_path, monkeypatch):
    from edgespec.planner.auto import AutoPlanner
    from edgespec.planner.chain import ChainPlanner
    from edgespec.profile import fit

    pair, profile = measured
    costs.save(profile, tmp_path)
    planner = AutoPlanner()
    assert attach(planner, pair, home=tmp_path) is planner
    assert planner.costs is not None and planner.costs.target.shape == (pair.max_nodes - 1,)
    assert not planner.costs.look_ahead  # a local target: the draft does not look ahead
    # A planner that asks for nothing costs nothing: no profile read, nothing measured, nothing written.
    monkeypatch.setattr(costs, "load_cached", lambda *a, **k: pytest.fail("read a profile nobody asked for"))
    monkeypatch.setattr(fit, "load_fit", lambda *a, **k: pytest.fail("read a fit nobody asked for"))
    attach(ChainPlanner(), pair, home=tmp_path / "empty")
    assert not (tmp_path / "empty").exists()
    assert attach(None, pair) is None  # plain decoding


def test_one_pair_profile_serves_every_planner_it_is_given_to(measured, tmp_path, monkeypatch):
    """Bench's way: one ``PairProfile`` for every variant, loaded (or measured) when the first asks;
    OPT-Tree asks even with μ given (its levels' cost and its tree's size come from the curves)."""
    from edgespec.planner.copy_drafts import NGramPlanner
    from edgespec.planner.opt_tree import OptTreePlanner
    from edgespec.profile.attach import PairProfile

    pair, profile = measured
    costs.save(profile, tmp_path)
    loads, real = [], costs.load_cached
    monkeypatch.setattr(costs, "load_cached", lambda *a, **k: loads.append(1) or real(*a, **k))
    planners = OptTreePlanner(mu=0.3), NGramPlanner()
    with PairProfile(pair, home=tmp_path) as shared:
        assert shared.asked is None  # nothing asked yet: nothing loaded
        for planner in planners:
            attach(planner, shared)
    assert loads == [1] and shared.asked == profile
    assert all(p.costs is not None and p.costs.target.shape == (pair.max_nodes - 1,) for p in planners)
    assert planners[0].threshold(8, 24) == 0.3


def test_model_identity_reads_the_store_record(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + b"\0" * 60)
    assert model_identity(str(model))["sha256"] is None
    stat = model.stat()
    record = {"sha256": "ab" * 32, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    (tmp_path / "m.gguf.verified.json").write_text(json.dumps(record))
    assert model_identity(str(model))["sha256"] == "ab" * 32
    record["size"] += 1  # a stale record (the file changed since it was hashed) is ignored
    (tmp_path / "m.gguf.verified.json").write_text(json.dumps(record))
    assert model_identity(str(model))["sha256"] is None


def test_a_profile_measured_on_a_busy_machine_is_used_but_never_cached(measured, tmp_path, monkeypatch):
    """Repeats that disagree (the draft's median max/min above BUSY_SPREAD) mean other work shared the
    cores: such a profile serves the run that measured it, is not saved, and a saved one is ignored."""
    pair, quiet = measured
    assert quiet.busy is None
    noisy = {n: (lo, lo * 1.5) for n, (lo, _) in quiet.spread["draft"].items()}
    busy = dataclasses.replace(quiet, spread={**quiet.spread, "draft": noisy})
    assert busy.busy == pytest.approx(1.5)
    monkeypatch.setattr(costs, "measure", lambda *a, **k: busy)
    assert costs.load_or_measure(pair, home=tmp_path) is busy
    assert not profile_path(busy.key, tmp_path).exists()
    costs.save(busy, tmp_path)  # as an older edgespec did
    assert costs.load_cached(pair, tmp_path) is None
    monkeypatch.setattr(costs, "measure", lambda *a, **k: quiet)
    assert costs.load_or_measure(pair, home=tmp_path) is quiet
    assert costs.load_cached(pair, tmp_path) == quiet  # the quiet one replaced it


def test_over_rpc_every_target_size_is_decoded_once_before_it_is_timed(monkeypatch):
    """A remote target's first decode of each batch size pays a one-off (llama.cpp asks every server the
    allocation sizes of the new shapes' tensors): the profile times sizes only after it was paid."""
    pair = ChatFakePair(n_seq=17)
    pair.target.ctx.remote = True
    one_off, seen, start_verify = 0.05, set(), pair.target.start_verify

    def verify_paying_once_per_size(tree, *args, **kwargs):
        if tree.size not in seen:
            seen.add(tree.size)
            time.sleep(one_off)
        return start_verify(tree, *args, **kwargs)

    monkeypatch.setattr(pair.target, "start_verify", verify_paying_once_per_size)
    profile = costs.measure(pair, sizes=(1, 2, 8, 12, 16), catchup_sizes=(1,), repeats=2)
    assert seen == {1, 2, 8, 12, 16}
    assert all(hi < one_off / 2 for lo, hi in profile.spread["target"].values())  # no timed sample paid it
