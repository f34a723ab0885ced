"""The invoke bench runs end to end (``--quick``) and reports every client count.

No timing assertions: speed claims live in bench/README.md, not in tests.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from bench._invoke_setup import LeanClient
from bench.invoke import (
    ClientRun,
    make_row,
    median_rows,
    parse_args,
    parse_counts,
    run_clients,
    targets,
)

REPO = Path(__file__).resolve().parents[2]
BASELINE_MS = {"p50": 0.001, "p95": 0.002, "p99": 0.003}


@pytest.mark.timeout(120)
def test_quick_run_reports_every_client_count() -> None:
    cmd = [sys.executable, "bench/invoke.py", "--quick", "--duration-s", "2", "--json", "-"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = json.loads(proc.stdout)
    assert doc["broker"] == "filesystem" and doc["client"] == "lean"
    assert [(r["processes"], r["clients"]) for r in doc["rows"]] == [(2, 1), (2, 4)]
    for row in doc["rows"]:
        assert row["calls"] > 0 and row["failed"] == 0, row
        assert row["cold"] == 0, row  # warmed up first: every timed call is warm
        assert set(row["server_p50_ms"]) == {"queue_wait", "execution", "total"}, row
        assert row["overhead_ms"]["p99"] >= row["overhead_ms"]["p50"] - 1e-9, row
        cpu = row["cpu_ms_per_call"]  # each part found and measured: every one works per call
        assert set(cpu) == {"server", "worker", "replica", "clients"}, row
        assert all(ms > 0 for ms in cpu.values()), row
    assert [t["met"] for t in doc["targets"][:2]] == [None, None]  # no 16-client row
    assert doc["targets"][2]["value"] > 0


def row_with(clients: int, latencies_s: list[float], elapsed_s: float = 2.0) -> dict:
    return make_row(clients, ClientRun(latencies_s=latencies_s, elapsed_s=elapsed_s), BASELINE_MS)


def test_row_overhead_is_thaw_minus_in_process_per_percentile() -> None:
    row = row_with(16, [0.002] * 99 + [0.012])
    assert row["calls"] == 100 and row["calls_per_s"] == 50.0
    assert row["overhead_ms"]["p50"] == pytest.approx(2.0 - 0.001)
    assert row["overhead_ms"]["p99"] == pytest.approx(2.1 - 0.003)  # interpolated


def test_targets_judge_the_16_client_row_and_the_best_throughput() -> None:
    fast = row_with(16, [0.002] * 1000, elapsed_s=1.0)
    slow = row_with(64, [0.050] * 100, elapsed_s=1.0)
    got = {t["name"]: t["met"] for t in targets([fast, slow])}
    assert list(got.values()) == [True, True, True]
    got = {t["name"]: t["met"] for t in targets([row_with(16, [0.004] * 10, 1.0)])}
    assert list(got.values()) == [False, True, False]


def test_targets_take_the_server_size_that_came_closest() -> None:
    one = make_row(16, ClientRun(latencies_s=[0.050] * 300, elapsed_s=1.0), BASELINE_MS, 1)
    two = make_row(16, ClientRun(latencies_s=[0.030] * 500, elapsed_s=1.0), BASELINE_MS, 2)
    p50, _, calls = targets([one, two])
    assert p50["value"] == pytest.approx(30.0 - 0.001)
    assert calls["value"] == 500 and calls["met"] is True


def test_a_row_without_successful_calls_has_no_percentiles() -> None:
    row = make_row(4, ClientRun(failed=3, elapsed_s=1.0), BASELINE_MS)
    assert row["overhead_ms"] is None and row["calls_per_s"] == 0.0
    assert [t["met"] for t in targets([row])] == [None, None, False]


def test_counts_are_parsed_and_checked() -> None:
    assert parse_counts("--clients", "1,16, 64") == [1, 16, 64]
    with pytest.raises(SystemExit, match="--processes '0,4': every count must be at least 1"):
        parse_counts("--processes", "0,4")
    with pytest.raises(SystemExit, match="comma-separated integers"):
        parse_counts("--clients", "one")


class FakeThaw(BaseHTTPRequestHandler):
    """A keep-alive HTTP/1.1 server (as uvicorn answers) that answers as thaw does."""

    protocol_version = "HTTP/1.1"
    wbufsize = 1 << 16  # headers and body in one write (no wait on a delayed ACK)

    def answer(self, status: int, payload: object) -> None:
        out = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("X-Thaw-Cold", "false")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving(handler: type[FakeThaw]) -> Iterator[str]:
    """The URL of a server answering with ``handler``, for the block."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class Echo(FakeThaw):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        echoed = {"path": self.path, "auth": self.headers["Authorization"], "got": json.loads(body)}
        self.answer(201, echoed)


