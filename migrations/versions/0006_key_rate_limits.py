"""per-key rate limits on invokes (api_keys.rate_per_s, rate_burst)

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("rate_per_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("rate_burst", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("rate_burst")
        batch.drop_column("rate_per_s")
