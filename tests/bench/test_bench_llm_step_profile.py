"""bench/llm_step_profile.py's inclusive view of the generation thread, from a made-up
py-spy raw file, and the command that records it."""

from __future__ import annotations

import sys
from pathlib import Path

from bench.llm_step_profile import function_of, inclusive, record_command

LOOP = "thread (12): Thread-1 (_run_generation_loop);_run_generation_loop (c.py:10)"


def test_a_function_counts_once_a_sample_and_only_the_generation_threads(tmp_path: Path) -> None:
    raw = tmp_path / "step.txt"
    raw.write_text(
        f'process 1:"python bench/llm_graphs.py";{LOOP};step (c.py:20);forward (m.py:9) 50\n'
        f'process 1:"python bench/llm_graphs.py";{LOOP};step (c.py:20);prepare (io.py:5);'
        "reset (io.py:255) 30\n"
        # a function twice in one stack (recursion) counts once
        f'process 1:"python bench/llm_graphs.py";{LOOP};step (c.py:21);step (c.py:22) 20\n'
        'process 1:"python bench/llm_graphs.py";thread (13): MainThread;join (t.py:1) 100\n'
        "not a sample line\n"
    )
    text = inclusive(raw).splitlines()
    assert text[0] == "== step.txt: 200 samples, 100 in the _run_generation_loop thread"
    shares = {line[8:]: line[:6].strip() for line in text[1:]}
    assert shares["step c.py"] == "100.0%"  # every line, counted once though on 3
    assert shares["forward m.py"] == "50.0%"
    assert shares["prepare io.py"] == "30.0%" and shares["reset io.py"] == "30.0%"
    assert "join t.py" not in shares  # another thread's


def test_a_frame_is_its_function_and_file_whatever_its_line() -> None:
    assert function_of("forward (/x/y/modeling_llama.py:412)") == "forward modeling_llama.py"
    assert function_of("<module> (run.py)") == "<module> run.py"
    assert function_of("no location") == "no location"


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    assert "no samples" in inclusive(tmp_path / "step.txt")


def test_the_bench_runs_under_py_spy_as_a_child(tmp_path: Path) -> None:
    command = record_command("py-spy", tmp_path / "s.txt", 150, ["--settings", "thaw"])
    assert command[:4] == ["py-spy", "record", "--rate", "150"]
    assert command[4:8] == ["--format", "raw", "--output", str(tmp_path / "s.txt")]
    at = command.index("--")
    assert command[at + 1] == sys.executable
    assert command[at + 2].endswith("bench/llm_graphs.py")
    assert command[at + 3 :] == ["--settings", "thaw"]
