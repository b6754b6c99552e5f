"""`fetch_url` against a local web server: HTML to text, limits, and the refusals that keep a
model from reaching inside the network (loopback is refused unless the allow-list names it, so
the tests that read pages allow 127.0.0.1 and the refusal tests do not).

A refusal must come before any connection, not after one: `connections` records every address a
socket connects to during a test, as the socket itself reports it (Python's `socket.connect`
audit event, whichever library opened the socket), and stops any but 127.0.0.1's, so a check
that regresses fails the test without sending a packet off the machine. Audit hooks cannot be
removed, so the one hook stays for the session and acts only while a test holds the fixture."""

import asyncio
import gzip
import sys
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from functools import cache
from ipaddress import ip_address

import pytest
from aiohttp import web

from core.features.fetch import AddressCheck, FetchFailed, FetchRefused, FetchSettings, fetch_tool

PAGE = """<html><head><title>Incidents</title><style>p { color: red }</style>
<script>alert("no")</script></head><body><h1>Open incidents</h1>
<p>The <b>database</b> is slow.</p><ul><li>INC-1</li><li>INC-2</li></ul></body></html>"""
LOCAL = FetchSettings(allow=["127.0.0.1"], timeout=2.0, max_bytes=10_000)
BOMB_SIZE = 50_000_000
"""Bytes the gzip bomb inflates to (from about 50 KB on the wire)."""


class ConnectionLog:
    """The addresses sockets connect to while `recording` is a list (an audit hook); a
    connection anywhere but 127.0.0.1 is stopped, as the local site is all a test may reach."""

    def __init__(self) -> None:
        self.recording: list[object] | None = None

    def __call__(self, event: str, args: tuple[object, ...]) -> None:
        if event != "socket.connect" or self.recording is None:
            return
        address = args[1]
        self.recording.append(address)
        if not (isinstance(address, tuple) and address[0] == "127.0.0.1"):
            raise PermissionError(f"the test stopped a connection to {address} (not 127.0.0.1)")


CONNECTION_LOG = ConnectionLog()
sys.addaudithook(CONNECTION_LOG)


@pytest.fixture
def connections() -> Iterator[list[object]]:
    """Every address a socket connects to during the test."""
    CONNECTION_LOG.recording = made = []
    yield made
    CONNECTION_LOG.recording = None


