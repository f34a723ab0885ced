"""direct calls: workers.data_addr and workers.data_token (the worker's direct call port)

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("data_addr", sa.String(length=300), nullable=True))
        batch.add_column(sa.Column("data_token", sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("data_token")
        batch.drop_column("data_addr")
