"""`edgespec bench` on the fake engine: interleaving, paired ratios, JSON, plot, --compare, prompt sets.

One real-model run of the command (marked ``model``) at the end.
"""

from __future__ import annotations

import argparse
import json
from statistics import median

import pytest
from rich.console import Console

from edgespec.commands import bench as bench_command
from edgespec.decoding.events import GenerationStats
from edgespec.errors import EdgespecError
from edgespec.measure import BenchConfig, Variant, document, report, run_bench, schedule, summarise
from edgespec.measure.prompts import (
    PROMPT_SETS,
    QUICK_PROMPTS,
    PromptCase,
    load_jsonl,
    load_prompts,
    prompt_set,
)
from edgespec.measure.runner import PLAIN, PromptResult, Run
from edgespec.planner.auto import AutoPlanner
from edgespec.planner.chain import ChainPlanner
from edgespec.planner.costmodel import CostModel
from edgespec.planner.strategies import build as make_planner
from tests.support.fake_llama import FakePair

CPU = CostModel.from_functions(lambda n: 0.057 * n, lambda n: 0.029 * n)
CASES = [
    PromptCase("t/one", "code", (("user", "a"),)),
    PromptCase("t/two", "chat", (("user", "b"), ("assistant", "c"), ("user", "d"))),
]
TOKENS = {"t/one": [5, 17, 3, 29, 8, 40, 12], "t/two": [9, 2, 33, 14, 6]}


def _variants():
    return [
        Variant("chain:2", "chain", 2, ChainPlanner(gamma=2)),
        Variant("tsd:8", "tsd", 8, make_planner("tsd", {"budget": 8})),
        Variant("auto", "auto", 48, AutoPlanner(costs=CPU), repeats=2),
    ]


@pytest.fixture(scope="module")
def fake_bench():
    calls = []
    result = run_bench(
        FakePair(n_seq=33),
        CASES,
        _variants(),
        BenchConfig(max_tokens=24, warmup_tokens=3),
        progress=lambda what, done, total: calls.append((what, done, total)),
        tokenize=lambda case: TOKENS[case.name],
    )
    return result, calls


def _doc(summary, **settings):
    return document.document(
        summary,
        pair={"name": "fake", "target": {"sha256": "aa"}, "draft": {"sha256": "bb"}},
        settings={"max_tokens": 24, "temperature": 0.0, "prompts": "test", **settings},
        hardware={"cpu": "test cpu", "gpus": [], "threads": 2},
        cost_profile=None,
    )


def test_schedule_puts_every_strategy_between_two_plain_runs():
    assert schedule(["a", "b", "c"]) == [PLAIN, "a", PLAIN, "b", PLAIN, "c", PLAIN]
    assert schedule(["a", "b", "c"], rotation=1) == [PLAIN, "b", PLAIN, "c", PLAIN, "a", PLAIN]
    assert schedule(["a", "b"], repeats=[1, 3]) == [PLAIN, "a", PLAIN, "b", PLAIN, "b", PLAIN, "b", PLAIN]


def test_runs_are_interleaved_per_prompt_and_match_plain(fake_bench):
    result, calls = fake_bench
    assert [pr.case.name for pr in result.prompts] == ["t/one", "t/two"]
    for index, pr in enumerate(result.prompts):
        assert [r.variant for r in pr.runs] == schedule(["chain:2", "tsd:8", "auto"], index, [1, 1, 2])
        plain = pr.plain_runs()[0].tokens
        assert len(plain) == 24
        assert all(r.tokens == plain for r in pr.runs)  # greedy: every strategy reproduces plain decoding
    assert [r.variant for r in result.prompts[1].runs][:3] == [PLAIN, "tsd:8", PLAIN]  # rotated
    assert calls[-1][1] == calls[-1][2] == 2 * 9 + 1  # progress reached its total (runs + warm-up)


def _stopped_at(prompt: str):
    """A progress callback that presses Ctrl-C when the bench reaches ``prompt``'s second run."""

    def progress(what: str, done: int, total: int) -> None:
        if what == f"{prompt}: chain:2":
            raise KeyboardInterrupt

    return progress


