"""Sub-agent runs and their transcripts.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "subagent_runs",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "conversation_id", sa.Integer(), sa.ForeignKey("conversations.id"), nullable=False
        ),
        sa.Column("parent_turn_id", sa.Integer(), sa.ForeignKey("turns.id"), nullable=True),
        sa.Column("parent_run_id", sa.Integer(), sa.ForeignKey("subagent_runs.id"), nullable=True),
        sa.Column("key", sa.String(20), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("profile", sa.String(100), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("task", sa.Text(), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("report", sa.Text(), nullable=True),
        sa.Column("delivery", sa.String(20), nullable=False),
        sa.Column("unread", sa.Integer(), nullable=False),
        sa.Column("model_calls", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("output_tokens", sa.Integer(), nullable=True),
        sa.Column("model_seconds", sa.Float(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("conversation_id", "key"),
    )
    op.create_index("ix_subagent_runs_conversation_id", "subagent_runs", ["conversation_id"])
    op.create_table(
        "subagent_messages",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("subagent_runs.id"), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("tool_name", sa.String(100), nullable=True),
        sa.Column("tool_calls", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_subagent_messages_run_id", "subagent_messages", ["run_id"])
    op.create_index(
        "ux_subagent_messages_run_seq", "subagent_messages", ["run_id", "seq"], unique=True
    )


def downgrade() -> None:
    op.drop_table("subagent_messages")
    op.drop_table("subagent_runs")
