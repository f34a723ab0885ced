"""The Server-Timing header: phases first, then call timings, each name once."""

from __future__ import annotations

from control_plane.api.timing import call_headers, server_timing


def test_phases_come_first_and_a_name_in_both_is_given_once() -> None:
    phases = {"schedule": 12.0, "first_output": 480.04}
    timings = {"queue_wait": 3.0, "first_output": 481.0, "total": 500.0}
    assert server_timing(phases, timings) == (
        "schedule;dur=12.0, first_output;dur=480.0, queue_wait;dur=3.0, total;dur=500.0"
    )


def test_names_are_header_tokens_and_an_empty_call_has_no_header() -> None:
    assert server_timing({"weights to device": 1.0}) == "weights_to_device;dur=1.0"
    assert call_headers("c1", cold=False, phases_ms={}) == {
        "X-Thaw-Call-Id": "c1",
        "X-Thaw-Cold": "false",
    }
