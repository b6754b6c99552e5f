"""Turns say whether they were wrapped up; token counts may be unknown (NULL), not zero.

Revision ID: 0005
Revises: 0004
"""

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

COUNTS = ("prompt_tokens", "output_tokens")


def upgrade() -> None:
    with _foreign_keys_off():
        with op.batch_alter_table("turns") as table:
            table.add_column(
                sa.Column("wrapped_up", sa.Boolean(), nullable=False, server_default=sa.false())
            )
            for name in COUNTS:
                table.alter_column(name, existing_type=sa.Integer(), nullable=True)
        with op.batch_alter_table("compactions") as table:
            for name in COUNTS:
                table.alter_column(name, existing_type=sa.Integer(), nullable=True)


def downgrade() -> None:
    for name in ("compactions", "turns"):
        op.execute(f"UPDATE {name} SET prompt_tokens = 0 WHERE prompt_tokens IS NULL")
        op.execute(f"UPDATE {name} SET output_tokens = 0 WHERE output_tokens IS NULL")
    with _foreign_keys_off():
        with op.batch_alter_table("compactions") as table:
            for name in COUNTS:
                table.alter_column(name, existing_type=sa.Integer(), nullable=False)
        with op.batch_alter_table("turns") as table:
            for name in COUNTS:
                table.alter_column(name, existing_type=sa.Integer(), nullable=False)
            table.drop_column("wrapped_up")


@contextmanager
def _foreign_keys_off() -> Iterator[None]:
    """SQLite changes a column by copying its table, dropping the old one and renaming the copy,
    while rows of other tables point at it; with foreign keys enforced the drop fails. pysqlite
    runs this DDL outside a transaction, where the pragma takes effect; it is restored after."""
    sqlite = op.get_bind().dialect.name == "sqlite"
    if sqlite:
        op.execute("PRAGMA foreign_keys = OFF")
    try:
        yield
    finally:
        if sqlite:
            op.execute("PRAGMA foreign_keys = ON")
