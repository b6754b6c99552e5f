"""Real `kaiwa` processes for tests: a configuration pointing at the fakes, a start, a finish.

Every process started here is killed when its test ends (`kill_leftovers`, an autouse fixture):
a test that fails half-way must not leave a bot running, still polling a fake or a database.
"""

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

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
