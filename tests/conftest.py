"""Fixtures shared by every test folder: no proxies, a fake Ollama, a store, a model client; and
the set-up of a run (its time limits, a database per worker)."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.agent.model import ModelClient, ModelSettings
from core.store import Store
from tests.databases import (  # noqa: F401  (fixtures everywhere)
    closing,
    database_url,
    fresh_sqlite,
    outage,
    small_disk,
    use_a_database_per_worker,
)
from tests.fakes.ollama import FakeOllama
from tests.fakes.patience import deadline
from tests.harness import bot, make_bot  # noqa: F401  (fixtures for every test folder)
from tests.processes import kill_leftovers  # noqa: F401  (an autouse fixture)
from tests.timeouts import pytest_timeout_set_timer, scale_the_limit  # noqa: F401  (a hook)

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Before the plugins read their settings: the limit on a test, scaled for this machine
    (`tests.timeouts`), and a PostgreSQL database for this xdist worker (`tests.databases`)."""
    scale_the_limit(config)
    use_a_database_per_worker()


@pytest.fixture(autouse=True)
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    """httpx would send even 127.0.0.1 traffic through a configured proxy."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


@pytest.fixture
async def ollama() -> AsyncIterator[FakeOllama]:
    async with FakeOllama() as fake:
        yield fake


@pytest.fixture
def model_settings(ollama: FakeOllama, request: pytest.FixtureRequest) -> ModelSettings:
    slots = request.node.get_closest_marker("model_slots")
    return ModelSettings(
        url=ollama.url,
        connect_timeout=deadline(),
        first_chunk_timeout=deadline(),
        idle_timeout=deadline(),
        max_concurrent_requests=slots.args[0] if slots else 8,
        retry_backoff=0.01,
    )


@pytest.fixture
async def model(model_settings: ModelSettings) -> AsyncIterator[ModelClient]:
    client = ModelClient(model_settings)
    yield client
    await client.close()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return fresh_sqlite(tmp_path / "kaiwa.db")


@pytest.fixture
async def store(sqlite_url: str) -> AsyncIterator[Store]:
    opened = await Store.open(sqlite_url)
    yield opened
    await opened.close()
