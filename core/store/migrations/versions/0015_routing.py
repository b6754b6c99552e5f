"""Sub-agent runs keep the tier routing chose and why, and turns the model they ran on, so a
transcript read later says which model did the work and `/usage` can split a conversation's
tokens by model. Rows written before stay NULL: no model recorded, no route.

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("subagent_runs", sa.Column("tier", sa.String(20), nullable=True))
    op.add_column("subagent_runs", sa.Column("route", sa.String(300), nullable=True))
    op.add_column("turns", sa.Column("model", sa.String(200), nullable=True))


def downgrade() -> None:
    # Not in a batch, as 0013's: SQLite drops a column in place.
    op.drop_column("turns", "model")
    op.drop_column("subagent_runs", "route")
    op.drop_column("subagent_runs", "tier")
