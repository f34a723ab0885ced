"""Run the Alembic migrations in ``migrations/`` against a URL, from code."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from control_plane.db.reach import check_reachable

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision`` (idempotent). Raises
    ``DatabaseUnreachableError`` (one line, with the fix) when it cannot connect."""
    check_reachable(url)
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)
