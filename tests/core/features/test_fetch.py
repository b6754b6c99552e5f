"""`fetch_url` against a local web server: HTML to text, limits, and the refusals that keep a
model from reaching inside the network (loopback is refused unless the allow-list names it, so
the tests that read pages allow 127.0.0.1 and the refusal tests do not)."""

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from core.features.fetch import FetchFailed, FetchRefused, FetchSettings, fetch_tool

PAGE = """<html><head><title>Incidents</title><style>p { color: red }</style>
<script>alert("no")</script></head><body><h1>Open incidents</h1>
<p>The <b>database</b> is slow.</p><ul><li>INC-1</li><li>INC-2</li></ul></body></html>"""
LOCAL = FetchSettings(allow=["127.0.0.1"], timeout=2.0, max_bytes=10_000)


@pytest.fixture
async def site() -> AsyncIterator[str]:
    """A web server on 127.0.0.1; its base URL."""
    stalled = asyncio.Event()

    async def page(_: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    async def huge(_: web.Request) -> web.Response:
        return web.Response(text="x" * 50_000, content_type="text/plain")

    async def image(_: web.Request) -> web.Response:
        return web.Response(body=b"\x89PNG" + bytes(100), content_type="image/png")

    async def slow(_: web.Request) -> web.Response:
        await stalled.wait()
        return web.Response(text="late")

    async def to_metadata(_: web.Request) -> web.Response:
        raise web.HTTPFound("http://169.254.169.254/latest/meta-data/")

    async def to_page(_: web.Request) -> web.Response:
        raise web.HTTPFound("/page")

    app = web.Application()
    for path, handler in [
        ("/page", page),
        ("/huge", huge),
        ("/image", image),
        ("/slow", slow),
        ("/to-metadata", to_metadata),
        ("/to-page", to_page),
    ]:
        app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    server = web.TCPSite(runner, "127.0.0.1", 0)
    await server.start()
    port = server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    stalled.set()
    await runner.cleanup()


async def fetch(url: str, settings: FetchSettings = LOCAL) -> str:
    return await fetch_tool(settings).invoke({"url": url})


async def test_html_becomes_readable_text_with_the_final_url_and_status(site: str) -> None:
    text = await fetch(f"{site}/to-page")
    assert text.startswith(f"{site}/page → HTTP 200 (text/html)")
    assert "# Open incidents" in text and "The **database** is slow." in text
    assert "* INC-1" in text
    assert "alert" not in text and "color: red" not in text, "no script or style"


async def test_a_body_past_the_size_limit_is_cut_and_says_so(site: str) -> None:
    text = await fetch(f"{site}/huge")
    assert text.endswith("(cut at 10,000 bytes)")
    assert text.split("\n\n", 1)[1].count("x") == 10_000


async def test_what_is_not_text_is_described_not_shown(site: str) -> None:
    assert await fetch(f"{site}/image") == (
        f"{site}/image → HTTP 200 (image/png): 104 bytes of image/png content, not text"
    )


async def test_a_page_that_does_not_answer_in_time_fails_clearly(site: str) -> None:
    quick = FetchSettings(allow=["127.0.0.1"], timeout=0.2)
    with pytest.raises(FetchFailed, match=r"did not answer within 0.2 s"):
        await fetch(f"{site}/slow", quick)


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("http://127.0.0.1:9/", "loopback"),
        ("http://localhost:9/", "loopback"),
        ("http://[::1]:9/", "loopback"),
        ("http://[::ffff:127.0.0.1]:9/", "loopback"),
        ("http://10.1.2.3/", "private or reserved"),
        ("http://192.168.1.1/", "private or reserved"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://0.0.0.0/", "private or reserved"),
    ],
)
async def test_private_loopback_and_metadata_addresses_are_refused(url: str, kind: str) -> None:
    with pytest.raises(FetchRefused, match=kind):
        await fetch(url, FetchSettings())


async def test_a_redirect_into_the_network_is_refused(site: str) -> None:
    with pytest.raises(FetchRefused, match=r"169\.254\.169\.254 is a link-local"):
        await fetch(f"{site}/to-metadata")


async def test_the_allow_list_lifts_the_refusal_for_what_it_names(site: str) -> None:
    with pytest.raises(FetchRefused, match="loopback"):
        await fetch(f"{site}/page", FetchSettings())
    assert "Open incidents" in await fetch(f"{site}/page", FetchSettings(allow=["127.0.0.0/8"]))
    by_name = FetchSettings(allow=["localhost"])
    assert "Open incidents" in await fetch(
        site.replace("127.0.0.1", "localhost") + "/page", by_name
    )


async def test_only_http_and_https(site: str) -> None:
    for url in ("file:///etc/passwd", "ftp://example.com/", "javascript:alert(1)"):
        with pytest.raises(FetchRefused, match="is not an http or https URL"):
            await fetch(url)
