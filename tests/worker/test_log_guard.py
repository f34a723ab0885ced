"""What a replica prints, guarded per call on a thread that runs one call after another."""

from __future__ import annotations

import io

from worker.log_guard import MARKER, GuardedStream


def test_each_call_on_a_thread_gets_its_own_cap() -> None:
    out = io.StringIO()
    guarded = GuardedStream(out, {"HF_TOKEN": "hf_secret"}, max_bytes=40)
    guarded.write("first call 1234567890\n")  # 22 bytes
    guarded.write("first call, more and more\n")  # 26 more would pass 40: dropped, marked
    guarded.write("first call, the end\n")  # dropped, not marked again
    guarded.start_call()
    guarded.write("second call hf_secret\n")
    assert out.getvalue() == (
        "first call 1234567890\n" + MARKER.format(cap=40) + "second call [redacted:HF_TOKEN]\n"
    )


def test_a_line_left_unfinished_goes_out_with_its_own_call() -> None:
    out = io.StringIO()
    guarded = GuardedStream(out, {}, max_bytes=None)
    guarded.write("no newline at the end")
    assert out.getvalue() == ""  # held until its line is whole
    guarded.start_call()
    guarded.write("next call\n")
    assert out.getvalue() == "no newline at the end\nnext call\n"
