"""SQLite writers take turns on a lock of the machine's, not on SQLite's busy handler.

SQLite lets one connection write at a time. A connection that finds the
database locked retries in its busy handler, which sleeps 1, 2, 5, 10 ms and
more between tries, while the writer ahead of it is done in a tenth of a
millisecond. With one server process, its hot path takes turns on a lock of
its own (``services.direct_runner``); with several (``thaw server
--processes``), about every second call slept there.

So a connection to a SQLite file takes a ``WriterLock`` at its first write
statement and gives it back when the transaction ends (commit, rollback,
close): threads queue on a thread lock, processes on ``flock``, and a
waiter is woken as soon as the writer ahead is done. Every engine
``session.make_engine`` makes for a file does this.

A thread that already holds the lock through one connection and writes
through another passes: SQLite's own lock then makes it wait, and fail after
its busy timeout, as without this lock (the lock adds no deadlock of its own).
"""

from __future__ import annotations

import fcntl
import os
import re
import sqlite3
import threading
import weakref
from pathlib import Path
from typing import Any, Self

from sqlalchemy import Engine, event

# What makes SQLite take its write lock (pysqlite begins a transaction before DML).
_WRITE = re.compile(r"\s*(INSERT|UPDATE|DELETE|REPLACE|CREATE|DROP|ALTER)\b", re.IGNORECASE)


class WriterLock:
    """One engine's: its threads take turns on a thread lock, and hold ``flock`` on
    ``path`` against every other engine on that file, in this process or another."""

    def __init__(self, path: Path) -> None:
        self._threads = threading.Lock()
        self._owner: int | None = None
        self._depth = 0
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    def acquire(self) -> None:
        me = threading.get_ident()
        if self._owner == me:  # a second connection of the same thread: SQLite decides
            self._depth += 1
            return
        self._threads.acquire()
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise
        self._owner, self._depth = me, 1

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            self._threads.release()

    def close(self) -> None:
        os.close(self._fd)


class _Cursor(sqlite3.Cursor):
    def execute(self, sql: str, parameters: Any = (), /) -> Self:
        self.connection._before(sql)  # type: ignore[attr-defined]
        return super().execute(sql, parameters)

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> Self:
        self.connection._before(sql)  # type: ignore[attr-defined]
        return super().executemany(sql, seq_of_parameters)


class TurnTakingConnection(sqlite3.Connection):
    """A pysqlite connection that holds ``writer_lock`` (when set) from its first write
    statement to the end of that transaction."""

    writer_lock: WriterLock | None = None
    _holding = False

    def _before(self, sql: str) -> None:
        if not self._holding and self.writer_lock is not None and _WRITE.match(sql):
            self.writer_lock.acquire()
            self._holding = True

    def _ended(self) -> None:
        if self._holding:
            self._holding = False
            assert self.writer_lock is not None
            self.writer_lock.release()

    def cursor(self, factory: Any = _Cursor) -> Any:  # Connection.execute uses it too
        return super().cursor(factory)

    def commit(self) -> None:
        try:
            super().commit()
        finally:
            self._ended()

    def rollback(self) -> None:
        try:
            super().rollback()
        finally:
            self._ended()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._ended()


def take_turns(engine: Engine, database: str) -> None:
    """Make ``engine``'s connections (``TurnTakingConnection``, its ``connect_args``
    factory) take turns on a ``WriterLock`` beside ``database``."""
    lock = WriterLock(Path(f"{database}-writer.lock"))
    weakref.finalize(engine, lock.close)

    @event.listens_for(engine, "connect")
    def _give_lock(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.writer_lock = lock
