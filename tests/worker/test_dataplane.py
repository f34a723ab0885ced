"""The direct call port: the worker's DataServer and the control plane's DirectChannel
over real loopback sockets."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from control_plane.dispatch.direct import DirectChannel, DirectLostError, DirectUnavailableError
from control_plane.protocol import CallEvent, RunCall
from tests.worker.recorder import Recorder
from worker.child_protocol import ReplicaSpec
from worker.dataplane import DataServer
from worker.frames import FrameSocket, PeerClosedError
from worker.replicas import ReplicaManager
from worker.runtimes.base import OnExit, ReplicaHandle, Runtime

Sink = Callable[[CallEvent], bool]


def run_message(call_id: str, input: object = None) -> RunCall:
    return RunCall(call_id=call_id, replica_id="r1", function="f", input=input, accepted_at=0.0)


class Echo:
    """Answers started, one output per item of a list input, then succeeded."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.release = threading.Event()
        self.release.set()
        self.sink_results: list[bool] = []

    def __call__(self, msg: RunCall, sink: Sink) -> None:
        self.ran.append(msg.call_id)
        self.sink_results.append(sink(CallEvent(attempt=msg.attempt, kind="started")))
        self.release.wait(10)
        for item in msg.input if isinstance(msg.input, list) else []:
            self.sink_results.append(sink(CallEvent(kind="output", output=item)))
        final = CallEvent(attempt=msg.attempt, kind="succeeded", output={"echo": msg.input})
        self.sink_results.append(sink(final))


@pytest.fixture
def echo() -> Echo:
    return Echo()


@pytest.fixture
def server(echo: Echo) -> Iterator[DataServer]:
    srv = DataServer(echo)
    srv.start()
    yield srv
    srv.stop()


def addr(srv: DataServer) -> str:
    return f"127.0.0.1:{srv.port}"


def test_a_call_runs_and_its_events_come_back_in_order(server: DataServer, echo: Echo) -> None:
    channel = DirectChannel()
    events = list(channel.run(addr(server), server.token, run_message("c1", [1, 2]), 10))
    assert [e.kind for e in events] == ["started", "output", "output", "succeeded"]
    assert [e.output for e in events[1:3]] == [1, 2]
    assert events[-1].output == {"echo": [1, 2]}
    assert echo.ran == ["c1"]
    channel.close()


def test_connections_are_reused_one_call_at_a_time(server: DataServer, echo: Echo) -> None:
    channel = DirectChannel()
    for i in range(5):
        list(channel.run(addr(server), server.token, run_message(f"c{i}"), 10))
    assert len(channel._idle[(addr(server), server.token)]) == 1
    assert echo.ran == [f"c{i}" for i in range(5)]
    channel.close()


def test_a_wrong_token_runs_nothing(server: DataServer, echo: Echo) -> None:
    channel = DirectChannel()
    with pytest.raises(DirectLostError):
        list(channel.run(addr(server), "not-the-token", run_message("c1"), 10))
    assert echo.ran == []


def test_a_stranger_without_hello_is_closed(server: DataServer, echo: Echo) -> None:
    sock = socket.create_connection(("127.0.0.1", server.port))
    conn = FrameSocket(sock)
    conn.send({"run": run_message("c1").model_dump(mode="json")})
    with pytest.raises(PeerClosedError):
        conn.recv()
    conn.close()
    assert echo.ran == []


def test_a_closed_port_is_unavailable_so_nothing_was_sent() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: refused
        with pytest.raises(DirectUnavailableError):
            list(DirectChannel().run(f"127.0.0.1:{port}", "t", run_message("c1"), 1))


def test_a_deadline_ends_the_wait_and_the_worker_falls_back(server: DataServer, echo: Echo) -> None:
    echo.release.clear()
    channel = DirectChannel()
    events = channel.run(addr(server), server.token, run_message("slow"), 0.3)
    with pytest.raises(DirectLostError):
        list(events)
    echo.release.set()
    deadline = time.monotonic() + 10
    while len(echo.sink_results) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    # The started event was written; the final one got no ack on the closed
    # connection, so the worker's manager posts it over HTTP instead (sink said False).
    assert echo.sink_results[0] is True
    assert echo.sink_results[-1] is False


class Followed:
    """What ``DirectChannel.stream`` handed over for one call, and on which threads."""

    def __init__(self) -> None:
        self.events: list[CallEvent] = []
        self.threads: set[str] = set()
        self.lost: list[DirectLostError] = []
        self.over = threading.Event()

    def on_event(self, event: CallEvent) -> None:
        self.events.append(event)
        self.threads.add(threading.current_thread().name)
        if event.kind == "succeeded":
            self.over.set()

    def on_lost(self, exc: DirectLostError) -> None:
        self.lost.append(exc)
        self.over.set()


def test_streams_are_read_on_one_thread_and_their_connections_reused(
    server: DataServer, echo: Echo
) -> None:
    channel = DirectChannel()
    followed = {f"c{i}": Followed() for i in range(8)}
    streams = [
        channel.stream(
            addr(server), server.token, run_message(c, list(range(50))), f.on_event, f.on_lost
        )
        for c, f in followed.items()
    ]
    for f in followed.values():
        assert f.over.wait(10)
    for stream in streams:
        stream.ack()  # the worker's sink learns the final was recorded
    for f in followed.values():
        assert f.lost == []
        assert [e.kind for e in f.events] == ["started", *["output"] * 50, "succeeded"]
        assert [e.output for e in f.events[1:-1]] == list(range(50))
    threads = set().union(*(f.threads for f in followed.values()))
    assert threads == {"thaw-direct-streams"}  # one thread read every stream
    deadline = time.monotonic() + 10
    while not all(echo.sink_results) or len(echo.sink_results) < 8 * 52:
        assert time.monotonic() < deadline, "a final event was not acknowledged"
        time.sleep(0.01)
    # Acknowledged, the connections serve the next calls.
    assert len(channel._idle[(addr(server), server.token)]) == 8
    events = list(channel.run(addr(server), server.token, run_message("next"), 10))
    assert events[-1].kind == "succeeded"
    assert len(channel._idle[(addr(server), server.token)]) == 8
    channel.close()