@cache
def bomb() -> bytes:
    """50 MB of "0" gzipped, compressed a megabyte at a time (never held whole)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    megabyte = b"0" * 1_000_000
    pieces = [compressor.compress(megabyte) for _ in range(BOMB_SIZE // len(megabyte))]
    return b"".join(pieces) + compressor.flush()


def raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


COMPRESSORS: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    "gzip": ("gzip", gzip.compress),
    "deflate": ("deflate", zlib.compress),
    "raw-deflate": ("deflate", raw_deflate),
}
"""Route name: (Content-Encoding sent, how the body is compressed)."""


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

    async def compressed(request: web.Request) -> web.Response:
        encoding, compress = COMPRESSORS[request.match_info["how"]]
        return encoded(compress(PAGE.encode()), encoding, "text/html")

    async def gzip_bomb(_: web.Request) -> web.Response:
        return encoded(bomb(), "gzip", "text/plain")

    async def corrupt(_: web.Request) -> web.Response:
        return encoded(b"\x1f\x8b" + bytes(100), "gzip", "text/plain")

    async def brotli(_: web.Request) -> web.Response:
        return encoded(b"\x0b\x02\x80hello\x03", "br", "text/plain")

    app = web.Application()
    for path, handler in [
        ("/page", page),
        ("/huge", huge),
        ("/image", image),
        ("/slow", slow),
        ("/to-metadata", to_metadata),
        ("/to-page", to_page),
        ("/compressed/{how}", compressed),
        ("/bomb", gzip_bomb),
        ("/corrupt", corrupt),
        ("/brotli", brotli),
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


def encoded(body: bytes, encoding: str, content_type: str) -> web.Response:
    """A response whose body is already `encoding`-compressed, sent as it is."""
    return web.Response(
        body=body, headers={"Content-Encoding": encoding, "Content-Type": content_type}
    )


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


@pytest.mark.parametrize("how", COMPRESSORS)
async def test_a_compressed_page_is_decoded(site: str, how: str) -> None:
    """gzip, zlib-wrapped deflate and the raw deflate some servers send as "deflate"."""
    text = await fetch(f"{site}/compressed/{how}")
    assert "# Open incidents" in text and "The **database** is slow." in text


async def test_a_gzip_bomb_is_cut_at_max_bytes_as_it_inflates(site: str) -> None:
    """Regression, issue 26: `max_bytes` was counted on chunks httpx had already inflated, so
    50 KB of gzip became 50 MB in memory before being cut. Now the cut comes as the body
    inflates, and what is held (tracemalloc's peak, not a timing) stays within the body, one
    decoded chunk of at most what still fits, and the body's text."""
    limit = 1_000_000
    started_here = not tracemalloc.is_tracing()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        text = await fetch(f"{site}/bomb", FetchSettings(allow=["127.0.0.1"], max_bytes=limit))
        held = tracemalloc.get_traced_memory()[1] - before
    finally:
        if started_here:
            tracemalloc.stop()
    assert len(bomb()) < 100_000, "the bomb is small on the wire"
    assert text.startswith(f"{site}/bomb → HTTP 200 (text/plain)\n\n0000")
    assert text.endswith("(cut at 1,000,000 bytes; cut at 20,000 characters)")
    assert held < 3 * limit, f"{held:,} bytes held for a {limit:,}-byte limit"


async def test_a_corrupt_compressed_body_fails_clearly(site: str) -> None:
    with pytest.raises(FetchFailed, match=r"could not be fetched: the gzip body is corrupt"):
        await fetch(f"{site}/corrupt")


async def test_an_encoding_fetch_url_did_not_ask_for_fails_clearly(site: str) -> None:
    with pytest.raises(FetchFailed, match=r"came br-encoded, .* asks for gzip, deflate"):
        await fetch(f"{site}/brotli")


async def test_what_is_not_text_is_described_not_shown(site: str) -> None:
    assert await fetch(f"{site}/image") == (
        f"{site}/image → HTTP 200 (image/png): 104 bytes of image/png content, not text"
    )


async def test_a_page_that_does_not_answer_in_time_fails_clearly(site: str) -> None:
    quick = FetchSettings(allow=["127.0.0.1"], timeout=0.2)
    with pytest.raises(FetchFailed, match=r"did not answer within 0.2 s"):
        await fetch(f"{site}/slow", quick)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.1:9/", "a loopback address"),
        ("http://localhost:9/", r"localhost \(.*\) is a loopback address"),
        ("http://127.1:9/", r"127\.1 \(127\.0\.0\.1\) is a loopback address"),
        ("http://2130706433:9/", r"2130706433 \(127\.0\.0\.1\) is a loopback address"),
        ("http://[::1]:9/", "a loopback address"),
        ("http://10.1.2.3/", "a private or reserved address"),
        ("http://192.168.1.1/", "a private or reserved address"),
        ("http://100.64.0.1/", "a private or reserved address"),
        ("http://169.254.169.254/latest/meta-data/", "a link-local address"),
        ("http://0.0.0.0/", "a private or reserved address"),
        ("http://[::]/", "a private or reserved address"),
        ("http://224.0.0.1/", "a multicast address"),
        ("http://[ff02::1]/", "a multicast address"),
        ("http://[fc00::1]/", "a private or reserved address"),
        ("http://[fe80::1]/", "a link-local address"),
        ("http://[2001:db8::1]/", "a private or reserved address"),
    ],
)
async def test_private_loopback_and_metadata_addresses_are_refused(
    url: str, why: str, connections: list[object]
) -> None:
    with pytest.raises(FetchRefused, match=why):
        await fetch(url, FetchSettings())
    assert connections == [], "refused before any connection"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://[::ffff:127.0.0.1]:9/", r"::ffff:127\.0\.0\.1 \(127\.0\.0\.1\) is a loopback"),
        ("http://[::ffff:169.254.169.254]/", r"\(169\.254\.169\.254\) is a link-local address"),
        ("http://[::ffff:10.0.0.1]/", r"\(10\.0\.0\.1\) is a private or reserved address"),
        ("http://[::127.0.0.1]:9/", r"IPv4-compatible .* leading to 127\.0\.0\.1, a loopback"),
        ("http://[::169.254.169.254]/", r"IPv4-compatible .* 169\.254\.169\.254, a link-local"),
        ("http://[::8.8.8.8]/", r"IPv4-compatible .* ask for 8\.8\.8\.8 itself"),
        ("http://[::ffff:0:127.0.0.1]/", r"IPv4-translated .* 127\.0\.0\.1, a loopback"),
        ("http://[64:ff9b::127.0.0.1]/", r"NAT64 address .* 127\.0\.0\.1, a loopback address"),
        ("http://[64:ff9b::10.1.2.3]/", r"NAT64 address .* 10\.1\.2\.3, a private or reserved"),
        ("http://[64:ff9b::169.254.169.254]/", r"NAT64 address .* 169\.254\.169\.254, a link-"),
        ("http://[64:ff9b:1::808:808]/", r"local-use NAT64 address \(64:ff9b:1::/48\)"),
        ("http://[2002:7f00:1::1]/", r"6to4 address \(2002::/16\) .* 127\.0\.0\.1, a loopback"),
        ("http://[2002:c0a8:101::1]/", r"6to4 address .* 192\.168\.1\.1, a private or reserved"),
        ("http://[2002:a9fe:a9fe::1]/", r"6to4 address .* 169\.254\.169\.254, a link-local"),
        ("http://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/", r"Teredo tunnel address"),
        ("http://[fec0::1]/", r"a site-local address \(fec0::/10, a private network\)"),
    ],
)
async def test_ipv6_spellings_of_inside_addresses_are_refused_before_connecting(
    url: str, why: str, connections: list[object]
) -> None:
    """Regression, issue 26: `is_global` alone passed `[::127.0.0.1]` (and was connected to),
    NAT64 and 6to4 addresses carrying a loopback or private IPv4, and site-local fec0::/10."""
    with pytest.raises(FetchRefused, match=why) as refused:
        await fetch(url, FetchSettings(timeout=2.0))
    assert "a person can allow a host or network in [fetch].allow" in str(refused.value)
    assert connections == [], "refused before any connection"


