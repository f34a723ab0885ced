"""worker inventory (tier holdings, bandwidths, pool); replica requested/dispatched times

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.add_column(
            sa.Column("inventory_json", sa.Text(), nullable=False, server_default="{}")
        )
    with op.batch_alter_table("replicas") as batch:
        batch.add_column(sa.Column("requested_at", sa.Float(), nullable=True))
        batch.add_column(sa.Column("dispatched_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("replicas") as batch:
        batch.drop_column("dispatched_at")
        batch.drop_column("requested_at")
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("inventory_json")
