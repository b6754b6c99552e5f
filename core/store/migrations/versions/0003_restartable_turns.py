"""Turns remember their attempt, the messages their reply posted, and what the platform shows.

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
    with op.batch_alter_table("turns") as table:
        table.add_column(sa.Column("attempt", sa.Integer(), nullable=False, server_default="1"))
        table.add_column(sa.Column("reply_ids", sa.JSON(), nullable=True))
        table.add_column(sa.Column("delivery", sa.String(20), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("turns") as table:
        table.drop_column("delivery")
        table.drop_column("reply_ids")
        table.drop_column("attempt")
