"""The inbox keeps the platform's id of the person, so any worker can answer the message.

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
    op.add_column("inbound_events", sa.Column("author_id", sa.String(200), nullable=True))


def downgrade() -> None:
    # Not in a batch: SQLite drops a column in place (3.35 on), where a batch would copy the
    # table while turns point at its rows, which foreign keys refuse.
    op.drop_column("inbound_events", "author_id")
