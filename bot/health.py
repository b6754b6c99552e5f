"""What an operator, an orchestrator or a load balancer asks of a running Kaiwa, over HTTP.

Off by default; `[metrics].enabled` serves, on `host:port`:
- `/metrics`: the Prometheus metrics of `core.metrics`, in the text format (with the
  process's own: memory, CPU, open files);
- `/healthz`: 200 while the process serves at all (its event loop answers);
- `/readyz`: 200 when this worker can answer people: the store answers and takes writes (while
  it refuses them, since when and why: `core.store.outage`), every channel this worker runs is
  connected (a channel whose lease another worker of a cluster holds is that
  worker's to run), and Ollama answers. Otherwise 503, with one line per problem.

Each readiness check has `CHECK_SECONDS` and they run side by side, so an answer takes well
under a second even when the database or Ollama hangs. The server is bound to 127.0.0.1 unless
`host` says otherwise: the figures are not secret, but they are nobody else's business.

Given the address of Slack's HTTP mode or Telegram's webhook, the routes join the server that
receives the platform's posts (`channels.http_server`): a load balancer in front of several
workers then probes `/readyz` on the port it forwards the posts to. Only the port is shared.
"""

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from channels.http_server import Routes, mounted
from core.agent.model import ModelClient
from core.channel import Channel
from core.errors import ConfigError, KaiwaError, WriteRefused
from core.store import Store

logger = logging.getLogger(__name__)

CHECK_SECONDS = 0.8


class Leases(Protocol):
    """Which leases this worker holds (`core.cluster.leases.Coordinator`)."""

    held: set[str]


@dataclass(frozen=True)
class Readiness:
    store: Store
    model: ModelClient
    channels: Sequence[Channel]
    cluster: Leases | None = None

    async def problems(self) -> list[str]:
        """Why this worker cannot answer people now; empty when it can."""
        checks = [
            self._check("the database", self.store.ping()),
            self._check("Ollama", self.model.list_models()),
        ]
        found = [problem for problem in await asyncio.gather(*checks) if problem]
        return found + [problem for channel in self.channels if (problem := self._off(channel))]

    async def _check(self, what: str, answer: Awaitable[object]) -> str | None:
        try:
            await asyncio.wait_for(answer, CHECK_SECONDS)
        except TimeoutError:
            return f"{what} did not answer within {CHECK_SECONDS:g} s"
        except WriteRefused as exc:
            return self._refusing(exc)
        except KaiwaError as exc:
            return f"{what}: {exc}"
        except Exception as exc:  # a check never fails the answer: it is the answer
            return f"{what}: {type(exc).__name__}: {exc}"
        return None

    def _refusing(self, exc: WriteRefused) -> str:
        """The store's ping is a write: refused, the outage it is part of (set before)."""
        refusal = self.store.writes.current
        since = "" if refusal is None else f" since {refusal.since:%Y-%m-%d %H:%M:%S} UTC"
        return f"the database refuses writes{since}: {exc.plainly}"

    def _off(self, channel: Channel) -> str | None:
        if channel.connected.is_set():
            return None
        lease = f"channel:{channel.platform}"
        if self.cluster is not None and lease not in self.cluster.held:
            return None  # another worker runs it
        why = channel.problem or "connecting"
        return f"{channel.platform} is not connected: {why}"


def routes(readiness: Readiness) -> Routes:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        problems = await readiness.problems()
        if problems:
            return web.Response(status=503, text="".join(f"not ready: {p}\n" for p in problems))
        return web.Response(text="ready\n")

    return {("GET", "/metrics"): metrics, ("GET", "/healthz"): healthz, ("GET", "/readyz"): readyz}


class HealthServer:
    """`routes` served on `host:port` until closed, on the server of Slack's HTTP mode or
    Telegram's webhook when either listens at the same address (`channels.http_server`)."""

    def __init__(self, readiness: Readiness, host: str, port: int) -> None:
        self._serving = AsyncExitStack()
        self._routes = routes(readiness)
        self._host = host
        self.port = port
        """The port served (the one picked, once started, when `port` was 0)."""

    async def start(self) -> None:
        try:
            served = mounted(self._host, self.port, self._routes)
            self.port = await self._serving.enter_async_context(served)
        except OSError as exc:
            raise ConfigError(
                f"cannot serve the metrics on {self._host}:{self.port} ({exc.strerror or exc}); "
                "set [metrics].port to a free port"
            ) from exc
        logger.info("metrics and health checks on http://%s:%d/", self._host, self.port)

    async def close(self) -> None:
        await self._serving.aclose()
