"""One HTTP server per address: mounts at one host and port share it, each answering its own
routes; the last one to leave closes the port; a port that cannot be had is said to every mount
waiting for it. Real aiohttp servers on 127.0.0.1, asked by a real client."""

import asyncio
import socket

import aiohttp
import pytest
from aiohttp import web

from channels.http_server import Handler, mounted
from tests.ports import free_port


def saying(text: str) -> Handler:
    async def answer(_: web.Request) -> web.Response:
        return web.Response(text=text)

    return answer


async def ask(port: int, path: str, method: str = "GET") -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, f"http://127.0.0.1:{port}{path}") as answer,
    ):
        return answer.status, await answer.text()


async def test_two_mounts_at_one_address_share_its_server() -> None:
    port = free_port()
    webhook = {("POST", "/telegram"): saying("update taken")}
    async with mounted("127.0.0.1", port, {("GET", "/readyz"): saying("ready")}) as served:
        async with mounted("127.0.0.1", port, webhook) as shared:
            assert served == shared == port
            assert await ask(port, "/readyz") == (200, "ready")
            assert await ask(port, "/telegram", "POST") == (200, "update taken")
            assert (await ask(port, "/elsewhere"))[0] == 404
            assert (await ask(port, "/telegram"))[0] == 405, "the path is there, for POST"

        assert (await ask(port, "/telegram", "POST"))[0] == 404, "its mount has left"
        assert await ask(port, "/readyz") == (200, "ready")

    with pytest.raises(aiohttp.ClientConnectionError):
        await ask(port, "/readyz")


async def test_mounts_starting_together_share_one_server() -> None:
    """The second and third mounts come while the first one's server is still starting."""
    port = free_port()
    entered = [asyncio.Event() for _ in range(3)]
    leave = asyncio.Event()

    async def mount(n: int) -> int:
        async with mounted("127.0.0.1", port, {("GET", f"/{n}"): saying(f"mount {n}")}) as served:
            entered[n].set()
            await leave.wait()
            return served

    mounts = [asyncio.create_task(mount(n)) for n in range(3)]
    await asyncio.gather(*(each.wait() for each in entered))
    for n in range(3):
        assert await ask(port, f"/{n}") == (200, f"mount {n}")
    leave.set()
    assert await asyncio.gather(*mounts) == [port] * 3


async def test_a_port_in_use_is_said_to_every_mount_and_frees_the_address() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        async def mount(path: str) -> None:
            async with mounted("127.0.0.1", port, {("GET", path): saying("ready")}):
                pass

        mounts = mount("/readyz"), mount("/healthz")
        results = await asyncio.gather(*mounts, return_exceptions=True)
        assert all(isinstance(each, OSError) for each in results), results

    async with mounted("127.0.0.1", port, {("GET", "/readyz"): saying("ready")}):
        assert await ask(port, "/readyz") == (200, "ready"), "tried afresh once the port is free"


async def test_a_route_already_answered_at_the_address_is_refused() -> None:
    port = free_port()
    route = {("POST", "/slack/events"): saying("first")}
    async with mounted("127.0.0.1", port, route):
        with pytest.raises(ValueError, match="already answered"):
            async with mounted("127.0.0.1", port, route):
                pass
        assert await ask(port, "/slack/events", "POST") == (200, "first")


async def test_port_0_picks_a_port_of_its_own_each_time() -> None:
    route = {("GET", "/healthz"): saying("ok")}
    async with mounted("127.0.0.1", 0, route) as one, mounted("127.0.0.1", 0, route) as two:
        assert one != two
        assert await ask(one, "/healthz") == await ask(two, "/healthz") == (200, "ok")
