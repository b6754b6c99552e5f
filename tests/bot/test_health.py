"""The operators' endpoint: /metrics moves by exactly what happened, /readyz says what is wrong.

A session is scripted on the harness (a tool, a stopped reply, a failed model call, a scheduled
firing), then /metrics is scraped over HTTP and compared with a scrape from before it: the
metrics are the process's, so a test reads what it moved, not absolute values.
"""

from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from bot.health import HealthServer, Readiness
from channels.connection import ConnectionState
from core.agent.model import ModelClient, ModelSettings
from core.agent.profile import AgentProfile
from core.agent.tools import ToolContext
from core.features.approvals.questions import ApprovalSettings
from core.features.schedule.timing import ScheduleSettings, When
from core.features.subagents.runs import SubagentSettings
from core.store import Store
from tests.databases import QUICK, Outage, open_store
from tests.fakes.channel import RecordingChannel
from tests.fakes.ollama import FakeOllama, HttpError, Pause, Text, ToolCall
from tests.harness import PLACE, BotFactory, echo
from tests.ports import free_port

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(url: str) -> Samples:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as answer:
        assert answer.status == 200
        text = await answer.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


async def get(url: str, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url + path) as answer:
        return answer.status, await answer.text()


Serve = Callable[[Readiness], Awaitable[str]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Serves a readiness on a free port; returns the server's URL."""
    servers: list[HealthServer] = []

    async def served(readiness: Readiness) -> str:
        server = HealthServer(readiness, "127.0.0.1", 0)
        await server.start()
        servers.append(server)
        return f"http://127.0.0.1:{server.port}"

    yield served
    for server in servers:
        await server.close()


async def test_metrics_move_by_exactly_what_a_session_did(
    serve: Serve, make_bot: BotFactory, model: ModelClient
) -> None:
    bot = make_bot(tools=[echo], schedule=ScheduleSettings())
    url = await serve(Readiness(bot.store, model, [bot.channel]))
    before = await scrape(url)
    platform = bot.channel.platform

    bot.ollama.script(ToolCall("echo", {"word": "hi"}), Text("Said it."))  # a tool, then done
    bot.ollama.script(Text("Done."))
    await bot.send("say hi")
    await bot.channel.finished()
    bot.ollama.script(Text("Half"), Pause("half"), Text(" never"))  # stopped
    await bot.send("go on")
    await bot.ollama.reached("half")
    await bot.send("/stop")
    await bot.channel.finished()
    bot.ollama.script(HttpError(500, "boom"))  # failed
    await bot.send("again")
    await bot.channel.finished()
    assert bot.scheduler is not None
    bot.ollama.default = [Text("Digest.")]
    context = ToolContext(platform, PLACE, "ann", "person")
    task = await bot.scheduler.create(context, "assistant", "digest", When(every_minutes=60))
    await bot.scheduler.run_now(task)
    await bot.scheduler.settled()

    after = await scrape(url)
    turns = {
        outcome: moved(before, after, "kaiwa_turns_total", platform=platform, outcome=outcome)
        for outcome in ("done", "stopped", "failed")
    }
    assert turns == {"done": 2, "stopped": 1, "failed": 1}, "three messages and a firing"
    assert moved(before, after, "kaiwa_tool_calls_total", tool="echo", outcome="ok") == 1
    assert moved(before, after, "kaiwa_scheduled_firings_total", outcome="done") == 1
    assert moved(before, after, "kaiwa_turn_seconds_count", platform=platform) == 4
    posted = moved(before, after, "kaiwa_turn_first_post_seconds_count", platform=platform)
    assert posted == 4, "each reply showed once: three answers and the firing's post"
    out = moved(before, after, "kaiwa_model_tokens_total", model="test-model", direction="out")
    assert out > 0
    assert after[("kaiwa_model_requests_in_flight", ())] == 0
    assert after[("kaiwa_queued_messages", ())] == 0


async def test_questions_and_sub_agents_are_counted_as_they_happen(
    serve: Serve, make_bot: BotFactory, model: ModelClient
) -> None:
    researcher = AgentProfile("researcher", "test-model", "You look one thing up.", {})
    bot = make_bot(
        tools=[echo],
        approvals=ApprovalSettings(ask=["echo"]),
        agents={"researcher": researcher},
        delegates_to=("researcher",),
        subagents=SubagentSettings(status_message=False),
    )
    url = await serve(Readiness(bot.store, model, [bot.channel]))
    before = await scrape(url)

    bot.ollama.script(ToolCall("echo", {"word": "hello"}), Text("Said it."))
    await bot.send("say hello", author="ann")
    await bot.channel.wait_until(lambda: bool(bot.channel.notices_in(PLACE)), "the question")
    asked = await scrape(url)
    await bot.send("/approve 1", author="ann")
    await bot.channel.finished()

    task = {"profile": "researcher", "instruction": "find apples"}
    bot.ollama.script(ToolCall("delegate", {"tasks": [task]}), Text("Asked a helper."))
    bot.ollama.script_for("apples", Pause("apples"), ToolCall("report", {"summary": "Three."}))
    bot.ollama.script(Text("Three kinds."))
    await bot.send("what apples are there?", author="ann")
    await bot.ollama.reached("apples")
    working = await scrape(url)
    bot.ollama.release("apples")
    run = bot.subagents.find(PLACE, "a1")
    assert run is not None
    await run.finished.wait()
    await bot.channel.finished(3)
    after = await scrape(url)

    assert moved(before, asked, "kaiwa_approvals_asked_total") == 1
    assert moved(before, asked, "kaiwa_approvals_answered_total", decision="allowed") == 0
    assert moved(before, after, "kaiwa_approvals_answered_total", decision="allowed") == 1
    assert moved(before, working, "kaiwa_subagents_running") == 1
    assert moved(before, after, "kaiwa_subagents_running") == 0
    assert moved(before, after, "kaiwa_subagent_runs_total", outcome="done") == 1


async def test_the_probes_share_the_port_that_receives_the_platforms_posts(
    make_bot: BotFactory, model: ModelClient
) -> None:
    """A load balancer asks /readyz where it forwards Telegram's webhook posts: one port."""
    bot = make_bot()
    port = free_port()
    health = HealthServer(Readiness(bot.store, model, [bot.channel]), "127.0.0.1", port)
    await health.start()
    url = f"http://127.0.0.1:{port}"

    async def taken(_: web.Request) -> web.Response:
        return web.Response(text="update taken")

    webhook = ConnectionState()
    address = ("127.0.0.1", port, "/telegram")
    async with webhook.receiving_posts(taken, address, "Telegram updates", "webhook_port"):
        async with aiohttp.ClientSession() as session, session.post(url + "/telegram") as answer:
            assert (answer.status, await answer.text()) == (200, "update taken")
        assert await get(url, "/readyz") == (200, "ready\n")
    assert await get(url, "/readyz") == (200, "ready\n"), "the probes outlive the webhook"
    await health.close()


async def test_readyz_says_what_is_wrong_and_turns_ready_again_after(
    serve: Serve, outage: Outage, closing: list[Store]
) -> None:
    store = await open_store(outage.url, QUICK, closing)
    async with FakeOllama() as ollama:
        model = ModelClient(ModelSettings(url=ollama.url))
        url = await serve(Readiness(store, model, [RecordingChannel()]))
        assert await get(url, "/healthz") == (200, "ok\n")
        assert await get(url, "/readyz") == (200, "ready\n")

        outage.begin()
        status, body = await get(url, "/readyz")
        assert status == 503 and "not ready: the database did not answer within" in body
        outage.end()
        await outage.store_recovered()
        assert await get(url, "/readyz") == (200, "ready\n")

    status, body = await get(url, "/readyz")  # the fake Ollama is gone
    assert status == 503 and body.startswith("not ready: Ollama: cannot reach Ollama")
    port = int(ollama.url.rsplit(":", 1)[1])
    back = FakeOllama()  # and back, on the port it had
    await back.start(port)
    try:
        assert await get(url, "/readyz") == (200, "ready\n")
    finally:
        await back.close()
        await model.close()
