"""A COMMIT that lands and whose answer is then lost: the one moment a write must survive running
twice.

When the connection dies after the server committed but before its answer came back, the
database thread cannot tell whether the transaction happened, so it runs the same group again
(`core.store.dbthread`). To make that moment on purpose, `commit_answer_lost` listens to
SQLAlchemy's `commit` event (our ORM's own hook, on every engine of the process, not a client
library's internals): the next COMMIT is sent to the database for real, on the driver's
connection, and is then reported as a lost connection, the way SQLAlchemy reports a server that
hung up (a `DBAPIError` marked `connection_invalidated`). The thread then reconnects and runs the
group again, and the second COMMIT goes through untouched. A store's single-statement call that
runs without a transaction (PostgreSQL's autocommit) commits the same way and is replayed alike.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, event
from sqlalchemy.exc import OperationalError


@dataclass
class LostCommit:
    happened: bool = False
    """Whether a COMMIT went through with its answer lost (so its group was run again)."""


@contextmanager
def commit_answer_lost(when: Callable[[], bool] = lambda: True) -> Iterator[LostCommit]:
    """Within the block, the first COMMIT any engine makes (once `when()` holds) lands and is
    then reported lost."""
    lost = LostCommit()

    def commit(connection: Connection) -> None:
        if lost.happened or not when():
            return
        lost.happened = True
        driver = connection.connection.dbapi_connection
        assert driver is not None
        driver.commit()
        cause = connection.dialect.loaded_dbapi.OperationalError(
            "the connection was lost before the COMMIT's answer came back"
        )
        raise OperationalError("COMMIT", None, cause, connection_invalidated=True)

    event.listen(Engine, "commit", commit)
    try:
        yield lost
    finally:
        event.remove(Engine, "commit", commit)
