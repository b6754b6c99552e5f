"""The SQLModel tables. Their shape changes only together with a migration in core/store/migrations.

Times are stored as timezone-aware UTC. Tool calls are JSON so one message row can carry a whole
batch in the order the model asked. A turn's `error` is for people and logs only: the history sent
to the model is built from messages (`core.store.history`), never from turns' texts, so an error
text can't leak into context.

A message's `seq` is its place within its turn (the person's message is 0): the key a reply is
saved under again and again as it streams, so saving is an idempotent upsert that a replayed
transaction cannot double. An inbound event keeps the person's text, so a message is recorded
before its platform is told it arrived; its `claim` marks which attempt recorded it. Other rows
carry a `token`, the mark of the write that made them (made before its transaction was queued),
so a write replayed after its COMMIT answer was lost finds its own row.
"""

from dataclasses import fields
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Column, DateTime, Index, Text, UniqueConstraint
from sqlmodel import Field, SQLModel

from core.channel import Attachment, AttachmentKind


def utc_now() -> datetime:
    return datetime.now(UTC)


def _token_index(table: str) -> Index:
    """The unique index a row's `token` is found by when its insert is replayed."""
    return Index(f"ux_{table}_token", "token", unique=True)


class Conversation(SQLModel, table=True):
    __tablename__ = "conversations"
    __table_args__ = (_token_index("conversations"),)

    id: int | None = Field(default=None, primary_key=True)
    place: str = Field(index=True, max_length=300)
    agent: str = Field(max_length=100)
    system_prompt: str = Field(sa_column=Column(Text, nullable=False))
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    closed_at: datetime | None = Field(
        default=None, sa_column=Column(DateTime(timezone=True), nullable=True)
    )
    token: str | None = Field(default=None, max_length=32)
    """The write that made the row, so a replay of it finds the row (`core.store.units`)."""


class Message(SQLModel, table=True):
    __tablename__ = "messages"
    __table_args__ = (Index("ux_messages_turn_seq", "turn_id", "seq", unique=True),)

    id: int | None = Field(default=None, primary_key=True)
    conversation_id: int = Field(foreign_key="conversations.id", index=True)
    turn_id: int | None = Field(default=None, foreign_key="turns.id", index=True)
    seq: int | None = None
    role: str = Field(max_length=20)
    text: str = Field(default="", sa_column=Column(Text, nullable=False, default=""))
    thinking: str = Field(default="", sa_column=Column(Text, nullable=False, default=""))
    tool_calls: list[dict[str, Any]] | None = Field(default=None, sa_column=Column(JSON))
    tool_name: str | None = Field(default=None, max_length=100)
    tool_call_id: str | None = Field(default=None, max_length=40)
    tool_status: str | None = Field(default=None, max_length=30)
    author: str | None = Field(default=None, max_length=200)
    partial: bool = False
    stopped: bool = False
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    updated_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


class Turn(SQLModel, table=True):
    __tablename__ = "turns"
    __table_args__ = (_token_index("turns"),)

    id: int | None = Field(default=None, primary_key=True)
    conversation_id: int = Field(foreign_key="conversations.id", index=True)
    inbound_event_id: int | None = Field(default=None, foreign_key="inbound_events.id", index=True)
    provenance: str = Field(max_length=20)
    attempt: int = 1
    """1, or 2 for the one run again after a restart interrupted it before it showed anything."""
    model: str | None = Field(default=None, max_length=200)
    """The agent's model, which its usage is counted under (None for turns before 0015)."""
    status: str = Field(max_length=20)
    stop_reason: str | None = Field(default=None, max_length=40)
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    model_calls: int = 0
    prompt_tokens: int | None = 0
    """None when a call's counts are unknown (one was cut short); so is `output_tokens`."""
    output_tokens: int | None = 0
    model_seconds: float = 0.0
    wrapped_up: bool = False
    """The model ran out of calls with tools pending and answered in one more call without."""
    reply_ids: list[str] | None = Field(default=None, sa_column=Column(JSON))
    """The platform's ids of the messages the reply posted, so a restart can find them."""
    delivery: str | None = Field(default=None, max_length=20)
    """What the platform shows of the finished reply (`core.channel.Delivery`)."""
    started_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    ended_at: datetime | None = Field(
        default=None, sa_column=Column(DateTime(timezone=True), nullable=True)
    )
    token: str | None = Field(default=None, max_length=32)
    """The write that made the row, so a replay of it finds the row (`core.store.units`)."""


