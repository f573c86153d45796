"""``edgespec models advise``'s rows (profile/advise.py): fits, fitted curves, the best pair."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from edgespec.models.shapes import shape_of
from edgespec.models.specs import ModelSpec, PairSpec
from edgespec.planner.advice import chain_speedup
from edgespec.profile import advise
from tests.support.advice import costs, fit


def spec(name: str, quant: str = "Q4_K_M", size: int | None = None) -> ModelSpec:
    return ModelSpec(name=name, tokenizer="qwen2.5", quant=quant, size=size, sha256=None, source=None)


def pair_spec(target: str, draft: str = "qwen2.5-coder-0.5b-instruct-q8_0") -> PairSpec:
    return PairSpec(f"{target}+0.5b", spec(target), spec(draft, "Q8_0"), "chain", 4, {})


BUNDLED = pair_spec("qwen2.5-coder-1.5b-instruct-q4_k_m", "qwen2.5-coder-0.5b-instruct-q4_k_m")
SEVEN = pair_spec("qwen2.5-coder-7b-instruct-q4_k_m")


def test_kv_cache_by_hand():
    # 7B: 28 layers × 4 KV heads × 128 wide, keys and values, f16, 4096 tokens
    assert advise.kv_bytes(shape_of("qwen2.5-7b"), 4096) == 2 * 28 * 4 * 128 * 4096 * 2


def test_a_pair_fits_only_in_enough_ram():
    need = advise.need_bytes(SEVEN, 4096)
    assert need is not None and 4.5e9 < need < 6e9
    big = advise.Machine("cpu", 2, 2, ram=32 * 2**30)
    small = advise.Machine("cpu", 2, 2, ram=4 * 2**30)
    one = advise.row(SEVEN, False, big, 4096, costs(), advise.FITTED, fit(), False)
    assert one.fits and one.acceptance == advise.BUNDLED_FIT and one.plain == pytest.approx(1 / 0.11)
    assert one.speedups["chain:4"] == pytest.approx(chain_speedup(costs(), fit(), 4))
    assert one.lower["chain:4"] < one.speedups["chain:4"]
    assert not advise.row(SEVEN, False, small, 4096, costs(), advise.FITTED, fit(), False).fits
    assert one.fits_gpu is None  # no GPU
    gpu = advise.Machine("cpu", 2, 2, ram=32 * 2**30, gpus=("a GPU",), vram=need - 1)
    assert advise.row(SEVEN, False, gpu, 4096, costs(), advise.FITTED, fit(), False).fits_gpu is False


def test_fitted_curves_follow_the_weights():
    # the bundled target (c_t(1) 0.11 s) and draft (catch-up 0.05 s) measured: the 7B's c_t(1) lies on
    # the line through them over the weights multiplied; its curve has the target's shape
    ref = advise.Measured(costs(catchup=lambda n: 0.05), fit())
    got = advise.fitted(ref, BUNDLED, SEVEN)
    models = (BUNDLED.target, BUNDLED.draft, SEVEN.target)
    n = {s.name: advise.weights_multiplied(shape_of(s.name)) for s in models}
    slope = (0.11 - 0.05) / (n[BUNDLED.target.name] - n[BUNDLED.draft.name])
    assert 0.11 - slope * n[BUNDLED.target.name] > 0  # a fixed cost per decode
    assert got.t(1) == pytest.approx(0.11 + slope * (n[SEVEN.target.name] - n[BUNDLED.target.name]))
    assert got.t(16) / got.t(1) == pytest.approx(costs().t(16) / costs().t(1))
    # a draft cheap for its size (the line would cross 0 before it): the proportional line
    cheap_draft = advise.Measured(costs(catchup=lambda n: 0.03), fit())
    got = advise.fitted(cheap_draft, BUNDLED, SEVEN)
    assert got.t(1) == pytest.approx(0.11 * n[SEVEN.target.name] / n[BUNDLED.target.name])


def test_weights_multiplied_leave_out_the_looked_up_embeddings():
    seven, bundled = shape_of(SEVEN.target.name), shape_of(BUNDLED.target.name)
    assert not seven.tied_output and bundled.tied_output
    # Qwen2.5-7B: 7.6 B parameters, 0.54 B of them the embedding table (untied: looked up)
    assert 6.9e9 < advise.weights_multiplied(seven) < 7.2e9
    # Qwen2.5-1.5B: 1.54 B parameters, the table reused as the output (multiplied)
    assert 1.45e9 < advise.weights_multiplied(bundled) < 1.56e9


def test_the_best_pair_is_the_fastest_that_fits():
    machine = advise.Machine("cpu", 2, 2, ram=8 * 2**30)
    fast = advise.row(BUNDLED, True, machine, 4096, costs(), advise.REAL, fit(), True)
    slow = advise.row(
        SEVEN, False, machine, 4096, costs(target=lambda n: 0.5 + 0.01 * n), advise.FITTED, fit(), False
    )
    assert advise.best_pair([slow, fast]) is fast
    assert advise.best_pair([advise.row(SEVEN, False, machine, 4096, None, "", None, False, "x")]) is None


def test_each_row_rests_on_the_best_curves_there_are(monkeypatch):
    loaded = []

    @contextmanager
    def load(name):
        loaded.append(name)
        yield name

    monkeypatch.setattr(advise, "measured", lambda pair, *args: advise.Measured(costs(), fit()))
    machine = advise.Machine("cpu", 2, 2, ram=32 * 2**30)
    pairs = {BUNDLED.name: BUNDLED, SEVEN.name: SEVEN}
    real, fitted = advise.advise(pairs, {BUNDLED.name}, BUNDLED, load, machine, 4096)
    assert loaded == [BUNDLED.name]  # the absent pair is never loaded
    assert (real.curves, real.acceptance) == (advise.REAL, advise.OWN_FIT)
    assert (fitted.curves, fitted.acceptance) == (advise.FITTED, advise.BUNDLED_FIT)
    assert fitted.plain is not None and fitted.plain < real.plain  # a 7B decodes slower than a 1.5B
    slow = costs(target=lambda n: 0.5 + 0.01 * n)
    _, random = advise.advise(
        pairs, {BUNDLED.name}, BUNDLED, load, machine, 4096, measure_like=lambda n: slow
    )
    assert random.curves == advise.RANDOM and random.plain == pytest.approx(1 / 0.51)
    (alone,) = advise.advise({SEVEN.name: SEVEN}, set(), BUNDLED, load, machine, 4096)
    assert alone.plain is None and "install qwen2.5-coder-1.5b" in alone.note
