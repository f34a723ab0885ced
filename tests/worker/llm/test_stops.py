"""Stop strings over streamed text, split at every point."""

from __future__ import annotations

import pytest

from worker.llm.stops import StopScanner


def _stream(text: str, stops: list[str], step: int) -> tuple[str, bool]:
    scan = StopScanner(stops)
    shown = "".join(scan.feed(text[i : i + step]) for i in range(0, len(text), step))
    return shown + scan.finish(), scan.stopped


@pytest.mark.parametrize("step", [1, 2, 3, 7, 100])
def test_text_ends_before_the_first_stop_wherever_the_deltas_split(step: int) -> None:
    text = "Hello there.\n\nUser: next question"
    assert _stream(text, ["\n\nUser:"], step) == ("Hello there.", True)
    assert _stream(text, ["question", "there"], step) == ("Hello ", True)
    assert _stream(text, ["nowhere"], step) == (text, False)
    assert _stream(text, [], step) == (text, False)


def test_a_possible_stop_is_held_back_until_it_is_known() -> None:
    scan = StopScanner(["END"])
    assert scan.feed("abc E") == "abc "
    assert scan.feed("N") == ""
    assert scan.feed("x") == "ENx"  # it was not a stop after all
    assert scan.feed("END and more") == ""
    assert scan.stopped and scan.feed("more") == "" and scan.finish() == ""
