"""Engines and sessions.

SQLite (the embedded default) is opened in WAL mode with a busy timeout, so
the server's request threads, its background loop and a CLI can share one
file, and its writers take turns on a lock of the machine's
(``db.sqlite_writers``); PostgreSQL needs nothing special. Callers own the
session's lifetime: ``with database.session() as s: ...`` commits on success,
rolls back on error.

The hot path runs its Core statements on ``session.connection()``: through
``session.execute`` each would also pass the ORM's execution layer (events,
autoflush, compile state), about twice the cost of the statement itself.
Nothing of the session's is pending there, so nothing needs flushing first.
Its ``IN`` lists are ``one_of``, for the same reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import ColumnElement, Engine, create_engine, event, literal
from sqlalchemy.engine import make_url
from sqlalchemy.orm import QueryableAttribute, Session, sessionmaker

from control_plane.db.sqlite_writers import TurnTakingConnection, take_turns

SQLITE_BUSY_TIMEOUT_MS = 30_000


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite gets WAL, a busy timeout and its folder created."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, pool_size=20, max_overflow=20)
    connect_args: dict[str, Any] = {
        "check_same_thread": False,
        "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000,
    }
    if not parsed.database or parsed.database == ":memory:":
        engine = create_engine(url, connect_args=connect_args)
    else:
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        connect_args["factory"] = TurnTakingConnection
        # As many kept connections as request threads commonly run at once: an
        # overflow connection is opened (four PRAGMAs) and closed per use.
        engine = create_engine(url, connect_args=connect_args, pool_size=20, max_overflow=20)
        take_turns(engine, parsed.database)
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def one_of(
    column: ColumnElement[Any] | QueryableAttribute[Any], values: Iterable[str]
) -> ColumnElement[bool]:
    """``column IN (values)`` for values fixed in the code, one bound parameter each.
    ``in_`` of a plain list binds a single "expanding" parameter instead, which
    SQLAlchemy writes into the SQL anew at every execution: about as long again
    as running a one-row statement."""
    return column.in_([literal(v) for v in values])


def hold(session: Session, rows: Iterable[object]) -> None:
    """Keep ``rows`` in ``session``'s identity map for its lifetime.

    The identity map holds rows weakly: a row read by one step and dropped is
    read again by the next step's ``session.get``. A step that hands only ids
    or views on (``calls.get_row``) holds its rows instead.
    """
    held: list[object] = session.info.setdefault("held_rows", [])
    held.extend(rows)


class Database:
    """One engine and its session factory."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self._factory = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self._factory() as s:
            try:
                yield s
                s.commit()
            except BaseException:
                s.rollback()
                raise

    def dispose(self) -> None:
        self.engine.dispose()
