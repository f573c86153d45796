"""`edgespec models advise` on the bundled pair: its curves and fit measured (small, in a fresh
profile folder) or loaded, then predicted tokens/s and speedups as JSON."""

from __future__ import annotations

import json

import pytest

from tests.support.realmodels import BUNDLED_PAIR


@pytest.mark.model
def test_advise_json_on_the_bundled_pair(tmp_path, monkeypatch, capsys, models_cli):
    from edgespec.profile import costs, fit, store
    from tests.support.realmodels import bundled_paths

    bundled_paths()  # skips without the models
    monkeypatch.setattr(store, "home_dir", lambda: tmp_path)  # a fresh, small cost profile and fit
    monkeypatch.setattr(costs, "QUICK_SIZES", (1, 2, 4, 8))
    monkeypatch.setattr(costs, "QUICK_CATCHUP_SIZES", (1, 4))
    monkeypatch.setattr(fit, "FIT_TOKENS", 8)
    assert models_cli("advise", "--pair", BUNDLED_PAIR, "--json", "--threads", "1", "--ctx", "1024") == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = doc["pairs"]
    assert row["pair"] == BUNDLED_PAIR and row["installed"] and row["fits"]
    assert row["curves"] == "its files, measured here" and row["acceptance"] == "its own, measured here"
    assert row["plain"] == pytest.approx(1e3 / row["costs_ms"]["t1"])  # plain tokens/s: a decode a token
    assert row["costs_ms"]["t16"] > row["costs_ms"]["t1"] > 0
    assert row["recommended"] == "chain:4" and 0 < row["speedups"]["chain:4"] < 5
    assert row["speedups"]["auto"] >= 1.0 and row["lower"]["chain:4"] <= row["speedups"]["chain:4"]
    assert doc["machine"]["threads"] == 1 and doc["best"] == BUNDLED_PAIR
    assert doc["commands"][-1].startswith(f"edgespec chat --pair {BUNDLED_PAIR}")
