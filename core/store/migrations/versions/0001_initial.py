"""Initial schema: conversations, messages, turns, inbound events.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _timestamp(name: str, *, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "conversations",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("place", sa.String(300), nullable=False),
        sa.Column("agent", sa.String(100), nullable=False),
        sa.Column("system_prompt", sa.Text(), nullable=False),
        _timestamp("created_at"),
        _timestamp("closed_at", nullable=True),
    )
    op.create_index("ix_conversations_place", "conversations", ["place"])
    op.create_table(
        "turns",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "conversation_id", sa.Integer(), sa.ForeignKey("conversations.id"), nullable=False
        ),
        sa.Column("provenance", sa.String(20), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("stop_reason", sa.String(40), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("model_calls", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("model_seconds", sa.Float(), nullable=False),
        _timestamp("started_at"),
        _timestamp("ended_at", nullable=True),
    )
    op.create_index("ix_turns_conversation_id", "turns", ["conversation_id"])
    op.create_table(
        "messages",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "conversation_id", sa.Integer(), sa.ForeignKey("conversations.id"), nullable=False
        ),
        sa.Column("turn_id", sa.Integer(), sa.ForeignKey("turns.id"), nullable=True),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("thinking", sa.Text(), nullable=False),
        sa.Column("tool_calls", sa.JSON(), nullable=True),
        sa.Column("tool_name", sa.String(100), nullable=True),
        sa.Column("tool_call_id", sa.String(40), nullable=True),
        sa.Column("tool_status", sa.String(30), nullable=True),
        sa.Column("author", sa.String(200), nullable=True),
        sa.Column("partial", sa.Boolean(), nullable=False),
        sa.Column("stopped", sa.Boolean(), nullable=False),
        _timestamp("created_at"),
        _timestamp("updated_at"),
    )
    op.create_index("ix_messages_conversation_id", "messages", ["conversation_id"])
    op.create_index("ix_messages_turn_id", "messages", ["turn_id"])
    op.create_table(
        "inbound_events",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("platform", sa.String(20), nullable=False),
        sa.Column("platform_message_id", sa.String(200), nullable=False),
        sa.Column("place", sa.String(300), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        _timestamp("received_at"),
        sa.UniqueConstraint("platform", "platform_message_id"),
    )


def downgrade() -> None:
    op.drop_table("inbound_events")
    op.drop_table("messages")
    op.drop_table("turns")
    op.drop_index("ix_conversations_place", "conversations")
    op.drop_table("conversations")
