"""Streamed chunks made while the worker reported the last go out together: the
runtime gathers those already waiting (never waiting for more), the agent splits
them into events under the chunk cap, the guard checks and redacts each chunk, and
the control plane stores each at its place (a repeated post once)."""

from __future__ import annotations

import queue

from control_plane.protocol import CallEvent
from worker.call_guard import CallLimits, guard, output_groups
from worker.child_protocol import Output, Result
from worker.runtimes.process import _waiting_outputs


def test_the_outputs_waiting_are_gathered_up_to_the_calls_end() -> None:
    inbox: queue.SimpleQueue[object] = queue.SimpleQueue()
    for i in (1, 2):
        inbox.put(Output(call_id="c", chunk=i))
    end = Result(call_id="c", output=None)
    inbox.put(end)
    inbox.put(Output(call_id="c", chunk=99))  # never reached: the end comes first
    chunks, after = _waiting_outputs(Output(call_id="c", chunk=0), inbox)
    assert (chunks, after) == ([0, 1, 2], end)
    lone, nothing = _waiting_outputs(Output(call_id="c", chunk="x"), queue.SimpleQueue())
    assert (lone, nothing) == (["x"], None)  # nothing waiting: sent at once, alone


def test_groups_keep_each_event_under_the_chunk_cap() -> None:
    assert output_groups(["ab", "cd", "ef"], 100) == [["ab", "cd", "ef"]]
    assert output_groups(["ab", "cd", "ef"], 9) == [["ab", "cd"], ["ef"]]  # 4 bytes each
    big = "x" * 50
    assert output_groups(["a", big, "b"], 10) == [["a"], [big], ["b"]]  # alone, to refuse


def test_the_guard_redacts_every_chunk_and_fails_on_any_too_large() -> None:
    limits = CallLimits(max_stream_chunk_bytes=32)
    event = CallEvent(kind="output", outputs=["the token s3cret", "ok"], seq=4)
    guarded = guard(event, limits, {"TOKEN": "s3cret"})
    assert guarded.outputs == ["the token [redacted:TOKEN]", "ok"] and guarded.kind == "output"
    too_big = guard(CallEvent(kind="output", outputs=["ok", "y" * 40], seq=1), limits, {})
    assert (too_big.kind, too_big.outputs, too_big.output) == ("failed", None, None)
    assert "THAW_MAX_STREAM_CHUNK_BYTES" in (too_big.error or "")
    assert CallEvent(kind="output", outputs=[1, 2], seq=3).chunks() == [1, 2]
    assert CallEvent(kind="output", output=7, seq=3).chunks() == [7]
