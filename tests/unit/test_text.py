import pytest

from edgespec.decoding.text import Detokenizer, StopStrings


def test_detokenizer_never_splits_a_character():
    smile = "🙂".encode()  # 4 bytes, streamed one byte per token
    pieces = {0: b"hi ", 1: smile[:1], 2: smile[1:3], 3: smile[3:], 4: "é".encode()[:1], 5: "é".encode()[1:]}
    detok = Detokenizer(pieces.__getitem__)
    out = [detok.push(t) for t in [0, 1, 2, 3, 4, 5]]
    assert out == ["hi ", "", "", "🙂", "", "é"]
    assert detok.flush() == ""


def test_detokenizer_flushes_an_incomplete_tail():
    detok = Detokenizer({0: "€".encode()[:2]}.__getitem__)
    assert detok.push(0) == ""
    assert detok.flush() == "\ufffd"


def test_stop_strings_hold_back_possible_starts():
    stops = StopStrings(["</end>"])
    assert stops.feed("hello </") == "hello "
    assert stops.feed("en") == ""
    assert stops.feed("d> tail") == ""
    assert stops.stopped


def test_stop_strings_release_false_alarms():
    stops = StopStrings(["STOP"])
    assert stops.feed("ST") == ""
    assert stops.feed("ART") == "START"
    assert not stops.stopped


# -- hostile input: any token sequence, any stop strings --------------------------------------------
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ = settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


def _reference_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """What the whole text shows: cut at the earliest stop string, if any."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


@FUZZ
@given(
    chunks=st.lists(st.text(alphabet="ab<>/\n", max_size=6), max_size=30),
    stops=st.lists(st.text(alphabet="ab<>/", min_size=1, max_size=7), min_size=1, max_size=4),
)
def test_stop_strings_match_the_whole_text_cut_however_it_streams(chunks, stops):
    """Fed in any pieces, the shown text is the whole text cut at its earliest stop string."""
    matcher = StopStrings(stops)
    shown = ""
    for chunk in chunks:
        shown += matcher.feed(chunk)
        if matcher.stopped:
            break
    if not matcher.stopped:
        shown += matcher.flush()
    assert (shown, matcher.stopped) == _reference_stop("".join(chunks), stops)


def test_a_huge_stop_string_costs_linear_time():
    """A 2.5 MB stop string that every step almost matches ("aaaa…b" against a stream of "a"): the old
    matcher tried every prefix of it at every step (O(L²): 110 s a step, so this test never ended);
    this one reads each new character once (measured: docs/security.md)."""
    stop = "a" * 2_500_000 + "b"
    matcher = StopStrings([stop])
    for _ in range(200):
        assert matcher.feed("a" * 50) == ""  # all of it may still begin the stop string: held back
    assert matcher.feed("b") == "a" * 10_000 + "b" and not matcher.stopped  # a false alarm, released
    whole, shown = StopStrings([stop]), ""
    text = "x" + stop + "tail"
    for start in range(0, len(text), 100_000):  # the stop string itself, streamed in 26 pieces
        shown += whole.feed(text[start : start + 100_000])
    assert whole.stopped and shown == "x"


@FUZZ
@given(st.lists(st.binary(max_size=5), max_size=20))
def test_detokenizer_survives_any_bytes(pieces):
    """Any byte sequence (a model may emit any tokens): no exception, and the text equals the whole
    sequence decoded with U+FFFD for what is not UTF-8."""
    detok = Detokenizer(pieces.__getitem__)
    text = "".join(detok.push(i) for i in range(len(pieces))) + detok.flush()
    assert text == b"".join(pieces).decode("utf-8", errors="replace")


def test_detokenizer_replaces_a_lone_continuation_byte():
    detok = Detokenizer({0: b"x", 1: b"\x80", 2: b"y"}.__getitem__)
    assert [detok.push(t) for t in (0, 1, 2)] == ["x", "\ufffd", "y"]
