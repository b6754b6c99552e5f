"""`Store`: the one object every caller holds, made of one class per kind of row.

Each kind's methods live in that kind's module, beside its statements and records, and derive
from `StoreBase` (`core.store.base`), so they all queue their work through its `_call` on its
database threads. `Store` only combines them: it adds no method and no state of its own, so
whatever a caller reaches on it is defined, once, in the module of the rows it touches.
"""

from core.store.rows.approvals import ApprovalStore
from core.store.rows.archive import ArchiveStore
from core.store.rows.compactions import CompactionStore
from core.store.rows.conversations import ConversationStore
from core.store.rows.inbox import InboxStore
from core.store.rows.notes import NoteStore
from core.store.rows.plans import PlanStore
from core.store.rows.subagent_runs import SubagentRunStore
from core.store.rows.tasks import TaskStore
from core.store.rows.turns import TurnStore


class Store(
    InboxStore,
    ConversationStore,
    TurnStore,
    CompactionStore,
    SubagentRunStore,
    TaskStore,
    NoteStore,
    ApprovalStore,
    PlanStore,
    ArchiveStore,
):
    """Persistence for conversations, messages, turns, inbound events, sub-agent runs, tasks,
    notes, approvals and plans: open it with `Store.open`, close it with `close`."""
