"""locks table: one row per named lock (reconcile)

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    locks = op.create_table(
        "locks",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.bulk_insert(locks, [{"name": "reconcile"}])


def downgrade() -> None:
    op.drop_table("locks")