def test_a_bench_stopped_with_ctrl_c_keeps_the_prompts_it_finished():
    run = lambda progress: run_bench(  # noqa: E731
        FakePair(n_seq=33), CASES, _variants(), BenchConfig(max_tokens=24, warmup_tokens=3),
        progress=progress, tokenize=lambda case: TOKENS[case.name],
    )
    result = run(_stopped_at("t/two"))
    assert [pr.case.name for pr in result.prompts] == ["t/one"] and result.stopped and result.of_prompts == 2
    assert len(result.prompts[0].runs) == 9  # whole: every strategy between its two plain runs
    entries = {e["key"]: e for e in summarise(result)["results"]}
    assert entries["auto"]["speedup"] > 0 and entries["chain:2"]["tokens"] == 24
    with pytest.raises(KeyboardInterrupt):  # nothing finished: nothing to report
        run(_stopped_at("t/one"))
    assert not run(None).stopped


def test_summary_has_one_entry_per_strategy_with_paired_ratios(fake_bench):
    result, _ = fake_bench
    summary = summarise(result)
    entries = {e["key"]: e for e in summary["results"]}
    assert list(entries) == ["chain:2", "tsd:8", "auto"]
    for e in entries.values():
        assert len(e["paired_ratios"]) == 2 * e["repeats"] and e["speedup"] > 0
        assert e["identical_to_plain"] == 1.0
        assert sum(e["time_split"].values()) == pytest.approx(1.0)
    assert entries["chain:2"]["mal"] > 1.0 and entries["chain:2"]["acceptance_rate"] > 0
    # chain γ=2 verifies 3 tokens a step; each answer's first token (decoded with the prompt) is a step of 1
    assert 2.5 < entries["chain:2"]["verified_per_step"] < 3.0
    chain = entries["chain:2"]
    assert chain["mal_per_draft_pass"] == pytest.approx(chain["mal"] / chain["draft_decodes_per_step"])
    assert chain["mal_per_verified_token"] == pytest.approx(chain["mal"] / chain["verified_per_step"])
    assert 0 < chain["python_ms_per_step"] < chain["seconds"] * 1000 / chain["target_calls"]
    per_prompt = [p["variants"]["chain:2"] for p in summary["per_prompt"]]
    assert chain["python_ms_per_step_median"] == pytest.approx(
        median(p["python_ms_per_step"] for p in per_prompt)
    )
    assert 1.5 < chain["draft_decodes_per_step_median"] < 2.0  # γ = 2: two levels a step, but the first token
    auto = entries["auto"]
    assert auto["mal"] == 1.0 and auto["plain_step_share"] == 1.0 and auto["draft_decodes_per_step"] == 0
    assert summary["baseline"]["mal"] == 1.0 and summary["baseline"]["runs"] == 10
    assert [p["order"] for p in summary["per_prompt"]][0][:3] == [PLAIN, "chain:2", PLAIN]
    assert len(summary["per_prompt"][0]["variants"]["auto"]["ratios"]) == 2
    chain = summary["per_prompt"][0]["variants"]["chain:2"]
    assert 2.5 < chain["verified_per_step"] < 3.0 and chain["mal"] > 1.0  # per prompt, too


def _run(variant: str, n: int, seconds: float) -> Run:
    return Run(variant, "p", tuple(range(n)), seconds, GenerationStats(tokens=n, target_calls=n), 0)


def test_totals_count_gsd_merges_and_graph_successes_per_step():
    from edgespec.measure.runner import _totals

    runs = [
        Run(
            "gsd",
            "p",
            (1, 2, 3, 4),
            1.0,
            GenerationStats(tokens=4, target_calls=2, merges=3, graph_successes=1),
            0,
        ),
        Run("gsd", "p", (1, 2), 1.0, GenerationStats(tokens=2, target_calls=2, merges=1), 0),
    ]
    totals = _totals(runs)
    assert totals["merges_per_step"] == pytest.approx(4 / 4)
    assert totals["graph_success_share"] == pytest.approx(1 / 4)