class InboundEvent(SQLModel, table=True):
    """One row per platform message ever received: the persisted half of deduplication, and the
    inbox that keeps a message before anything acts on it. `status` is what became of it:
    `turn` (a turn answers it; that turn's `inbound_event_id` points here), `command`,
    `refused`, or `dropped` (it was queued behind a turn that `/stop` ended)."""

    __tablename__ = "inbound_events"
    __table_args__ = (UniqueConstraint("platform", "platform_message_id"),)

    id: int | None = Field(default=None, primary_key=True)
    platform: str = Field(max_length=20)
    platform_message_id: str = Field(max_length=200)
    place: str = Field(max_length=300)
    status: str = Field(max_length=20)
    text: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    author: str | None = Field(default=None, max_length=200)
    """The person's name as shown."""
    author_id: str | None = Field(default=None, max_length=200)
    """The platform's id of the person, so any worker can answer them as the one who wrote."""
    claim: str | None = Field(default=None, max_length=32)
    received_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    attachments: list[dict[str, Any]] | None = Field(default=None, sa_column=Column(JSON))
    """What the message came with besides text (`attachments_of` reads it)."""


def attachments_of(stored: list[dict[str, Any]] | None) -> tuple[Attachment, ...]:
    """The attachments an inbox row keeps, as the channel described them (keys a later version
    of Kaiwa does not know are left out)."""
    known = {each.name for each in fields(Attachment)}
    found = []
    for values in stored or ():
        kept = {key: value for key, value in values.items() if key in known}
        found.append(Attachment(**{**kept, "kind": AttachmentKind(kept.get("kind", "file"))}))
    return tuple(found)


class Compaction(SQLModel, table=True):
    """A summary that replaced the older messages of a conversation in what the model is sent.
    The messages stay stored and readable; the model-facing history is the latest compaction's
    summary, then the messages from (`first_kept_turn_id`, `first_kept_seq`) on. `method` is
    `summary`, or `dropped` when the summary could not be written and the older messages were
    left out instead (`summary` then keeps the earlier one, if any). The summary calls' cost is
    kept here (and, for a compaction inside a turn, in the turn's totals too)."""

    __tablename__ = "compactions"
    __table_args__ = (_token_index("compactions"),)

    id: int | None = Field(default=None, primary_key=True)
    conversation_id: int = Field(foreign_key="conversations.id", index=True)
    turn_id: int | None = Field(default=None, foreign_key="turns.id")
    """The turn it happened in; None for `/compact`."""
    first_kept_turn_id: int
    first_kept_seq: int
    summary: str = Field(default="", sa_column=Column(Text, nullable=False, default=""))
    method: str = Field(max_length=20)
    tokens_before: int = 0
    tokens_after: int = 0
    model_calls: int = 0
    prompt_tokens: int | None = 0
    output_tokens: int | None = 0
    model_seconds: float = 0.0
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    token: str | None = Field(default=None, max_length=32)
    """The write that made the row, so a replay of it finds the row (`core.store.units`)."""


class SubagentRun(SQLModel, table=True):
    """One sub-agent's run: what it was asked, how it ended, its report and whether that report
    reached its conversation. `key` (`a1`, `a2`, ...) is its id within the conversation, never
    reused; `delivery` is `pending` until a turn carrying the report has stored its records
    (`delivered`), or `discarded` when `/new` left it behind. `unread` counts the messages a
    person sent it with `/agents tell` that it ended before reading."""

    __tablename__ = "subagent_runs"
    __table_args__ = (UniqueConstraint("conversation_id", "key"),)

    id: int | None = Field(default=None, primary_key=True)
    conversation_id: int = Field(foreign_key="conversations.id", index=True)
    parent_turn_id: int | None = Field(default=None, foreign_key="turns.id")
    parent_run_id: int | None = Field(default=None, foreign_key="subagent_runs.id")
    """The run that launched this one (a nested delegation); None for the conversation's."""
    key: str = Field(max_length=20)
    name: str = Field(max_length=100)
    profile: str = Field(max_length=100)
    model: str = Field(max_length=200)
    tier: str | None = Field(default=None, max_length=20)
    """The tier routing chose; None when it ran its profile's model (or before 0015)."""
    route: str | None = Field(default=None, max_length=300)
    """Why routing chose that tier, without the tier."""
    task: str = Field(sa_column=Column(Text, nullable=False))
    status: str = Field(max_length=20)
    report: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    delivery: str = Field(default="pending", max_length=20)
    unread: int = 0
    model_calls: int = 0
    prompt_tokens: int | None = 0
    output_tokens: int | None = 0
    model_seconds: float = 0.0
    started_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    ended_at: datetime | None = Field(
        default=None, sa_column=Column(DateTime(timezone=True), nullable=True)
    )
    token: str | None = Field(default=None, max_length=32)
    """The `start_runs` call that stored it (one for all the runs it stored), so a replay
    of that call finds its runs."""

    def why_model(self) -> str:
        """Why it ran on `model`, as every view says it: `tier: reason` when routing chose it."""
        return f"{self.tier}: {self.route}" if self.tier else "its profile's"


