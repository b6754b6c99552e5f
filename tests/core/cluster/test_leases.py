"""The cluster's PostgreSQL primitives: leases that end with their connection, notifications,
the list of live workers. PostgreSQL only (skipped without KAIWA_TEST_POSTGRES_URL).

Each test names its own cluster (`name`), so its leases and notifications are its own even on a
server other tests share.
"""

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg
import pytest
from prometheus_client import REGISTRY

from core.cluster.leases import ClusterSettings, Coordinator, conninfo
from core.errors import ConfigError
from tests.databases import postgres_url
from tests.fakes.patience import deadline

pytestmark = pytest.mark.postgres


async def eventually(condition: Callable[[], Awaitable[bool]]) -> None:
    """PostgreSQL ends a closed or terminated connection's backend (and frees its locks) a
    moment after the client lets go: the next tries see it, as other workers' tries do."""
    async with asyncio.timeout(deadline()):
        while not await condition():  # noqa: ASYNC110  (the server's state: no event to wait on)
            await asyncio.sleep(0.01)


@pytest.fixture
async def workers() -> AsyncIterator[Callable[[str], Coordinator]]:
    base = postgres_url()
    if not base:
        pytest.skip("set KAIWA_TEST_POSTGRES_URL to run the cluster tests")
    name = f"t{uuid.uuid4().hex[:8]}"
    started: list[Coordinator] = []

    def worker(worker_id: str) -> Coordinator:
        coordinator = Coordinator(base, ClusterSettings(True, name=name, worker_id=worker_id))
        started.append(coordinator)
        return coordinator

    yield worker
    for coordinator in started:
        await coordinator.close()


async def test_a_lease_is_held_by_one_worker_until_its_connection_ends(
    workers: Callable[[str], Coordinator],
) -> None:
    one, two = workers("one"), workers("two")
    await one.start()
    await two.start()

    assert await one.try_lease("channel:telegram")
    assert not await two.try_lease("channel:telegram")
    assert await one.try_lease("channel:telegram"), "a lease held is held"
    await one.close()  # a dead process: PostgreSQL ends its connection, and its locks with it

    await eventually(lambda: two.try_lease("channel:telegram"))
    assert two.held == {"channel:telegram"}


def leases_held() -> float:
    return REGISTRY.get_sample_value("kaiwa_cluster_leases_held") or 0.0


async def test_a_released_lease_can_be_taken_at_once(workers: Callable[[str], Coordinator]) -> None:
    one, two = workers("one"), workers("two")
    await one.start()
    await two.start()
    held = leases_held()
    assert await one.try_lease("place:test:1")
    assert leases_held() == held + 1

    await one.release("place:test:1")

    assert leases_held() == held
    assert await two.try_lease("place:test:1")
    assert one.held == set()


async def test_a_terminated_lease_connection_is_known_as_lost(
    workers: Callable[[str], Coordinator],
) -> None:
    one, two = workers("one"), workers("two")
    await one.start()
    await two.start()
    assert await one.try_lease("channel:slack")
    base = postgres_url()
    assert base is not None
    async with await psycopg.AsyncConnection.connect(conninfo(base), autocommit=True) as admin:
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            (one.application_name,),
        )

    await eventually(lambda: two.try_lease("channel:slack"))
    with pytest.raises(Exception, match="cluster"):
        await one.try_lease("channel:other")
    assert one.lost.is_set() and one.held == set()


async def test_a_notification_reaches_every_worker_by_its_kind(
    workers: Callable[[str], Coordinator],
) -> None:
    one, two = workers("one"), workers("two")
    heard: list[tuple[str, dict[str, Any]]] = []
    both = asyncio.Event()

    def hearing(who: str) -> Callable[[dict[str, Any]], Any]:
        async def handler(message: dict[str, Any]) -> None:
            heard.append((who, message))
            if len(heard) == 2:
                both.set()

        return handler

    for worker in (one, two):
        worker.on("work", hearing(worker.worker))
        await worker.start()

    await one.notify("work", place="test:1")
    await asyncio.wait_for(both.wait(), deadline())

    assert sorted(who for who, _ in heard) == ["one", "two"]
    assert all(m == {"kind": "work", "from": "one", "place": "test:1"} for _, m in heard)


async def test_workers_lists_the_live_workers(workers: Callable[[str], Coordinator]) -> None:
    one, two = workers("one"), workers("two")
    await one.start()
    await two.start()
    assert await one.workers() == ["one", "two"]
    assert REGISTRY.get_sample_value("kaiwa_cluster_workers_alive") == 2
    await two.close()

    async def only_one() -> bool:
        return await one.workers() == ["one"]

    await eventually(only_one)


def test_sqlite_cannot_be_shared_by_workers() -> None:
    with pytest.raises(ConfigError, match=r"\[cluster\].enabled needs PostgreSQL"):
        Coordinator("sqlite:///kaiwa.db", ClusterSettings(True))
