"""Real databases for the control-plane suite: a SQLite file, and a fresh PostgreSQL database.

PostgreSQL is the local server at 127.0.0.1:5432 (user postgres, trust auth);
each test session creates ``thaw_test_<random>`` and drops it afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, text

PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def pg_available() -> bool:
    try:
        engine = create_engine(PG_ADMIN_URL)
        with engine.connect() as c:
            c.execute(text("select 1"))
        engine.dispose()
        return True
    except Exception:
        return False


@contextmanager
def fresh_pg_database() -> Iterator[str]:
    """Create an empty database; yield its URL; drop it (and its connections) after."""
    name = f"thaw_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
