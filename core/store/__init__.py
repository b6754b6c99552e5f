"""Persistence for conversations, messages, turns, inbound events, sub-agent runs and tasks.

The package owns Kaiwa's database: its schema, the threads every call runs on, and one `Store`
that every caller holds (opened once by the bot, passed to whatever needs it). That is why this
`__init__` re-exports the public names of its modules, the one package in Kaiwa whose `__init__`
does: callers import `Store` and its records from `core.store` and never learn how it is split.

Its modules, and why each stands alone:
- `store.py`: `Store`, nothing but the kinds' classes combined.
- `base.py`: `StoreBase`, the engine, the database threads and `_call`, the one way to the
  database; `not_awaited` for calls nobody waits on.
- `engine.py`: opening the database (`StoreSettings`, `BACKENDS`), once, at start-up.
- `units.py`: the unit shapes and statements every kind shares, and fitting values to columns;
  how every write stays true when its transaction is replayed after a lost COMMIT answer (each
  kind's module says how its own writes do).
- `rows/`: one module per kind of row, with its methods, its statements and its records
  (`rows/turns.py` also says how a turn's common path runs and how its writes stay true under
  that replay).
- `dbthread.py`: the database thread (queueing, group commit, outages); `tables.py`: the
  SQLModel tables; `schema.py` and `migrations/`: creating and upgrading the schema;
  `history.py`: the model-facing history built from stored messages.

`core.store` imports nothing of Kaiwa's but `core.store.*`, `core.agent.messages`, `core.text`
and `core.errors`.
"""

from core.store.base import not_awaited
from core.store.engine import BACKENDS, StoreSettings
from core.store.rows.compactions import CompactionRecord
from core.store.rows.conversations import StoredConversation
from core.store.rows.inbox import Claim, Inbound
from core.store.rows.subagent_runs import RunStart
from core.store.rows.turns import (
    INSTRUCTION_AUTHOR,
    PENDING_DELIVERY,
    UNSURE_DELIVERY,
    StartedTurn,
    Summary,
    TurnMessage,
    TurnStart,
    TurnState,
    Unfinished,
)
from core.store.store import Store
from core.store.tables import attachments_of

__all__ = [
    "BACKENDS",
    "INSTRUCTION_AUTHOR",
    "PENDING_DELIVERY",
    "UNSURE_DELIVERY",
    "Claim",
    "CompactionRecord",
    "Inbound",
    "RunStart",
    "StartedTurn",
    "Store",
    "StoreSettings",
    "StoredConversation",
    "Summary",
    "TurnMessage",
    "TurnStart",
    "TurnState",
    "Unfinished",
    "attachments_of",
    "not_awaited",
]
