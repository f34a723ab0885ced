"""The processes of one ``thaw server --processes N``: finding and reaching each other.

They share a directory (``THAW_PEER_DIR``, made by ``thaw server`` and removed
when it stops). Each process binds two Unix sockets there, named by its pid:

- ``<pid>.wake`` (datagrams): the id of a call that changed; the process wakes
  whoever waits for that call (``notifier.PeerNotifier``). Without it, a caller
  held by one process would see a result recorded by another only at its next
  poll (``THAW_RESULT_POLL_INTERVAL_S``);
- ``<pid>.metrics`` (a stream): answered with the process's metrics, so
  whichever process a scrape reaches answers for all (``metrics.merged``).
- ``<pid>.revoke`` (datagrams): the id of an API key just revoked; the process
  forgets it had verified the key (``keys.PrincipalCache``), so a revoke takes
  effect on every process at once, not after ``THAW_AUTH_CACHE_TTL_S``.

A process that ended may leave its files behind; reaching one fails, and is
skipped: waiters poll the database anyway, and a scrape reports the others.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

# How long the list of peers is reused before the directory is read again (a
# process that starts is woken by the others within this).
LIST_TTL_S = 1.0
# How long a scrape waits for one peer's metrics.
METRICS_TIMEOUT_S = 2.0
# How often a socket's thread looks whether its socket was closed.
CLOSE_CHECK_S = 0.5


class Peers:
    """This process's place in the peer directory, and the other processes there."""

    def __init__(self, directory: Path, pid: int | None = None) -> None:
        self.dir = directory
        self._prefix = f"{directory}{os.sep}"  # paths are built per wake-up: no Path objects
        self.pid = os.getpid() if pid is None else pid
        self._others: list[int] = []
        self._listed_at = -LIST_TTL_S
        self._lock = threading.Lock()

    def path(self, kind: str, pid: int | None = None) -> str:
        return f"{self._prefix}{self.pid if pid is None else pid}.{kind}"

    def others(self) -> list[int]:
        """The pids of the other processes (read again after ``LIST_TTL_S``)."""
        now = time.monotonic()
        with self._lock:
            if now - self._listed_at >= LIST_TTL_S:
                names = os.listdir(self.dir)
                found = {int(n.split(".")[0]) for n in names if n.endswith(".wake")}
                self._others = sorted(found - {self.pid})
                self._listed_at = now
            return self._others

    def bind(self, kind: str, sock_type: int) -> socket.socket:
        """A socket of this process's, bound at ``path(kind)`` (a stale file replaced);
        its calls time out after ``CLOSE_CHECK_S``, so its thread sees it closed."""
        path = self.path(kind)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, sock_type)
        sock.bind(path)
        sock.settimeout(CLOSE_CHECK_S)
        return sock

    def unlink(self, kind: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(kind))


class Datagrams:
    """Short messages of one ``kind`` between the processes: ``send`` gives one to every
    other process; each one this process receives is passed to ``handle`` on a thread
    of its own. A message that cannot be sent (the peer ended, its buffer is full) is
    dropped: what each kind is for must hold without it (a poll, a TTL)."""

    def __init__(self, peers: Peers, kind: str, handle: Callable[[str], None]) -> None:
        self._peers = peers
        self._kind = kind
        self._handle = handle
        self._in = peers.bind(kind, socket.SOCK_DGRAM)
        self._out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._out.setblocking(False)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._receive, name=f"thaw-peer-{kind}", daemon=True)
        self._thread.start()

    def send(self, text: str) -> None:
        data = text.encode()
        for pid in self._peers.others():
            try:
                self._out.sendto(data, self._peers.path(self._kind, pid))
            except OSError as exc:  # gone, or not keeping up
                log.debug("no %s message to peer %d: %s", self._kind, pid, exc)

    def _receive(self) -> None:
        while not self._closed.is_set():
            try:
                data = self._in.recv(1024)
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            try:
                self._handle(data.decode())
            except Exception:  # one bad message must not end this thread
                log.exception("handling a %s message from a peer failed", self._kind)

    def close(self) -> None:
        self._closed.set()
        self._thread.join()
        self._in.close()
        self._out.close()
        self._peers.unlink(self._kind)


class MetricsServer:
    """Answers each connection on ``<pid>.metrics`` with ``exposition()``, then closes it."""

    def __init__(self, peers: Peers, exposition: Callable[[], bytes]) -> None:
        self._peers = peers
        self._exposition = exposition
        self._sock = peers.bind("metrics", socket.SOCK_STREAM)
        self._sock.listen(16)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="thaw-peer-metrics", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            with conn:
                conn.settimeout(METRICS_TIMEOUT_S)
                try:
                    conn.sendall(self._exposition())
                except OSError as exc:
                    log.debug("a peer's metrics request failed: %s", exc)

    def close(self) -> None:
        self._closed.set()
        self._thread.join()
        self._sock.close()
        self._peers.unlink("metrics")


def peer_expositions(peers: Peers) -> list[bytes]:
    """The metrics of every other process that answers (one that does not is left out)."""
    found = []
    for pid in peers.others():
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(METRICS_TIMEOUT_S)
                sock.connect(peers.path("metrics", pid))
                chunks = []
                while chunk := sock.recv(1 << 16):
                    chunks.append(chunk)
            found.append(b"".join(chunks))
        except OSError as exc:
            log.debug("no metrics from peer %d: %s", pid, exc)
    return found
