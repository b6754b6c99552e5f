"""Tools a person allowed for the rest of a conversation are kept with it, across restarts.

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
    op.create_table(
        "tool_grants",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "conversation_id", sa.Integer(), sa.ForeignKey("conversations.id"), nullable=False
        ),
        sa.Column("tool", sa.String(200), nullable=False),
        sa.Column("granted_by", sa.String(200), nullable=False),
        sa.Column("approval_id", sa.Integer(), sa.ForeignKey("approvals.id"), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("conversation_id", "tool"),
    )
    op.create_index("ix_tool_grants_conversation_id", "tool_grants", ["conversation_id"])


def downgrade() -> None:
    op.drop_index("ix_tool_grants_conversation_id", table_name="tool_grants")
    op.drop_table("tool_grants")