def test_paired_ratio_uses_the_plain_runs_just_before_and_after():
    pr = PromptResult(CASES[0], 7, 0.1, 0.05)
    # plain 10 tok/s, S 12 tok/s, plain 8 tok/s (the machine slowed down), T 9 tok/s, plain 9 tok/s
    pr.runs = [
        _run(PLAIN, 10, 1.0),
        _run("S", 12, 1.0),
        _run(PLAIN, 8, 1.0),
        _run("T", 9, 1.0),
        _run(PLAIN, 9, 1.0),
    ]
    assert pr.ratio("S") == pytest.approx(12 / 9)  # pooled over 10 and 8 tokens in 2 s
    assert pr.ratio("T") == pytest.approx(9 / 8.5)
    assert pr.ratio("missing") is None and pr.ratios("missing") == []
    pr.runs += [_run("S", 8, 1.0), _run(PLAIN, 9, 1.0)]  # a second run of S: ratios per run, geometric mean
    assert pr.ratios("S") == pytest.approx([12 / 9, 8 / 9])
    assert pr.ratio("S") == pytest.approx((12 / 9 * 8 / 9) ** 0.5)
    # the placebo: each inner plain run against the plain runs before and after it (10, 8, 9, 9 tok/s)
    assert pr.placebo_ratios() == pytest.approx([8 / 9.5, 9 / 8.5])


def test_json_round_trip_and_schema(fake_bench, tmp_path):
    result, _ = fake_bench
    doc = _doc(summarise(result))
    path = tmp_path / "bench.json"
    document.write_json(doc, path)
    back = document.read_json(path)
    assert back["schema"] == document.SCHEMA
    assert {"hardware", "software", "pair", "settings", "baseline", "results", "per_prompt"} <= set(back)
    assert back["software"]["llama_cpp_python"]
    for entry in back["results"]:
        for field in (
            "strategy",
            "budget",
            "speedup",
            "speedup_spread",
            "tokens_per_second",
            "mal",
            "acceptance_rate",
            "verified_per_step",
            "draft_decodes_per_step",
            "time_split",
            "efficiency",
        ):
            assert field in entry, field
    (tmp_path / "other.json").write_text(json.dumps({"schema": "nope"}))
    with pytest.raises(EdgespecError, match="not an `edgespec bench --json` file"):
        document.read_json(tmp_path / "other.json")


