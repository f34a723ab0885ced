"""The processes of one server reaching each other (``control_plane.peers``): a change
wakes a peer's waiters, and a scrape gathers every peer's metrics. Each test plays
several processes with ``Peers`` of their own pids in one directory."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from control_plane.notifier import PeerNotifier
from control_plane.peers import Datagrams, MetricsServer, Peers, peer_expositions
from control_plane.services.keys import Principal, PrincipalCache
from tests.control_plane.unit.test_peer_metrics import process_metrics, series_values


def _peer_notifiers(tmp_path: Path) -> tuple[PeerNotifier, PeerNotifier]:
    # Two processes of one server, as two notifiers with their own pids in one directory.
    return PeerNotifier(Peers(tmp_path, pid=101)), PeerNotifier(Peers(tmp_path, pid=102))


def test_a_change_wakes_the_waiters_of_a_peer(tmp_path: Path) -> None:
    a, b = _peer_notifiers(tmp_path)
    try:
        got: list[int] = []
        waiting = threading.Thread(target=lambda: got.append(b.wait("c1", seen=0, timeout_s=60)))
        waiting.start()
        a.notify("c1")
        waiting.join(timeout=60)
        assert got == [1]
        assert a.wait("c1", seen=0, timeout_s=0) == 1  # and its own
        b.notify("c2")
        assert a.wait("c2", seen=0, timeout_s=60) == 1  # both ways
    finally:
        a.close()
        b.close()


def test_a_key_revoked_by_one_process_is_forgotten_by_the_others(tmp_path: Path) -> None:
    # Each process has its wake socket (how peers are found) and its revoke channel.
    caches = {pid: PrincipalCache(lambda: 1000.0, ttl_s=600) for pid in (101, 102)}
    wakes = [PeerNotifier(Peers(tmp_path, pid=pid)) for pid in caches]
    revokes = {
        pid: Datagrams(Peers(tmp_path, pid=pid), "revoke", c.drop) for pid, c in caches.items()
    }
    who = Principal("k1", frozenset({"invoke"}), None)
    try:
        for cache in caches.values():
            cache.put("thaw_k1_secret", who)
            cache.put("thaw_k2_secret", Principal("k2", frozenset({"invoke"}), None))
        caches[101].drop("k1")  # what the revoke route does, then tells the others
        revokes[101].send("k1")
        deadline = time.monotonic() + 30
        while caches[102].get("thaw_k1_secret") is not None:
            assert time.monotonic() < deadline, "process 102 still trusts the revoked key"
            time.sleep(0.01)
        assert caches[102].get("thaw_k2_secret") is not None  # only that key
    finally:
        for channel in revokes.values():
            channel.close()
        for wake in wakes:
            wake.close()


def test_a_peer_that_ended_is_skipped(tmp_path: Path) -> None:
    a, b = _peer_notifiers(tmp_path)
    b.close()
    (tmp_path / "103.wake").touch()  # a file left behind, nobody listening
    try:
        a.notify("c1")  # neither raises nor blocks
        assert a.wait("c1", seen=0, timeout_s=0) == 1
        assert sorted(os.listdir(tmp_path)) == ["101.wake", "103.wake"]  # b removed its own
    finally:
        a.close()
    assert sorted(os.listdir(tmp_path)) == ["103.wake"]


def test_a_scrape_reaches_every_peer_that_answers(tmp_path: Path) -> None:
    here = Peers(tmp_path, pid=101)
    (tmp_path / "101.wake").touch()
    servers = []
    for pid, calls in ((102, 3), (103, 4)):
        (tmp_path / f"{pid}.wake").touch()
        metrics = process_metrics(calls, queued=0)
        servers.append(MetricsServer(Peers(tmp_path, pid=pid), metrics.exposition))
    (tmp_path / "104.wake").touch()  # a process that ended: no metrics socket
    try:
        found = peer_expositions(here)
    finally:
        for server in servers:
            server.close()
    counts = sorted(
        v
        for text in found
        for (name, _), v in series_values(text).items()
        if name == "thaw_call_latency_seconds_count"
    )
    assert counts == [3, 4]
    assert not (tmp_path / "102.metrics").exists()  # closed: its socket file is gone
