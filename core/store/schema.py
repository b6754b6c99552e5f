"""Bringing a database to the newest schema, paying for Alembic only when there is work to do.

Importing Alembic costs about a third of a second, more than all of the rest of start-up's
database work, and on every start but the first after an upgrade there is nothing to migrate. So
the revision stamped in the database is compared with `SCHEMA_HEAD` first, and Alembic is
imported only when they differ. tests/core/store/test_store.py keeps `SCHEMA_HEAD` equal to the
newest migration in core/store/migrations/versions.

Several workers may start at once on one PostgreSQL database: the upgrade then runs under a
transaction-level advisory lock, and the stamp is read again once it is held, so one worker
migrates and the others find the work done.
"""

from pathlib import Path

from sqlalchemy import Connection, Engine, inspect, text

from core.errors import StoreError

SCHEMA_HEAD = "0015"
MIGRATIONS = Path(__file__).parent / "migrations"
MIGRATION_LOCK = 0x4B41495741  # "KAIWA": one migration at a time per database


def ensure_schema(engine: Engine) -> None:
    """Create or upgrade the schema to `SCHEMA_HEAD` (a no-op when it is already there)."""
    with engine.begin() as connection:
        if stamped_revision(connection) == SCHEMA_HEAD:
            return
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
            if stamped_revision(connection) == SCHEMA_HEAD:  # another worker migrated meanwhile
                return
        _upgrade(connection)


def stamped_revision(connection: Connection) -> str | None:
    if not inspect(connection).has_table("alembic_version"):
        return None
    return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()


def _upgrade(connection: Connection) -> None:
    from alembic import command
    from alembic.config import Config
    from alembic.util.exc import CommandError

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    try:
        command.upgrade(config, "head")
    except CommandError as exc:
        raise StoreError(
            f"cannot migrate the database: {exc}; was it created by a newer Kaiwa?"
        ) from exc
