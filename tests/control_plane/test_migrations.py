"""Alembic migrations upgrade and downgrade cleanly on SQLite and PostgreSQL,
and the migrated schema matches the SQLAlchemy models."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from control_plane.db import migrate
from control_plane.db.models import Base


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(db_url: str) -> None:
    migrate.upgrade(db_url)
    assert set(Base.metadata.tables) <= _tables(db_url)
    migrate.downgrade(db_url, "base")
    assert _tables(db_url) <= {"alembic_version"}
    migrate.upgrade(db_url)
    migrate.upgrade(db_url)  # idempotent
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    finally:
        engine.dispose()
    assert diff == [], f"models and migrations differ; add a migration: {diff}"