def test_plot_writes_a_png(fake_bench, tmp_path):
    result, _ = fake_bench
    path = tmp_path / "bench.png"
    report.plot(_doc(summarise(result)), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_report_shows_the_table_and_auto_ratio(fake_bench):
    result, _ = fake_bench
    console = Console(record=True, width=200)
    doc = _doc(summarise(result))
    report.print_report(doc, console)
    text = console.export_text()
    assert "chain:2" in text and "tsd:8" in text and "plain" in text
    assert "auto vs plain: paired tokens/s ratio median" in text
    worst = min(p["variants"]["auto"]["ratio"] for p in doc["per_prompt"])
    assert f"worst prompt {worst:.3f} (t/" in text
    noise = doc["baseline"]["noise"]
    # 2 prompts × 5 plain runs: 3 placebo ratios each
    assert noise["per_run"]["min"] <= noise["per_prompt"]["min"] <= noise["per_prompt"]["max"]
    assert f"per run {noise['per_run']['min']:.2f}–{noise['per_run']['max']:.2f}×" in text


def test_compare_prints_the_differences(fake_bench, tmp_path, capsys):
    result, _ = fake_bench
    a = _doc(summarise(result))
    b = json.loads(json.dumps(a))
    b["results"][0]["speedup"] = a["results"][0]["speedup"] + 0.25
    b["results"][0]["mal"] = a["results"][0]["mal"] - 0.5
    b["hardware"]["cpu"] = "another cpu"
    b["results"] = b["results"][:2] + [{**b["results"][2], "key": "auto:8"}]
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    document.write_json(a, pa)
    document.write_json(b, pb)
    parser = argparse.ArgumentParser()
    bench_command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--compare", str(pa), str(pb)])
    assert args.run(args) == 0
    out = capsys.readouterr().out
    assert "+0.25" in out and "-0.50" in out
    assert "hardware.cpu: test cpu → another cpu" in out
    assert "auto:8" in out and "auto" in out  # unmatched rows are shown with a dash on the other side


def test_parse_variants():
    parse = bench_command.parse_variants
    assert parse("chain,tsd:8,auto@3", None) == [("chain", None, 1), ("tsd", 8, 1), ("auto", None, 3)]
    assert parse("chain,dyspec", "4,16", 2) == [
        ("chain", 4, 2),
        ("chain", 16, 2),
        ("dyspec", 4, 2),
        ("dyspec", 16, 2),
    ]
    assert parse("plain,chain:3", None) == [("chain", 3, 1)]
    with pytest.raises(EdgespecError, match="NAME"):
        parse("chain:x", None)
    with pytest.raises(EdgespecError, match="unknown strategy 'beam'"):
        parse("beam", None)
    with pytest.raises(EdgespecError, match="twice"):
        parse("chain:4,chain:4", None)


# -- prompts --------------------------------------------------------------------------------------------
def test_builtin_prompt_sets():
    papers = {"code", "chat", "math", "summarisation", "translation"}
    copying = {"edit", "summarise", "follow-up"}  # the answer repeats the conversation
    assert set(PROMPT_SETS) == papers | copying | {"prose"}
    assert all(len(cases) >= 3 for cases in PROMPT_SETS.values())
    assert all(len(c.messages) >= 3 for c in PROMPT_SETS["chat"] + PROMPT_SETS["follow-up"])  # multi-turn
    assert all("```" in c.last_user_text for c in PROMPT_SETS["edit"])  # a code block to rewrite
    assert all(c.name.startswith(f"{c.category}/") for cases in PROMPT_SETS.values() for c in cases)
    assert 4 <= len(QUICK_PROMPTS) <= 6 and {c.category for c in QUICK_PROMPTS} == papers | {"edit"}
    everything = prompt_set("all")
    assert len({c.name for c in everything}) == len(everything) == sum(map(len, PROMPT_SETS.values()))
    assert prompt_set("math,code")[0].category == "math"
    with pytest.raises(EdgespecError, match="unknown prompt set"):
        prompt_set("poetry")


def test_jsonl_prompts(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(
        '{"prompt": "hello"}\n\n'
        '{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], '
        '"name": "greet", "category": "chat"}\n'
    )
    cases = load_prompts(str(path))
    assert [c.name for c in cases] == ["mine/1", "greet"]
    assert cases[0].messages == (("user", "hello"),) and cases[1].messages[0] == ("system", "be brief")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no"}\n')
    with pytest.raises(EdgespecError, match=r"bad.jsonl, line 2: no 'prompt' or 'messages'"):
        load_jsonl(bad)
    bad.write_text("not json\n")
    with pytest.raises(EdgespecError, match="line 1: not JSON"):
        load_jsonl(bad)


# -- the real command -----------------------------------------------------------------------------------
@pytest.mark.model
def test_bench_command_on_the_bundled_pair(tmp_path, monkeypatch, capsys):
    from edgespec.profile import costs, fit, store
    from tests.support.realmodels import BUNDLED_PAIR, bundled_paths

    bundled_paths()  # skips without the models
    monkeypatch.setattr(store, "home_dir", lambda: tmp_path)  # a fresh, small cost profile and fit
    monkeypatch.setattr(costs, "QUICK_SIZES", (1, 2, 4))
    monkeypatch.setattr(costs, "QUICK_CATCHUP_SIZES", (1, 4))
    monkeypatch.setattr(fit, "FIT_TOKENS", 4)  # auto's fit on a few tokens
    prompts = tmp_path / "one.jsonl"
    prompts.write_text('{"prompt": "Write a Python function that adds two numbers."}\n')
    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    parser = argparse.ArgumentParser()
    bench_command.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["bench", "--pair", BUNDLED_PAIR, "--prompts", str(prompts), "--strategies", "chain:3,auto"]
        + ["--max-tokens", "8", "--warmup-tokens", "2", "--ctx", "1024", "--max-tree-nodes", "8"]
        + ["--threads", "1"]  # robust when other processes share the cores (see docs/benchmarks.md)
        + ["--json", str(out_json), "--plot", str(out_png)]
    )
    assert args.run(args) == 0
    out = capsys.readouterr().out
    assert "auto vs plain: paired tokens/s ratio" in out
    doc = document.read_json(out_json)
    entries = {e["key"]: e for e in doc["results"]}
    assert set(entries) == {"chain:3", "auto"}
    assert entries["chain:3"]["tokens"] == 8 and entries["chain:3"]["mal"] >= 1.0
    assert doc["pair"]["target"]["sha256"] and doc["cost_profile"]["target"]
    assert out_png.stat().st_size > 5000
