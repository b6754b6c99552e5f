"""Fixtures shared by every test folder: no proxies, a fake Ollama, a store, a model client."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from core.agent.model import ModelClient, ModelSettings
from core.store import Store
from tests.databases import closing, database_url, outage  # noqa: F401  (fixtures everywhere)
from tests.fakes.ollama import FakeOllama
from tests.harness import bot, make_bot  # noqa: F401  (fixtures for every test folder)
from tests.processes import kill_leftovers  # noqa: F401  (an autouse fixture)

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


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
        connect_timeout=2.0,
        first_chunk_timeout=5.0,
        idle_timeout=5.0,
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
    return f"sqlite:///{tmp_path / 'kaiwa.db'}"


@pytest.fixture
async def store(sqlite_url: str) -> AsyncIterator[Store]:
    opened = await Store.open(sqlite_url)
    yield opened
    await opened.close()