async def test_an_allowed_address_in_ipv4_mapped_form_is_fetched(
    site: str, connections: list[object]
) -> None:
    """The mapped form is the IPv4 address itself: checked and connected to as 127.0.0.1 (which
    also shows `connections` sees what fetch_url connects to)."""
    port = int(site.rsplit(":", 1)[1])
    text = await fetch(f"http://[::ffff:127.0.0.1]:{port}/page")
    assert "Open incidents" in text
    assert connections == [("127.0.0.1", port)]


@pytest.mark.parametrize(
    ("allow", "address"),
    [
        (["127.0.0.1"], "::127.0.0.1"),
        (["127.0.0.0/8"], "::ffff:0:127.0.0.1"),
        (["127.0.0.1"], "64:ff9b::127.0.0.1"),
        (["10.0.0.0/8"], "64:ff9b::10.1.2.3"),
        (["192.168.1.1"], "2002:c0a8:101::1"),
        (["64:ff9b:1::/48"], "64:ff9b:1::808:808"),
        (["2001::/32"], "2001:0:4136:e378:8000:63bf:3fff:fdd2"),
        (["fec0::/10"], "fec0::1"),
    ],
)
def test_the_allow_list_lifts_the_refusal_for_an_address_or_the_one_it_embeds(
    allow: list[str], address: str
) -> None:
    """Checked without connecting: these addresses lead nowhere from a test machine."""
    assert AddressCheck([]).refusal(address, ip_address(address)) is not None
    assert AddressCheck(allow).refusal(address, ip_address(address)) is None


def test_an_allowed_network_lifts_nothing_else() -> None:
    check = AddressCheck(["10.0.0.0/8"])
    for address in ("2002:c0a8:101::1", "64:ff9b::127.0.0.1", "::ffff:0:172.16.0.1"):
        assert check.refusal(address, ip_address(address)) is not None, address


@pytest.mark.parametrize(
    "address", ["8.8.8.8", "2001:4860:4860::8888", "64:ff9b::8.8.8.8", "2002:808:808::1"]
)
def test_public_addresses_pass_in_every_form_that_reaches_them(address: str) -> None:
    """NAT64 (as DNS64 answers on IPv6-only hosts) and 6to4 of a public IPv4 are public."""
    assert AddressCheck([]).refusal(address, ip_address(address)) is None


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
