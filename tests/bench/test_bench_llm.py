"""bench/llm.py's figures and tables, from made-up stream timings (no server)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bench._llm_baselines import (
    RawClient,
    StreamRefused,
    StreamTiming,
    _FirstText,
    _read_events,
)
from bench.llm import (
    ENGINE,
    GENERATE,
    SERVE,
    THAW,
    THAW_EAGER,
    THAW_NARROW,
    check_model_dir,
    cold_table,
    first_token_figures,
    first_token_table,
    level_row,
    parse_args,
    streams_table,
    with_ratios,
)

SLO = (500.0, 50.0)


def test_a_level_gives_tokens_per_s_ttft_tpot_and_goodput_medians_over_rounds() -> None:
    one = [StreamTiming(0.0, 0.1, 1.1, 11), StreamTiming(0.0, 0.3, 2.0, 18)]
    two = [StreamTiming(0.0, 0.2, 1.0, 9), StreamTiming(0.5, 0.6, 1.5, 1)]
    row = level_row(2, [one, two], 250.0, 150.0)
    # round one: 29 tokens over 2.0 s; round two: 10 tokens over 1.5 s
    assert row["tokens_per_s"] == pytest.approx((29 / 2.0 + 10 / 1.5) / 2)
    # TTFT p50: round one (100, 300) -> 200 ms, round two (200, 100) -> 150 ms
    assert row["ttft_p50_ms"] == pytest.approx(175.0)
    # TPOT: round one 100 and 100 ms; round two 100 ms (a 1-token stream has none)
    assert row["tpot_p50_ms"] == pytest.approx(100.0)
    assert row["tokens"] == pytest.approx(19.5)
    # goodput (TTFT <= 250 ms, TPOT <= 150 ms): round one 1 of 2, round two 2 of 2
    assert row["goodput"] == pytest.approx(0.75)


def test_generate_s_first_text_waits_for_a_cut_character_to_be_whole() -> None:
    from examples.build_model import build_tokenizer

    tokenizer = build_tokenizer()
    ids = tokenizer.encode("🙂 ok", add_special_tokens=False)
    streamer = _FirstText(0.0, tokenizer)
    streamer.put(torch.tensor([[1, 2, 3]]))  # the prompt: never text of the completion
    streamer.put(torch.tensor([ids[0]]))  # the emoji's first bytes: no text yet
    assert streamer.first_s is None
    for i in ids[1:]:
        streamer.put(torch.tensor([i]))
    assert streamer.first_s is not None


def test_a_stream_with_no_text_has_no_ttft_and_the_table_shows_a_dash() -> None:
    row = {"mode": THAW, **level_row(1, [[StreamTiming(0.0, None, 0.5, 0)]], *SLO)}
    assert row["ttft_p50_ms"] is None and row["tokens_per_s"] == 0.0 and row["goodput"] == 0.0
    [shown] = streams_table([row], "t").rows
    assert shown[:5] == [THAW, "1", "0.0", "-", "-"] and shown[7] == "0%"


def _read(head: bytes, body: bytes) -> tuple[float | None, int, bool]:
    """``_read_events`` over a response of these bytes."""

    async def read() -> tuple[float | None, int, bool]:
        reader = asyncio.StreamReader()
        reader.feed_data(head + body)
        reader.feed_eof()
        return await _read_events(reader, t0=0.0)

    return asyncio.run(read())


def _chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (*pieces, b""))


def test_the_raw_reader_times_the_first_text_and_takes_the_tokens_from_the_usage() -> None:
    events = [
        b": waiting for a replica\n\n",  # a comment, no event
        b'data: {"choices": [{"text": ""}]}\n\n',
        b'data: {"choices": [{"text": "Hel"}]}\n\ndata: {"choices": [{"te',  # split mid-event
        b'xt": "lo wor"}]}\n\n',  # one event of several tokens: usage counts them
        b'data: {"choices": [], "usage": {"completion_tokens": 5}}\n\ndata: [DONE]\n\n',
    ]
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    first, tokens, keep = _read(head, _chunked(*events))
    assert first is not None and first > 0 and tokens == 5 and keep
    closing = head.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
    assert _read(closing, _chunked(events[-1])) == (None, 5, False)


def test_the_raw_client_sends_again_on_a_new_connection_when_a_kept_one_was_closed() -> None:
    served: list[int] = []  # the connection each request came on, counted from 0

    async def run() -> list[StreamTiming]:
        connections = 0

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal connections
            conn, connections, length = connections, connections + 1, 0
            while (line := await reader.readline()) not in (b"", b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            served.append(conn)
            usage = b'data: {"choices": [], "usage": {"completion_tokens": 3}}\n\n'
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(_chunked(b'data: {"choices": [{"text": "a"}]}\n\n', usage))
            await writer.drain()
            writer.close()  # as a keep-alive timeout would, once the call is answered

        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server, RawClient(f"http://127.0.0.1:{port}/v1", "key") as client:
            first = await client.completion("m", 0, 3, time.perf_counter())
            await asyncio.sleep(0.05)  # the kept connection's close arrives
            return [first, await client.completion("m", 1, 3, time.perf_counter())]

    timings = asyncio.run(run())
    assert [t.tokens for t in timings] == [3, 3] and served == [0, 1]


def test_the_raw_reader_refuses_an_answer_that_is_not_an_event_stream() -> None:
    body = b'{"error": {"message": "unknown model"}}'
    head = b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n" % len(body)
    with pytest.raises(StreamRefused, match=r"got HTTP/1.1 404 Not Found: .*unknown model"):
        _read(head, body)


def test_thaw_rows_get_ratios_to_each_baseline_and_the_ttft_it_adds() -> None:
    def row(mode: str, tokens_per_s: float, ttft_p50_ms: float) -> dict[str, object]:
        return {
            "mode": mode,
            "streams": 8,
            "tokens_per_s": tokens_per_s,
            "ttft_p50_ms": ttft_p50_ms,
            "ttft_p99_ms": 2 * ttft_p50_ms,
            "tpot_p50_ms": None,
            "tpot_p99_ms": None,
            "goodput": 1.0,
        }

    figures = ((ENGINE, 100, 10), (THAW, 90, 30), (GENERATE, 15, 900), (SERVE, 45, 40))
    figures += ((THAW_NARROW, 60, 25),)
    rows = with_ratios([row(m, t, f) for m, t, f in figures])
    thaw, narrow = rows[1], rows[4]
    assert thaw["vs_engine"] == pytest.approx(0.9) and thaw["vs_generate"] == pytest.approx(6.0)
    assert thaw["vs_serve"] == pytest.approx(2.0) and thaw["ttft_added_ms"] == pytest.approx(20.0)
    assert thaw["ttft_p99_over_p50"] == pytest.approx(2.0)
    assert narrow["vs_engine"] == pytest.approx(0.6) and narrow["ttft_added_ms"] == 15.0
    assert "vs_engine" not in rows[0]
    shown = streams_table(rows, "t").rows  # thaw first, its off switch next
    assert [r[0] for r in shown] == [THAW, THAW_NARROW, ENGINE, GENERATE, SERVE]
    assert shown[0][-4:] == ["0.90", "6.00", "2.00", "20.0"]


def test_the_off_switch_function_turns_off_wide_steps_on_a_cpu_and_graphs_on_a_gpu() -> None:
    from bench._llm_stack import off_switch
    from control_plane.protocol import LLMOptions

    assert LLMOptions(**off_switch("cpu")).wide_step_ms_per_token == 0
    on_gpu = LLMOptions(**off_switch("cuda"))
    assert (
        not on_gpu.cuda_graphs
        and on_gpu.wide_step_ms_per_token == LLMOptions().wide_step_ms_per_token
    )
    rows = with_ratios(
        [
            {"mode": m, "streams": 8, "tokens_per_s": t, "ttft_p50_ms": 10.0, "ttft_p99_ms": 12.0}
            for m, t in ((ENGINE, 100.0), (THAW_EAGER, 40.0))
        ]
    )
    assert rows[1]["vs_engine"] == pytest.approx(0.4)


def test_ttft_at_one_stream_is_read_apart_by_client_over_the_engines() -> None:
    thaw = {"raw HTTP": [0.012, 0.010, 0.011], "openai SDK": [0.016, 0.015, 0.017]}
    figures = first_token_figures(3, {**thaw, "in-process": [0.004, 0.005, 0.003]})
    assert figures is not None
    assert figures["p50_ms"] == pytest.approx(
        {ENGINE: 4.0, "thaw, raw HTTP": 11.0, "thaw, openai SDK": 16.0}
    )
    assert figures["added_ms"] == pytest.approx({"thaw, raw HTTP": 7.0, "thaw, openai SDK": 12.0})
    rows = first_token_table(figures).rows
    assert rows == [
        [ENGINE, "4.0", "-"],
        ["thaw, raw HTTP", "11.0", "7.0"],
        ["thaw, openai SDK", "16.0", "12.0"],
    ]
    # Without the engine (skipped), thaw's figures stand alone; without thaw's, none.
    alone = first_token_figures(3, thaw)
    assert alone is not None and alone["added_ms"] == {} and ENGINE not in alone["p50_ms"]
    assert first_token_figures(0, None) is None


def test_the_cold_table_sets_thaw_beside_naive_with_phases() -> None:
    cold = {
        "trials": 3,
        "naive": {"first_token_s": 4.0, "phases_s": {"imports_s": 2.5, "load_s": 1.0}},
        "thaw": {"first_token_s": 0.4, "phases_ms": {"weights_fetch": 50.0, "user_setup": 120.0}},
    }
    spec = cold_table(cold)
    assert spec.rows[0][:3] == ["naive (fresh process)", "4.000", "1.00"]
    assert spec.rows[0][3] == "imports 2500, load 1000"
    assert spec.rows[1][1:] == ["0.400", "0.100", "weights_fetch 50, user_setup 120"]


def test_a_directory_that_is_not_a_safetensors_model_is_refused(tmp_path: Path) -> None:
    assert "is not a directory" in (check_model_dir(tmp_path / "nope") or "")
    assert "no config.json" in (check_model_dir(tmp_path) or "")
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    assert "convert to safetensors" in (check_model_dir(tmp_path) or "")
    (tmp_path / "model.safetensors").write_bytes(b"x")
    assert check_model_dir(tmp_path) is None


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, said in [
        (["--streams", "1,x"], "--streams takes numbers"),
        (["--streams", "0"], "must be positive"),
        (["--skip", "serve,warp"], "--skip takes"),
        (["--url", "http://x", "--key", ""], "needs an API key"),
        (["--server-processes", "0"], "--server-processes must be positive"),
        (["--warm-rounds", "-1"], "--warm-rounds must not be negative"),
    ]:
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert said in capsys.readouterr().err
    assert parse_args(["--skip", "serve,cold"]).skip == {"serve", "cold"}
    assert parse_args(["--server-processes", "4"]).server_processes == 4


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_device_is_refused_up_front(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--device", "cuda"])
    assert "--device cuda: torch sees no CUDA device" in capsys.readouterr().err


REPO = Path(__file__).resolve().parents[2]


def _thaw_bench_llm(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "cli.main", "bench", "llm", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_quick_run_sets_thaw_beside_every_baseline_and_naive(tmp_path: Path) -> None:
    out = tmp_path / "llm.json"
    args = ["--quick", "--streams", "1,3", "--rounds", "1", "--cold-trials", "1"]
    args += ["--ttft-trials", "3", "--warm-rounds", "1"]
    proc = _thaw_bench_llm(*args, "--max-tokens", "8", "--json", str(out), timeout_s=850)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(out.read_text())
    modes = {(r["mode"], r["streams"]) for r in doc["rows"]}
    every_mode = (THAW, THAW_NARROW, ENGINE, GENERATE, SERVE)
    assert modes == {(m, n) for m in every_mode for n in (1, 3)}
    assert doc["warm_rounds"] == 1 and "medians of 1 after 1 warm" in proc.stdout
    for row in doc["rows"]:
        assert row["rounds"] == 1, row  # the warm round is not counted
        assert row["tokens"] > 0 and row["tokens_per_s"] > 0, row
        assert row["ttft_p50_ms"] is not None and 0 <= row["goodput"] <= 1, row
    thaw = [r for r in doc["rows"] if r["mode"] == THAW]
    assert all(r["vs_engine"] > 0 and r["vs_serve"] > 0 and r["vs_generate"] > 0 for r in thaw)
    # thaw's CPU per token, by process: the replica made the tokens, the server
    # relayed them, and every level counts its own tokens.
    cpu = doc["cpu_per_token"]
    assert [c["streams"] for c in cpu] == [1, 3]
    for level, row in zip(cpu, thaw, strict=True):  # the warm round's tokens not counted
        assert level["tokens"] == row["tokens"] * row["rounds"], (level, row)
        ms = level["ms_per_token"]
        assert set(ms) == {"server", "worker", "replica", "clients"}
        # /proc counts CPU in 10 ms ticks: the server's few ms on this run's tiny levels
        # can read 0 (the OpenAI routes now skip the framework); the replica's cannot.
        assert ms["replica"] > 0 and min(ms.values()) >= 0, ms
    assert "CPU per completion token" in proc.stdout
    assert doc["client"] == "raw" and "read by the raw HTTP reader" in proc.stdout
    # The engine's rounds ran beside thaw's, in turn, and thaw's CPU meanwhile was read
    # (in /proc's 10 ms ticks: over this run's rounds of milliseconds, any share).
    assert doc["thaw_idle_cpu_beside_engine"] >= 0, doc["thaw_idle_cpu_beside_engine"]
    assert "idle beside the engine's rounds" in proc.stdout
    # TTFT at one stream, read by a raw HTTP reader and by the SDK, beside the engine's.
    first = doc["first_token"]
    assert first["trials"] == 3 and set(first["p50_ms"]) == {
        ENGINE,
        "thaw, raw HTTP",
        "thaw, openai SDK",
    }
    assert all(ms > 0 for ms in first["p50_ms"].values()), first
    assert set(first["added_ms"]) == {"thaw, raw HTTP", "thaw, openai SDK"}
    assert "TTFT at one stream" in proc.stdout
    cold = doc["cold_start"]
    assert cold["thaw"]["all_pool_hits"] and cold["naive"]["first_token_s"] > 0
    assert {"imports_s", "load_s", "engine_s", "first_token_s"} == set(cold["naive"]["phases_s"])
    assert {"weights_fetch", "user_setup", "first_output"} <= set(cold["thaw"]["phases_ms"])
    assert "LLM cold start" in proc.stdout and "x engine" in proc.stdout


def test_thaw_bench_llm_refuses_a_directory_that_is_not_a_model(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.pt").write_bytes(b"x")
    proc = _thaw_bench_llm("--model", str(tmp_path))
    assert proc.returncode != 0
    assert "no .safetensors weights (it holds model.pt: convert to safetensors)" in proc.stderr
