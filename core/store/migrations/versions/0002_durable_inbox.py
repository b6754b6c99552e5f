"""The inbox keeps the person's text; messages get their place in the turn; turns their event.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("inbound_events") as table:
        table.add_column(sa.Column("text", sa.Text(), nullable=True))
        table.add_column(sa.Column("author", sa.String(200), nullable=True))
        table.add_column(sa.Column("claim", sa.String(32), nullable=True))
    with op.batch_alter_table("messages") as table:
        table.add_column(sa.Column("seq", sa.Integer(), nullable=True))
        table.create_index("ux_messages_turn_seq", ["turn_id", "seq"], unique=True)
    with op.batch_alter_table("turns") as table:
        table.add_column(sa.Column("inbound_event_id", sa.Integer(), nullable=True))
        table.create_foreign_key(
            "fk_turns_inbound_event_id", "inbound_events", ["inbound_event_id"], ["id"]
        )
        table.create_index("ix_turns_inbound_event_id", ["inbound_event_id"])


def downgrade() -> None:
    with op.batch_alter_table("turns") as table:
        table.drop_index("ix_turns_inbound_event_id")
        table.drop_constraint("fk_turns_inbound_event_id", type_="foreignkey")
        table.drop_column("inbound_event_id")
    with op.batch_alter_table("messages") as table:
        table.drop_index("ux_messages_turn_seq")
        table.drop_column("seq")
    with op.batch_alter_table("inbound_events") as table:
        table.drop_column("claim")
        table.drop_column("author")
        table.drop_column("text")