class SubagentMessage(SQLModel, table=True):
    """A sub-agent's transcript, one row per message, in order (`seq`)."""

    __tablename__ = "subagent_messages"
    __table_args__ = (Index("ux_subagent_messages_run_seq", "run_id", "seq", unique=True),)

    id: int | None = Field(default=None, primary_key=True)
    run_id: int = Field(foreign_key="subagent_runs.id", index=True)
    seq: int
    role: str = Field(max_length=20)
    text: str = Field(default="", sa_column=Column(Text, nullable=False, default=""))
    tool_name: str | None = Field(default=None, max_length=100)
    tool_calls: list[dict[str, Any]] | None = Field(default=None, sa_column=Column(JSON))
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


class ScheduledTask(SQLModel, table=True):
    """A task that fires on its own (`core.features.schedule.scheduler`). Its place is frozen when
    it is created, so its replies always land where it was asked for. The trigger is one of: `cron`
    (five fields, read in `timezone`), `interval_seconds` (counted from `created_at`), or `run_at`
    (once). `next_run` is the next fire slot (None once a one-shot task has fired); `enabled`
    is false while paused (`paused_reason` says why) and after a cancel (`cancelled_at`)."""

    __tablename__ = "scheduled_tasks"
    __table_args__ = (_token_index("scheduled_tasks"),)

    id: int | None = Field(default=None, primary_key=True)
    platform: str = Field(max_length=50)
    place: str = Field(index=True, max_length=300)
    agent: str = Field(max_length=100)
    name: str = Field(max_length=100)
    prompt: str = Field(sa_column=Column(Text, nullable=False))
    cron: str | None = Field(default=None, max_length=200)
    interval_seconds: int | None = None
    run_at: datetime | None = Field(
        default=None, sa_column=Column(DateTime(timezone=True), nullable=True)
    )
    timezone: str = Field(max_length=100)
    misfire: str = Field(default="once", max_length=10)
    enabled: bool = True
    paused_reason: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    consecutive_failures: int = 0
    created_by: str = Field(max_length=200)
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    next_run: datetime | None = Field(
        default=None, sa_column=Column(DateTime(timezone=True), nullable=True)
    )
    cancelled_at: datetime | None = Field(
        default=None, sa_column=Column(DateTime(timezone=True), nullable=True)
    )
    token: str | None = Field(default=None, max_length=32)
    """The write that made the row, so a replay of it finds the row (`core.store.units`)."""


class TaskRun(SQLModel, table=True):
    """One fire slot of a task, claimed before its turn starts: the unique (task, fire time)
    index is what makes a slot run at most once, across restarts and schedulers. `outcome` is
    `running` until it ends (done, stopped, failed, silent, undeliverable, cancelled), or
    `missed` for a slot that passed while Kaiwa was down and was not run; `missed_slots` counts
    the earlier slots this row stands for (never one row, or one run, per missed slot)."""

    __tablename__ = "task_runs"
    __table_args__ = (
        Index("ux_task_runs_task_fire_time", "task_id", "fire_time", unique=True),
        Index("ix_task_runs_outcome", "outcome"),
    )

    id: int | None = Field(default=None, primary_key=True)
    task_id: int = Field(foreign_key="scheduled_tasks.id")
    fire_time: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    late: bool = False
    missed_slots: int = 0
    outcome: str = Field(max_length=20)
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    turn_id: int | None = Field(default=None, foreign_key="turns.id")
    started_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    finished_at: datetime | None = Field(
        default=None, sa_column=Column(DateTime(timezone=True), nullable=True)
    )
    token: str | None = Field(default=None, max_length=32)
    """The claim that took the slot, so a replay of it finds its own run (not a taken slot)."""


