"""`Store`: the one object every caller holds, made of one class per kind of row.

Each kind's methods live in that kind's module, beside its statements and records, and derive
from `StoreBase` (`core.store.base`), so they all queue their work through its `_call` on its
database threads. `Store` only combines them: it adds no method and no state of its own, so
whatever a caller reaches on it is defined, once, in the module of the rows it touches.
"""

from core.store.approvals import ApprovalStore
from core.store.archive import ArchiveStore
from core.store.compactions import CompactionStore
from core.store.conversations import ConversationStore
from core.store.inbox import InboxStore
from core.store.notes import NoteStore
from core.store.plans import PlanStore
from core.store.subagent_runs import SubagentRunStore
from core.store.tasks import TaskStore
from core.store.turns import TurnStore


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
