"""canaries: a function's canary version and its share of calls

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "canaries",
        sa.Column("function_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("weight_pct", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["function_id"], ["functions.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("function_id"),
    )


def downgrade() -> None:
    op.drop_table("canaries")
