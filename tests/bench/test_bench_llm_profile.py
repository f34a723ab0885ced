"""bench/llm_profile.py's summary of py-spy samples, from a made-up raw file."""

from __future__ import annotations

from pathlib import Path

from bench.llm_profile import record_command, summary


def test_threads_of_one_kind_are_summed_and_their_leaf_frames_ranked(tmp_path: Path) -> None:
    raw = tmp_path / "worker.txt"
    raw.write_text(
        'process 10:"python -m cli.main worker";process 11:"python -m worker.zygote";'
        "thread (12): Thread-1 (_run_generation_loop);loop (e.py:1);forward (m.py:9) 60\n"
        'process 10:"python -m cli.main worker";process 11:"python -m worker.zygote";'
        "thread (13): thaw-direct-0a1b2c3d4e5f6a7b;run (d.py:3);send (f.py:77) 25\n"
        'process 10:"python -m cli.main worker";process 11:"python -m worker.zygote";'
        "thread (14): thaw-direct-ffeeddccbbaa9988;run (d.py:3);recv (f.py:94) 15\n"
        "not a sample line\n"
    )
    text = summary(raw).splitlines()
    assert text[0] == "== worker.txt: 100 samples"
    loop = next(i for i, line in enumerate(text) if "_run_generation_loop" in line)
    assert text[loop].startswith(" 60.0%") and '"python -m worker.zygote"' in text[loop]
    assert "100.0%  forward (m.py:9)" in text[loop + 1]
    direct = [line for line in text if line.rstrip().endswith("thaw-direct")]
    assert len(direct) == 1 and direct[0].startswith(" 40.0%")  # two calls' threads, one kind
    assert any("62.5%  send (f.py:77)" in line for line in text)


def test_a_missing_file_says_so(tmp_path: Path) -> None:
    assert "no samples" in summary(tmp_path / "server.txt")


def test_the_gil_recording_samples_only_the_holder_of_the_worker_tree(tmp_path: Path) -> None:
    out = tmp_path / "worker-gil.txt"
    plain = record_command("py-spy", 42, out, 2.5, True)
    gil = record_command("py-spy", 42, out, 2.5, True, gil=True)
    assert plain[:6] == ["py-spy", "record", "--pid", "42", "--duration", "2"]
    assert "--subprocesses" in plain and "--gil" not in plain
    assert gil == [*plain, "--gil"]
    assert "--subprocesses" not in record_command("py-spy", 42, out, 2.5, False)
