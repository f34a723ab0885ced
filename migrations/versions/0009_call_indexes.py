"""call indexes: (replica_id, status), (function, status), (function, accepted_at),
(function, finished_at), so routing, scaling and idle checks read only the calls
they count instead of every call of the replica or the function

Revision ID: 0009
Revises: 0008
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

INDEXES = {
    "ix_calls_replica_status": ["replica_id", "status"],
    "ix_calls_function_status": ["function", "status"],
    "ix_calls_function_accepted": ["function", "accepted_at"],
    "ix_calls_function_finished": ["function", "finished_at"],
}


def upgrade() -> None:
    for name, columns in INDEXES.items():
        op.create_index(name, "calls", columns)


def downgrade() -> None:
    for name in INDEXES:
        op.drop_index(name, table_name="calls")
