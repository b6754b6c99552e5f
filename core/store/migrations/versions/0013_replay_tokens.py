"""Rows carry the token of the write that made them, so a write replayed after its COMMIT answer
was lost finds its own row instead of writing a second one.

A single-row insert is recognised by its token, so those tables get a unique index on it (rows
written before this migration keep NULL, which a unique index allows many of). Task runs and
sub-agent runs are found by their slot and conversation, and many runs share a token, so theirs
is a plain column.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

FOUND_BY_TOKEN = (
    "conversations",
    "turns",
    "compactions",
    "notes",
    "approvals",
    "plans",
    "scheduled_tasks",
)
FOUND_OTHERWISE = ("task_runs", "subagent_runs")


def upgrade() -> None:
    for table in (*FOUND_BY_TOKEN, *FOUND_OTHERWISE):
        op.add_column(table, sa.Column("token", sa.String(32), nullable=True))
    for table in FOUND_BY_TOKEN:
        op.create_index(f"ux_{table}_token", table, ["token"], unique=True)


def downgrade() -> None:
    for table in FOUND_BY_TOKEN:
        op.drop_index(f"ux_{table}_token", table_name=table)
    # Not in a batch: SQLite drops a column in place (3.35 on), where a batch would copy the
    # table while other rows point at its rows, which foreign keys refuse.
    for table in (*FOUND_BY_TOKEN, *FOUND_OTHERWISE):
        op.drop_column(table, "token")
