"""function version loads_adapters: whether the entry class defines load_adapter
(seen by the deploy check), so a call naming an adapter the spec does not list is
refused (400) by a class that cannot load one; NULL for versions deployed before

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("function_versions") as batch:
        batch.add_column(sa.Column("loads_adapters", sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("function_versions") as batch:
        batch.drop_column("loads_adapters")