def test_a_stream_past_its_deadline_is_lost_once_and_the_worker_falls_back(
    server: DataServer, echo: Echo
) -> None:
    echo.release.clear()
    channel = DirectChannel()
    f = Followed()
    stream = channel.stream(addr(server), server.token, run_message("slow"), f.on_event, f.on_lost)
    time.sleep(0.2)
    stream.abandon()
    assert f.over.wait(10)
    stream.abandon()  # twice: still lost once
    echo.release.set()
    deadline = time.monotonic() + 10
    while len(echo.sink_results) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert [e.kind for e in f.events] == ["started"]
    assert len(f.lost) == 1 and "deadline" in str(f.lost[0])
    assert echo.sink_results[0] is True and echo.sink_results[-1] is False  # over HTTP
    channel.close()


def test_a_stream_whose_connection_breaks_is_lost_and_the_others_go_on(
    server: DataServer, echo: Echo
) -> None:
    echo.release.clear()
    channel = DirectChannel()
    try:
        lost, kept = Followed(), Followed()
        broken = channel.stream(
            addr(server), server.token, run_message("a", [1]), lost.on_event, lost.on_lost
        )
        stream = channel.stream(
            addr(server), server.token, run_message("b", [1]), kept.on_event, kept.on_lost
        )
        time.sleep(0.2)
        broken.conn.sock.shutdown(socket.SHUT_RDWR)  # as a worker that went away
        assert lost.over.wait(10) and len(lost.lost) == 1
        echo.release.set()
        assert kept.over.wait(10) and kept.lost == []
        stream.ack()
        assert [e.kind for e in kept.events] == ["started", "output", "succeeded"]
        assert [e.kind for e in lost.events] == ["started"]
    finally:
        echo.release.set()
        channel.close()


def test_streams_followed_when_the_channel_closes_are_lost(server: DataServer, echo: Echo) -> None:
    echo.release.clear()
    channel = DirectChannel()
    f = Followed()
    channel.stream(addr(server), server.token, run_message("c1"), f.on_event, f.on_lost)
    time.sleep(0.1)
    channel.close()
    assert f.over.wait(10) and len(f.lost) == 1
    echo.release.set()


def test_a_worker_restart_between_calls_redials(echo: Echo) -> None:
    first = DataServer(echo)
    first.start()
    port = first.port
    channel = DirectChannel()
    list(channel.run(addr(first), first.token, run_message("before"), 10))
    first.stop()
    second = DataServer(echo, port=port)  # the same address, a new token
    second.start()
    try:
        events = list(channel.run(addr(second), second.token, run_message("after"), 10))
        assert events[-1].kind == "succeeded"
        assert echo.ran == ["before", "after"]
    finally:
        second.stop()
        channel.close()


# --- ReplicaManager.run_direct: the sink first, HTTP where it fails -----------------


class NoProcesses(Runtime):
    """A runtime never asked to start anything: the manager has no replica."""

    def start(self, spec: ReplicaSpec, on_exit: OnExit) -> ReplicaHandle:
        raise AssertionError("no replica is started in these tests")

    def close(self) -> None:
        pass


@pytest.mark.parametrize("sink_ok", [True, False])
def test_run_direct_posts_over_http_only_what_the_sink_could_not_deliver(
    sink_ok: bool,
) -> None:
    recorder = Recorder()
    manager = ReplicaManager(NoProcesses(), recorder.client(), None)
    delivered: list[CallEvent] = []

    def sink(event: CallEvent) -> bool:
        delivered.append(event)
        return sink_ok

    # No replica r1 on this worker: the call ends failed at once, through the sink.
    manager.run_direct(run_message("c1"), sink)
    assert [e.kind for e in delivered] == ["failed"]
    posted = recorder.events("/v1/calls/c1")
    assert [p["kind"] for p in posted] == ([] if sink_ok else ["failed"])
    manager.run_call(run_message("c2"))  # a queued call after it: HTTP, not the old sink
    assert [p["kind"] for p in recorder.events("/v1/calls/c2")] == ["failed"]
    assert len(delivered) == 1


def test_a_cancel_reaches_the_worker_at_once_and_the_connection_serves_on(echo: Echo) -> None:
    cancelled: list[list[str]] = []
    got = threading.Event()

    def cancel(call_ids: list[str]) -> None:
        cancelled.append(call_ids)
        got.set()

    srv = DataServer(echo, cancel=cancel)
    srv.start()
    channel = DirectChannel()
    addr = f"127.0.0.1:{srv.port}"
    try:
        channel.cancel(addr, srv.token, "c9")
        assert got.wait(5) and cancelled == [["c9"]]
        # The same (pooled) connection then runs a call as before.
        events = list(channel.run(addr, srv.token, run_message("c1", ["a"]), 5))
        assert [e.kind for e in events] == ["started", "output", "succeeded"]
    finally:
        channel.close()
        srv.stop()
    with pytest.raises(DirectUnavailableError):
        channel.cancel(addr, srv.token, "c9")  # the port is closed now
