"""The inbox keeps what a message came with besides text (`core.channel.Attachment`s, as JSON),
so a restart or another worker can fetch its voice note or document again and answer it.

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("inbound_events", sa.Column("attachments", sa.JSON(), nullable=True))


def downgrade() -> None:
    # Not in a batch, as 0011's: SQLite drops a column in place.
    op.drop_column("inbound_events", "attachments")