class Note(SQLModel, table=True):
    """A note the agent was asked to remember (`core.features.memory`). `owner` is whose it is: a
    person on a platform (`telegram:person:42`) or a conversation's place, as `[memory].scope`
    says."""

    __tablename__ = "notes"
    __table_args__ = (_token_index("notes"),)

    id: int | None = Field(default=None, primary_key=True)
    owner: str = Field(index=True, max_length=300)
    text: str = Field(sa_column=Column(Text, nullable=False))
    place: str = Field(max_length=300)
    created_by: str = Field(max_length=200)
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    token: str | None = Field(default=None, max_length=32)
    """The write that made the row, so a replay of it finds the row (`core.store.units`)."""


class Approval(SQLModel, table=True):
    """A tool call that waited for a person's yes (`core.features.approvals.questions`): the call in
    short, whom it was asked of, and what became of it: `pending`, `allowed` (once), `allowed_here`
    (for the rest of the conversation), `denied`, `timed_out`, `cancelled` (the turn was stopped) or
    `expired` (Kaiwa restarted first). `message_id` is the question's, so it can be edited."""

    __tablename__ = "approvals"
    __table_args__ = (_token_index("approvals"),)

    id: int | None = Field(default=None, primary_key=True)
    turn_id: int | None = Field(default=None, foreign_key="turns.id")
    place: str = Field(index=True, max_length=300)
    tool: str = Field(max_length=200)
    call: str = Field(sa_column=Column(Text, nullable=False))
    asked_of: str = Field(max_length=200)
    asked_of_name: str = Field(max_length=200)
    status: str = Field(max_length=20, index=True)
    decided_by: str | None = Field(default=None, max_length=200)
    message_id: str | None = Field(default=None, max_length=100)
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    decided_at: datetime | None = Field(
        default=None, sa_column=Column(DateTime(timezone=True), nullable=True)
    )
    token: str | None = Field(default=None, max_length=32)
    """The write that made the row, then the decision that settled it: a replay of either
    finds it (`decide_approval`)."""


class ToolGrant(SQLModel, table=True):
    """A tool a person let run without asking for the rest of a conversation ("Allow here",
    `/approve ID here`): kept with the conversation across restarts, until `/grants revoke`; a
    new conversation (`/new`) starts without it. One per tool and conversation; `approval_id`
    is the question it answered."""

    __tablename__ = "tool_grants"
    __table_args__ = (UniqueConstraint("conversation_id", "tool"),)

    id: int | None = Field(default=None, primary_key=True)
    conversation_id: int = Field(foreign_key="conversations.id", index=True)
    tool: str = Field(max_length=200)
    granted_by: str = Field(max_length=200)
    """The name of the person who allowed it, as the conversation shows it."""
    approval_id: int | None = Field(default=None, foreign_key="approvals.id")
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))


class Plan(SQLModel, table=True):
    """A `/plan` workflow's plan: what the person asked, its steps, and where it stands:
    `drafting`, `reviewing` (a critic reads the draft; `rounds` counts its rounds), then
    `awaiting_person` (for their yes), `running` (step by step), and at the end `done`,
    `stopped`, `failed`, `rejected` (review never approved it, or the person said no) or
    `interrupted` (Kaiwa restarted while it was unfinished). Each step is a dict: `what`,
    `tools`, `done_when`, `status` (waiting, running, done, failed, stopped, not_run) and
    `result`. `progress_message_id` is the platform message showing its progress, so it can be
    edited."""

    __tablename__ = "plans"
    __table_args__ = (_token_index("plans"),)

    id: int | None = Field(default=None, primary_key=True)
    conversation_id: int = Field(foreign_key="conversations.id", index=True)
    place: str = Field(index=True, max_length=300)
    turn_id: int | None = Field(default=None, foreign_key="turns.id")
    task: str = Field(sa_column=Column(Text, nullable=False))
    status: str = Field(max_length=20, index=True)
    rounds: int = 0
    steps: list[dict[str, Any]] = Field(
        default_factory=list, sa_column=Column(JSON, nullable=False, default=list)
    )
    review: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    """The critic's last reasons."""
    error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    progress_message_id: str | None = Field(default=None, max_length=100)
    provenance: str = Field(default="person", max_length=20)
    created_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    updated_at: datetime = Field(sa_column=Column(DateTime(timezone=True), nullable=False))
    token: str | None = Field(default=None, max_length=32)
    """The write that made the row, so a replay of it finds the row (`core.store.units`)."""
