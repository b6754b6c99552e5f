"""Real `kaiwa` processes for tests: a configuration pointing at the fakes, a start, a finish.

Every process started here is killed when its test ends (`kill_leftovers`, an autouse fixture):
a test that fails half-way must not leave a bot running, still polling a fake or a database.
"""

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError

from tests.fakes.patience import deadline

WAIT_SECONDS = deadline()
STARTED: list[asyncio.subprocess.Process] = []


def write_config(tmp_path: Path, url: str, model: str = "test-model") -> Path:
    path = tmp_path / "kaiwa.toml"
    path.write_text(
        f'[ollama]\nurl = "{url}"\nconnect_timeout = 2.0\n\n'
        f'[agents.assistant]\nmodel = "{model}"\n\n'
        '[storage]\ndata_dir = "state"\n\n'
        "[channels.terminal]\nshow_thinking = false\n"
    )
    return path


async def kaiwa(
    *args: str, stdin: int | None = None, env: dict[str, str] | None = None
) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        *args,
        stdin=stdin if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "KAIWA_CONFIG": "", **(env or {})},
    )
    STARTED.append(process)
    return process


async def finish(process: asyncio.subprocess.Process) -> tuple[int, str, str]:
    async with asyncio.timeout(WAIT_SECONDS):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.fixture(autouse=True)
async def kill_leftovers() -> AsyncIterator[None]:
    yield
    while STARTED:
        process = STARTED.pop()
        if process.returncode is None:
            process.kill()
            await process.wait()


async def stored(url: str, query: str, holds: Callable[[list[Any]], bool]) -> None:
    """Wait until the rows `query` reads from the store satisfy `holds` (another process's
    database, perhaps not made yet: there is nothing to be woken by, so it is read again every
    20 ms)."""
    engine = create_engine(url)

    def read() -> bool:
        try:
            with engine.connect() as connection:
                return holds(list(connection.execute(text(query))))
        except DBAPIError:  # the tables are not there yet
            return False

    try:
        async with asyncio.timeout(WAIT_SECONDS):
            while not await asyncio.to_thread(read):  # noqa: ASYNC110
                await asyncio.sleep(0.02)
    finally:
        engine.dispose()


def ids(value: Any) -> list[str]:
    """A `reply_ids` column as read raw: JSON text on SQLite, a list on PostgreSQL."""
    return list((json.loads(value) if isinstance(value, str) else value) or [])


async def reply_recorded(url: str) -> None:
    """Wait until the store holds the id of a message the reply posted (it is written as soon
    as the platform accepted the message; a kill before that leaves nothing to mark)."""
    await stored(url, "SELECT reply_ids FROM turns", lambda rows: any(ids(r[0]) for r in rows))
