"""One HTTP server per address, shared by everything of this process that listens there.

Slack's HTTP mode and Telegram's webhook take the platform's posts (`ConnectionState.
receiving_posts`), and `[metrics]` answers operators' probes (`bot.health`). Given the same host
and port, they share one server: a load balancer in front of several workers then asks `/readyz`
on the very port that receives the platform's posts, and a worker opens one port, not two.

aiohttp cannot add a route to an application once it serves, so the server of an address has a
single catch-all route that looks each request up among the routes mounted there now. Mounting
starts the server; the last unmount closes it. A path mounted by nobody answers 404 (a platform
posting to a channel that is reconnecting gets an error and posts again later), a path mounted
for another method 405. Port 0 picks a free port, never shared.
"""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Routes = Mapping[tuple[str, str], Handler]
"""(method, path) → what answers it."""


@dataclass(eq=False)
class _Server:
    runner: web.AppRunner
    started: "asyncio.Future[int]"
    """The port served, once listening; the error when the port could not be had."""
    routes: dict[tuple[str, str], Handler] = field(default_factory=dict)
    mounts: int = 0
    starting: "asyncio.Task[None] | None" = None

    async def answer(self, request: web.Request) -> web.StreamResponse:
        handler = self.routes.get((request.method, request.path))
        if handler is not None:
            return await handler(request)
        if any(path == request.path for _, path in self.routes):
            return web.Response(status=405)
        return web.Response(status=404)


_SERVERS: dict[tuple[str, int], _Server] = {}


@asynccontextmanager
async def mounted(host: str, port: int, routes: Routes) -> AsyncIterator[int]:
    """`routes` answered on `host:port` for the block, beside any other mount there; yields the
    port served. `OSError` when the port cannot be had; `ValueError` when a route is taken."""
    server = (_SERVERS.get((host, port)) if port else None) or _server(host, port)
    taken = server.routes.keys() & routes.keys()
    if taken:
        raise ValueError(f"{sorted(taken)} already answered on {host}:{port}")
    server.routes.update(routes)
    server.mounts += 1
    try:
        yield await asyncio.shield(server.started)
    finally:
        for route in routes:
            server.routes.pop(route, None)
        server.mounts -= 1
        if server.mounts == 0:
            await _close(server, (host, port))


def _server(host: str, port: int) -> _Server:
    """A server for the address, starting: a mount that comes meanwhile shares it. The start is
    a task of its own, so a mount cancelled while it waits leaves the others a server."""
    application = web.Application()
    runner = web.AppRunner(application, access_log=None)
    server = _Server(runner, asyncio.get_running_loop().create_future())
    application.router.add_route("*", "/{path:.*}", server.answer)
    if port:
        _SERVERS[(host, port)] = server
    server.starting = asyncio.create_task(_start(server, host, port), name=f"http {host}:{port}")
    return server


async def _start(server: _Server, host: str, port: int) -> None:
    try:
        await server.runner.setup()
        await web.TCPSite(server.runner, host, port).start()
    except Exception as exc:  # OSError: the port is taken; whatever it is, every mount hears it
        if _SERVERS.get((host, port)) is server:
            del _SERVERS[(host, port)]
        server.started.set_exception(exc)
        return
    addresses = server.runner.addresses
    server.started.set_result(int(addresses[0][1]) if addresses else port)


async def _close(server: _Server, address: tuple[str, int]) -> None:
    if _SERVERS.get(address) is server:
        del _SERVERS[address]
    if server.starting is not None:
        await asyncio.wait([server.starting])
    await server.runner.cleanup()
