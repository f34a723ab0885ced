"""Reaching the database at start: a database that does not exist, a server that
refuses connections or a refused login is one line naming the URL (password
masked) and the fix, raised as ``DatabaseUnreachableError``, never a traceback.
"""

from __future__ import annotations

import re

from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from control_plane.db.session import make_engine

_MISSING_DATABASE = re.compile(r'database "([^"]+)" does not exist')


class DatabaseUnreachableError(Exception):
    """The database at a URL cannot be used; the message says why and what to do."""


def check_reachable(url: str) -> None:
    """Open and close one connection to ``url``; raises ``DatabaseUnreachableError``."""
    engine = make_engine(url)  # as the server opens it (SQLite: its folder made)
    try:
        with engine.connect():
            pass
    except OperationalError as exc:
        raise DatabaseUnreachableError(describe_failure(url, str(exc.orig))) from None
    finally:
        engine.dispose()


def describe_failure(url: str, reason: str) -> str:
    """One line for a failed connection to ``url``: what was wrong, and the fix."""
    parsed = make_url(url)
    shown = parsed.render_as_string(hide_password=True)
    missing = _MISSING_DATABASE.search(reason)
    if missing:
        name = missing.group(1)
        where = f"-h {parsed.host or 'localhost'} -p {parsed.port or 5432}"
        user = f" -U {parsed.username}" if parsed.username else ""
        return (
            f"database {name!r} does not exist on the server of {shown}; create it with "
            f'`createdb {where}{user} {name}` (or CREATE DATABASE "{name}";) and start again'
        )
    if "Connection refused" in reason:
        return (
            f"cannot connect to the database at {shown}: the server refuses connections; "
            "start it, or set THAW_DATABASE_URL to one that is running"
        )
    first = next((line.strip() for line in reason.splitlines() if line.strip()), "unknown error")
    return f"cannot connect to the database at {shown}: {first}; check THAW_DATABASE_URL"
