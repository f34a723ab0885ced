"""Alembic environment: the URL comes from Settings, never from alembic.ini.

A caller that already holds the URL (``control_plane.db.migrate``) passes it
as ``config.attributes["url"]``; the ``alembic`` command line reads
``Settings()`` (THAW_DATABASE_URL).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from control_plane.db.models import Base
from control_plane.db.session import make_engine
from control_plane.settings import Settings

target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    url = context.config.attributes.get("url") or Settings().database_url_resolved()
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            _run(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported; run them online")
run_migrations_online()
