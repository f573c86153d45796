"""The chat app's status bar with the real `auto` planner, on the real chat facade (``PairEngine``) over
the fake llama.cpp pair: it says what auto is doing at that moment — copying on a machine where drafting
can never pay, not "speculation cannot pay" while copies run at several tokens a step.
"""

from __future__ import annotations

import pytest

from edgespec.decoding.chat import ChatSettings
from edgespec.planner.auto import COPY, PLAIN, AutoPlanner
from edgespec.planner.costmodel import CostModel
from edgespec.session import LoadedPair, PairEngine
from edgespec.strategy import StrategyChoice
from tests.engine.test_engine_fake import _echo_prompt
from tests.support.fake_llama import ChatFakePair
from tests.tui.test_tui import SIZE, make_app, ready, run, send
from tui.widgets import generation

C1 = 0.057  # a plain decode on the 2-core CPU
# A CPU whose verify curve is steep and whose draft costs half a plain decode a token: no draft tree can
# ever beat plain decoding (auto never drafts), but a tree of 16 good copies costs ~4 decodes and pays.
STEEP_CPU = CostModel.from_functions(
    lambda n: C1 * {1: 1.0, 2: 1.4, 3: 1.75}.get(n, 2.1 + (n - 4) * 0.16),
    lambda n: 0.06 * n,
)


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path))


class EchoBackend:
    """One pair: the fake llama.cpp pair behind the real ``PairEngine``; every prompt tokenises to a text
    the fake model answers by repeating itself, so copies from the conversation pay."""

    strategies = ("none", "auto")

    def __init__(self):
        self.engine: PairEngine | None = None
        self.planners: list[AutoPlanner] = []

    def pairs(self) -> list[str]:
        return ["fake-llama"]

    def load(self, pair, on_progress) -> LoadedPair:
        fake = ChatFakePair(n_seq=33)
        echo = _echo_prompt()
        # the user's message is the echo, the template's own text nothing: the prompt is the echo alone
        fake.target.model.tokenize = lambda text, add_special=True, parse_special=True: (
            list(echo) if "rewrite" in text else []
        )
        fake.context_used = lambda: len(fake.target.committed)  # as ModelPair's
        self.engine = PairEngine(fake)
        return LoadedPair(self.engine, "fake-llama", StrategyChoice("auto"))

    def make_planner(self, choice: StrategyChoice):
        if choice.name == "none":
            return None
        planner = AutoPlanner(costs=STEEP_CPU)
        self.engine._with_costs.add(id(planner))  # the profile is given: nothing to measure
        self.planners.append(planner)
        return planner


def test_status_bar_says_auto_is_copying_where_drafting_cannot_pay(tmp_path, monkeypatch):
    labels: list[tuple[str, str]] = []  # (auto's mode, the status label) each time the worker makes one
    label_of = generation.strategy_label

    def recorded(planner):
        label = label_of(planner)
        labels.append((planner.mode, label))
        return label

    monkeypatch.setattr(generation, "strategy_label", recorded)
    monkeypatch.setattr(generation, "UI_INTERVAL", 0.0)  # a label for every step (the UI merges them)

    async def scenario():
        backend = EchoBackend()
        app = make_app(tmp_path, backend, settings=ChatSettings(max_tokens=60))
        async with app.run_test(size=SIZE) as pilot:
            chat = await ready(pilot)
            await send(pilot, "rewrite this")
            planner = backend.planners[-1]
            assert planner.policy.never_drafts and planner.steps[COPY] > 0
            copying = [label for mode, label in labels if mode == COPY]
            assert copying and all(label.startswith("auto copying ") for label in copying)
            assert all(
                "cannot pay" not in label for mode, label in labels if mode != PLAIN
            ), "a copy step shown as plain decoding"
            assert chat.status.strategy == labels[-1][1] == f"auto {planner.describe()}"  # the last step's

    run(scenario())


def test_strategy_label_follows_autos_last_step():
    planner = AutoPlanner(costs=STEEP_CPU)
    assert generation.strategy_label(planner) == "auto budget≤48, deciding per step"
    planner.mode, planner.size, planner.steps[COPY] = COPY, 12, 1
    assert generation.strategy_label(planner).startswith("auto copying 12 tokens (")
    planner.mode, planner.steps[PLAIN] = PLAIN, 1
    planner.policy.why = "speculation cannot pay on this machine"
    assert generation.strategy_label(planner).startswith("auto plain: speculation cannot pay on this machine")
