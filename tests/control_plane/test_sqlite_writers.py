"""SQLite writers take turns on the machine's lock (``db.sqlite_writers``): held from a
transaction's first write to its end, and by nothing that only reads."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from control_plane.db.session import make_engine


@pytest.fixture
def db(tmp_path: Path) -> Iterator[tuple[Engine, Path]]:
    path = tmp_path / "t.db"
    engine = make_engine(f"sqlite:///{path}")
    with engine.begin() as c:
        c.execute(text("CREATE TABLE t (x INTEGER)"))
    yield engine, Path(f"{path}-writer.lock")
    engine.dispose()


def held(lock_file: Path) -> bool:
    """Whether some writer holds the lock (tried from a file of our own, as another
    process would)."""
    fd = os.open(lock_file, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_held_from_the_first_write_to_the_end_of_the_transaction(
    db: tuple[Engine, Path],
) -> None:
    engine, lock_file = db
    for end in ("commit", "rollback", "close"):
        conn = engine.raw_connection()
        cur = conn.cursor()
        cur.execute("SELECT count(*) FROM t")
        assert not held(lock_file), end  # reading takes nothing
        cur.execute("INSERT INTO t VALUES (1)")
        assert held(lock_file), end
        getattr(conn, end)()
        assert not held(lock_file), end
        if end != "close":
            conn.close()


def test_a_failed_write_holds_it_until_rolled_back(db: tuple[Engine, Path]) -> None:
    engine, lock_file = db
    with engine.connect() as c:
        c.execute(text("INSERT INTO t VALUES (1)"))
        with pytest.raises(Exception, match="no such table"):
            c.execute(text("INSERT INTO missing VALUES (1)"))
        assert held(lock_file)
    assert not held(lock_file)  # the pool's rollback on return gave it back


def test_a_writer_of_another_engine_waits_then_writes(db: tuple[Engine, Path]) -> None:
    engine, lock_file = db
    other = make_engine(str(engine.url))  # as another process: its own lock file handle
    try:
        first = engine.connect()
        first.execute(text("INSERT INTO t VALUES (1)"))
        done = threading.Event()

        def write() -> None:
            with other.begin() as c:
                c.execute(text("INSERT INTO t VALUES (2)"))
            done.set()

        writer = threading.Thread(target=write)
        writer.start()
        assert not done.wait(0.3)  # waiting for the first
        assert held(lock_file)
        first.commit()
        first.close()
        assert done.wait(10)
        writer.join()
        with engine.connect() as c:
            assert sorted(c.execute(text("SELECT x FROM t")).scalars()) == [1, 2]
    finally:
        other.dispose()


def test_a_thread_writing_through_a_second_connection_gets_sqlites_answer(
    db: tuple[Engine, Path],
) -> None:
    engine, _ = db
    first = engine.raw_connection()
    second = engine.raw_connection()
    try:
        first.cursor().execute("INSERT INTO t VALUES (1)")
        second.cursor().execute("PRAGMA busy_timeout = 50")
        with pytest.raises(sqlite3.OperationalError, match="locked"):  # no hang
            second.cursor().execute("INSERT INTO t VALUES (2)")
    finally:
        second.close()
        first.close()
