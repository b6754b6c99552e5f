"""What an operator, an orchestrator or a load balancer asks of a running Kaiwa, over HTTP.

Off by default; `[metrics].enabled` serves, on `host:port`:
- `/metrics`: the Prometheus metrics of `core.metrics`, in the text format (with the
  process's own: memory, CPU, open files);
- `/healthz`: 200 while the process serves at all (its event loop answers);
- `/readyz`: 200 when this worker can answer people: the store answers, every channel this
  worker runs is connected (a channel whose lease another worker of a cluster holds is that
  worker's to run), and Ollama answers. Otherwise 503, with one line per problem.

Each readiness check has `CHECK_SECONDS` and they run side by side, so an answer takes well
under a second even when the database or Ollama hangs. The server is bound to 127.0.0.1 unless
`host` says otherwise: the figures are not secret, but they are nobody else's business.
"""

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from core.agent.model import ModelClient
from core.channel import Channel
from core.errors import ConfigError, KaiwaError
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
        except KaiwaError as exc:
            return f"{what}: {exc}"
        except Exception as exc:  # a check never fails the answer: it is the answer
            return f"{what}: {type(exc).__name__}: {exc}"
        return None

    def _off(self, channel: Channel) -> str | None:
        if channel.connected.is_set():
            return None
        lease = f"channel:{channel.platform}"
        if self.cluster is not None and lease not in self.cluster.held:
            return None  # another worker runs it
        why = channel.problem or "connecting"
        return f"{channel.platform} is not connected: {why}"


def routes(readiness: Readiness) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        problems = await readiness.problems()
        if problems:
            return web.Response(status=503, text="".join(f"not ready: {p}\n" for p in problems))
        return web.Response(text="ready\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


class HealthServer:
    """`routes` served on `host:port` until closed."""

    def __init__(self, readiness: Readiness, host: str, port: int) -> None:
        self._runner = web.AppRunner(routes(readiness), access_log=None)
        self._host = host
        self._port = port

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise ConfigError(
                f"cannot serve the metrics on {self._host}:{self._port} ({exc.strerror or exc}); "
                "set [metrics].port to a free port"
            ) from exc
        logger.info("metrics and health checks on http://%s:%d/", self._host, self._port)

    @property
    def port(self) -> int:
        """The port served (the one picked, when `port` was 0)."""
        addresses = self._runner.addresses
        return int(addresses[0][1]) if addresses else self._port

    async def close(self) -> None:
        await self._runner.cleanup()
