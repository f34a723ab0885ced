"""routing: calls.session_id (session affinity), functions.scale_history_json
(the autoscaler's stabilization window)

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.add_column(sa.Column("session_id", sa.String(length=200), nullable=True))
        batch.create_index(batch.f("ix_calls_session_id"), ["session_id"], unique=False)
    with op.batch_alter_table("functions") as batch:
        batch.add_column(
            sa.Column("scale_history_json", sa.Text(), nullable=False, server_default="{}")
        )


def downgrade() -> None:
    with op.batch_alter_table("functions") as batch:
        batch.drop_column("scale_history_json")
    with op.batch_alter_table("calls") as batch:
        batch.drop_index(batch.f("ix_calls_session_id"))
        batch.drop_column("session_id")
