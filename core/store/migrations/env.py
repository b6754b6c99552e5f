"""Alembic environment: runs migrations on the connection the store hands over.

There is no alembic.ini: `core.store.schema` builds the configuration in code and passes its open
connection in `config.attributes["connection"]`, so migrations run inside the store's start-up.
"""

from alembic import context
from sqlmodel import SQLModel

import core.store.tables  # noqa: F401  (registers the tables on SQLModel.metadata)

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=SQLModel.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