def test_lean_client_posts_json_on_one_connection_and_reads_the_answer() -> None:
    with serving(Echo) as url, LeanClient(url, {"Authorization": "Bearer k"}, 10) as c:
        for i in range(3):  # the same connection, reused
            r = c.post("/v1/x", json={"i": i})
            assert r.status_code == 201
            assert r.headers.get("x-thaw-cold") == "false"  # any case
            assert r.json() == {"path": "/v1/x", "auth": "Bearer k", "got": {"i": i}}


def test_paced_rows_are_judged_for_latency_only() -> None:
    paced = make_row(16, ClientRun(latencies_s=[0.002] * 200, elapsed_s=1.0), BASELINE_MS, 2, 200)
    p50, p99, calls = targets([paced])
    assert "paced at 200 calls/s" in p50["name"] and p50["met"] is True
    assert p99["met"] is True
    assert calls["value"] is None and calls["met"] is None  # a paced row measures no capacity


class StallingThaw(FakeThaw):
    """Answers invokes as thaw does; the first call of a run waits ``stall_s``."""

    stall_s = 0.0
    seen = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            StallingThaw.seen += 1
            first = StallingThaw.seen == 1
        if first:
            time.sleep(self.stall_s)
        self.answer(200, {"output": body["input"], "timings_ms": {"total": 0.1}})


@pytest.fixture
def stalling_thaw() -> Iterator[SimpleNamespace]:
    StallingThaw.seen, StallingThaw.stall_s = 0, 0.35
    with serving(StallingThaw) as url:
        yield SimpleNamespace(url=url, admin_key="k")


def test_paced_clients_send_at_the_rate_and_time_calls_from_when_they_were_due(
    stalling_thaw: SimpleNamespace,
) -> None:
    # One client, 10 calls/s for 1 s: ten calls, whatever the server's speed. The first
    # stalls 0.35 s, so the three due behind it start late, and their wait counts.
    run = run_clients(stalling_thaw, 1, 1.0, Console(quiet=True), rate=10)
    assert run.failed == 0 and len(run.latencies_s) == 10
    late = sorted(run.latencies_s, reverse=True)
    assert late[0] >= 0.35 and late[1] >= 0.2 and late[3] >= 0.02, late


def test_unpaced_clients_send_each_call_when_the_last_returns(
    stalling_thaw: SimpleNamespace,
) -> None:
    StallingThaw.stall_s = 0.0
    run = run_clients(stalling_thaw, 1, 0.5, Console(quiet=True))
    assert run.failed == 0 and len(run.latencies_s) > 20


def test_repeated_runs_become_one_row_of_medians_per_client_count() -> None:
    runs = [
        make_row(16, ClientRun(latencies_s=[ms / 1e3] * 100, elapsed_s=1.0), BASELINE_MS, 2)
        for ms in (4.0, 2.0, 9.0)
    ]
    runs.insert(1, make_row(1, ClientRun(latencies_s=[0.001] * 10, elapsed_s=1.0), BASELINE_MS, 2))
    runs[0]["failed"], runs[0]["first_error"] = 1, "500 boom"
    sixteen, one = median_rows(runs)  # in the order the pairs first ran
    assert (one["clients"], one["runs"], one["calls"]) == (1, 1, 10)
    assert (sixteen["clients"], sixteen["runs"]) == (16, 3)
    assert sixteen["overhead_ms"]["p50"] == pytest.approx(4.0 - 0.001)  # not the mean, 5
    assert sixteen["thaw_ms"]["p99"] == pytest.approx(4.0)
    assert sixteen["calls"] == 300 and sixteen["calls_per_s"] == 100.0
    assert sixteen["failed"] == 1 and sixteen["first_error"] == "500 boom"
    assert targets([one, sixteen])[0]["value"] == pytest.approx(4.0 - 0.001)


def test_repeat_must_be_a_positive_count() -> None:
    assert parse_args(["--repeat", "3"]).repeat == 3
    with pytest.raises(SystemExit, match="--repeat 0"):
        parse_args(["--repeat", "0"])
