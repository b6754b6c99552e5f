"""A whole turn path on a channel of the test's choice: store, real model client, fake Ollama.

The fixtures `make_bot` and `bot` (registered in tests/conftest.py) build it.
"""

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from itertools import count
from typing import Any

import pytest

from bot.wiring import Features, assemble
from core.agent.model import ModelClient
from core.agent.profile import AgentProfile
from core.agent.tools import Tool, builtin_tools, tool
from core.channel import Attachment, Channel, ChannelMessage
from core.cluster.leases import Coordinator
from core.cluster.owners import Owners
from core.dispatch.dispatcher import AccessRules, Allowed, Dispatcher
from core.features.approvals.questions import ApprovalSettings
from core.features.attachments.formats import DocumentLimits
from core.features.attachments.transcription import TranscriptionSettings
from core.features.mcp.servers import McpServers
from core.features.memory import MemorySettings
from core.features.schedule.scheduler import Scheduler
from core.features.schedule.timing import ScheduleSettings
from core.features.subagents.agents import Subagents
from core.features.subagents.runs import SubagentSettings
from core.store import Store
from core.store.tables import Message, Turn, utc_now
from core.turns.runner import TurnRunner
from core.turns.turn import TurnSettings
from tests.fakes.channel import RecordingChannel
from tests.fakes.ollama import FakeOllama
from tests.fakes.patience import deadline
from workflows.plan.settings import PlanSettings

SYSTEM_PROMPT = "You are a test assistant."
PLACE = "test:one"
MESSAGE_IDS = count(1)  # unique across bots, as platform ids are across restarts


@tool(read_only=True)
def echo(word: str) -> str:
    """Say a word back."""
    return f"echo {word}"


@dataclass
class Bot:
    store: Store
    channel: Any
    runner: TurnRunner
    dispatcher: Dispatcher
    ollama: FakeOllama
    subagents: Subagents
    scheduler: Scheduler | None = None
    owners: Owners | None = None

    async def send(
        self,
        text: str,
        *,
        place: str = PLACE,
        message_id: str | None = None,
        author: str = "ann",
        images: tuple[bytes, ...] = (),
        attachments: tuple[Attachment, ...] = (),
    ) -> None:
        await self.dispatcher.handle(
            ChannelMessage(
                platform=self.channel.platform,
                place=place,
                message_id=message_id or f"m{next(MESSAGE_IDS)}",
                author_id=author,
                text=text,
                images=images,
                attachments=attachments,
            ),
        )

    async def history(self, place: str = PLACE) -> list[Message]:
        conversation = await self.store.active_conversation(place)
        assert conversation is not None and conversation.id is not None
        return await self.store.history(conversation.id)

    async def turns(self, place: str = PLACE) -> list[Turn]:
        conversation = await self.store.active_conversation(place)
        assert conversation is not None and conversation.id is not None
        return await self.store.turns(conversation.id)

    async def assistant_text(self, place: str = PLACE) -> str:
        """The stored answer of the newest turn, joined the way it is displayed."""
        rows = await self.history(place)
        newest = max(row.turn_id or 0 for row in rows)
        said = [r.text for r in rows if r.turn_id == newest and r.role == "assistant" and r.text]
        return "\n\n".join(said)


BotFactory = Callable[..., Bot]


@pytest.fixture
async def make_bot(
    store: Store, model: ModelClient, ollama: FakeOllama
) -> AsyncIterator[BotFactory]:
    runners: list[TurnRunner] = []

    def build(
        *,
        tools: list[Tool] | None = None,
        channel: Channel | None = None,
        allowed: frozenset[str] | None = None,
        rooms: frozenset[str] = frozenset(),
        access: Allowed | None = None,
        max_message_chars: int = 1000,
        max_cached_conversations: int = 100,
        max_iterations: int = 10,
        images: bool = False,
        bot_store: Store | None = None,
        context_window: int = 0,
        tool_grace: float = 2.0,
        agents: dict[str, AgentProfile] | None = None,
        channel_agents: dict[str, str] | None = None,
        delegates_to: tuple[str, ...] = (),
        subagents: SubagentSettings | None = None,
        schedule: ScheduleSettings | None = None,
        clock: Callable[[], datetime] | None = None,
        memory: MemorySettings | None = None,
        approvals: ApprovalSettings | None = None,
        mcp: tuple[str, ...] = (),
        servers: McpServers | None = None,
        tool_timeout: float = deadline(),
        plan: PlanSettings | None = None,
        cluster: Coordinator | None = None,
        transcription: TranscriptionSettings | None = None,
        documents: DocumentLimits | None = None,
    ) -> Bot:
        """`schedule`: with a scheduler (its task tools given to the agent), on `clock`, with
        no timers: firings happen when the test calls `scheduler.fire_due()`. `memory`: with
        the notes tools and `/memory`. `approvals`: the tools it names ask first. `plan`: with
        the `/plan` workflow. `servers`: MCP servers (started) whose tools `mcp` names."""
        channel = channel or RecordingChannel()
        chosen = tools if tools is not None else [echo, *builtin_tools("UTC")]
        settings = TurnSettings(
            agent=AgentProfile(
                name="assistant",
                model="test-model",
                system_prompt=SYSTEM_PROMPT,
                tools={t.name: t for t in chosen},
                max_iterations=max_iterations,
                images=images,
                context_window=context_window,
                delegates_to=delegates_to,
                mcp=mcp,
            ),
            agents=agents or {},
            channel_agents=channel_agents or {},
            tool_timeout=tool_timeout,
            tool_grace=tool_grace,
            max_cached_conversations=max_cached_conversations,
        )
        used_store = bot_store or store
        features = Features(
            subagents=subagents or SubagentSettings(),
            approvals=approvals or ApprovalSettings(),
            plan=plan or PlanSettings(enabled=False),
            schedule=schedule or ScheduleSettings(enabled=False),
            memory=memory or MemorySettings(enabled=False),
            transcription=transcription or TranscriptionSettings(),
            documents=documents or DocumentLimits(),
            mcp=servers,
            zone="UTC",
            clock=clock or utc_now,
            timers=False,
        )
        kaiwa = assemble(
            used_store,
            model,
            {channel.platform: channel},
            settings,
            AccessRules({channel.platform: access or Allowed(users=allowed, rooms=rooms)}),
            features,
            max_message_chars=max_message_chars,
            cluster=cluster,
        )
        runners.append(kaiwa.runner)
        return Bot(
            used_store,
            channel,
            kaiwa.runner,
            kaiwa.dispatcher,
            ollama,
            kaiwa.subagents,
            kaiwa.scheduler,
            kaiwa.owners,
        )

    yield build
    for runner in runners:
        await runner.shutdown()


@pytest.fixture
def bot(make_bot: BotFactory) -> Bot:
    return make_bot()
