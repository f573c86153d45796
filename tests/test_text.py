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
