"""call usage: an LLM call's prompt and completion tokens as its replica counted
them (protocol v1.9 ``CallEvent.usage``), as JSON; NULL for a call that counted none

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.add_column(sa.Column("usage_json", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("calls") as batch:
        batch.drop_column("usage_json")
