"""`fetch_url`: a web page as readable text, without letting the model reach inside the network.

A model can be talked into asking for `http://169.254.169.254/` (a cloud's metadata, with its
credentials) or `http://localhost:5432/`. So every address a request would go to is checked
before any connection is made: the host's DNS answers, every one of them, must be public, and
the connection goes to the address that was checked (the URL's host is kept for the `Host`
header and TLS's server name), so a second DNS answer cannot swap in a private one (DNS
rebinding). Redirects are followed by hand, each hop checked the same way. `[fetch].allow` names
hosts or networks a person trusts (an intranet wiki), which lifts the check for them alone.

What comes back is limited in size (`max_bytes`, read as a stream and cut there) and time
(`timeout` for the whole fetch). HTML becomes Markdown-ish text through `html2text` (a
maintained converter, not hand-written parsing); other text types pass as they are; anything else
is described by its type and size. The result always says the final URL and the status.
"""

import asyncio
import ipaddress
import logging
import socket
from dataclasses import dataclass, field
from typing import Annotated
from urllib.parse import urljoin, urlsplit

import httpx

from core.agent.tools import Tool, tool
from core.errors import KaiwaError

logger = logging.getLogger(__name__)

REDIRECTS = 5
TEXT_TYPES = ("text/", "application/json", "application/xml", "application/xhtml+xml")
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class FetchRefused(KaiwaError):
    """A URL fetch_url will not fetch, in words for the model."""


class FetchFailed(KaiwaError):
    """A fetch that did not come back (a timeout, a refused connection)."""


@dataclass(frozen=True)
class FetchSettings:
    timeout: float = 15.0
    """Seconds for the whole fetch, redirects included."""
    max_bytes: int = 2_000_000
    """Bytes read of a body at most; the rest is cut."""
    max_chars: int = 20_000
    """Characters of text handed to the model at most."""
    allow: list[str] = field(default_factory=list)
    """Hosts ("wiki.internal") or networks ("10.0.0.0/8", "127.0.0.1") fetched even though
    they are private."""
    user_agent: str = "Kaiwa (fetch_url)"


def fetch_tool(settings: FetchSettings) -> Tool:
    """The `fetch_url` tool with `settings`."""
    allowed_hosts, allowed_networks = _allow_list(settings.allow)

    @tool(read_only=True, timeout=settings.timeout + 5)
    async def fetch_url(url: Annotated[str, "an http or https URL"]) -> str:
        """Fetch a web page and return its readable text, with the final URL and status.
        Private, loopback and link-local addresses are refused."""
        try:
            async with asyncio.timeout(settings.timeout):
                return await _fetch(url, settings, allowed_hosts, allowed_networks)
        except TimeoutError as exc:
            raise FetchFailed(f"{url} did not answer within {settings.timeout:g} s") from exc
        except httpx.HTTPError as exc:
            raise FetchFailed(f"{url} could not be fetched: {exc or type(exc).__name__}") from exc

    return fetch_url


async def _fetch(
    url: str, settings: FetchSettings, hosts: frozenset[str], networks: tuple[Network, ...]
) -> str:
    headers = {"User-Agent": settings.user_agent, "Accept": "text/html, text/*;q=0.9, */*;q=0.5"}
    async with httpx.AsyncClient(trust_env=False, follow_redirects=False) as client:
        for _ in range(REDIRECTS + 1):
            target, host, address = await _checked(url, hosts, networks)
            request = client.build_request(
                "GET",
                target,
                headers={**headers, "Host": host},
                extensions={"sni_hostname": urlsplit(url).hostname or host},
            )
            response = await client.send(request, stream=True)
            try:
                if response.is_redirect and "location" in response.headers:
                    url = urljoin(url, response.headers["location"])
                    continue
                body, cut = await _read(response, settings.max_bytes)
            finally:
                await response.aclose()
            logger.info(
                "fetch_url %s (%s): %d, %d bytes", url, address, response.status_code, len(body)
            )
            return _described(url, response, body, cut, settings.max_chars)
    raise FetchRefused(f"{url}: more than {REDIRECTS} redirects; not followed further")


async def _checked(
    url: str, hosts: frozenset[str], networks: tuple[Network, ...]
) -> tuple[str, str, Address]:
    """The URL to connect to (its host replaced by a checked address), the Host header, and
    the address. `FetchRefused` for a URL that is not http(s), or whose host is private."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchRefused(f"{url!r} is not an http or https URL")
    host = parts.hostname.lower()
    port = parts.port or (443 if parts.scheme == "https" else 80)
    addresses = await _resolve(host, port)
    trusted = host in hosts
    for address in addresses:
        if not trusted and not any(address in network for network in networks):
            _refuse_private(url, host, address)
    address = addresses[0]
    netloc = f"[{address}]" if address.version == 6 else str(address)
    target = parts._replace(netloc=f"{netloc}:{port}").geturl()
    host_header = parts.netloc.rsplit("@", 1)[-1]
    return target, host_header, address


async def _resolve(host: str, port: int) -> list[Address]:
    try:
        literal = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    else:
        return [_unmapped(literal)]
    try:
        answers = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise FetchRefused(f"{host} could not be resolved ({exc.strerror})") from exc
    found = [_unmapped(ipaddress.ip_address(answer[4][0].split("%")[0])) for answer in answers]
    return list(dict.fromkeys(found))


def _unmapped(address: Address) -> Address:
    """An IPv4-mapped IPv6 address (::ffff:127.0.0.1) as the IPv4 address it is."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _refuse_private(url: str, host: str, address: Address) -> None:
    if address.is_global and not address.is_multicast:
        return
    kind = (
        "loopback"
        if address.is_loopback
        else "link-local (cloud metadata lives there)"
        if address.is_link_local
        else "private or reserved"
    )
    logger.warning("fetch_url refused %s: %s is %s (%s)", url, host, kind, address)
    raise FetchRefused(
        f"{url} refused: {host} is a {kind} address ({address}); fetch_url only reaches the "
        "public internet (a person can allow a host in [fetch].allow)"
    )


async def _read(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """The body, at most `limit` bytes, and whether it was cut there."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return b"".join(chunks)[:limit], True
    return b"".join(chunks), False


def _described(url: str, response: httpx.Response, body: bytes, cut: bool, max_chars: int) -> str:
    kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
    head = f"{url} → HTTP {response.status_code} ({kind or 'no content type'})"
    if not kind.startswith(TEXT_TYPES):
        return f"{head}: {len(body):,} bytes of {kind or 'unknown'} content, not text"
    text = body.decode(response.encoding or "utf-8", errors="replace")
    if kind in ("text/html", "application/xhtml+xml"):
        text = _readable(text)
    notes = []
    if cut:
        notes.append(f"cut at {len(body):,} bytes")
    if len(text) > max_chars:
        text = text[:max_chars]
        notes.append(f"cut at {max_chars:,} characters")
    suffix = f"\n({'; '.join(notes)})" if notes else ""
    return f"{head}\n\n{text.strip()}{suffix}"


def _readable(html: str) -> str:
    import html2text  # loaded with the first HTML page, not with Kaiwa

    converter = html2text.HTML2Text()
    converter.ignore_images = True
    converter.body_width = 0  # no hard wrapping: the model reads lines whole
    return converter.handle(html)


def _allow_list(entries: list[str]) -> tuple[frozenset[str], tuple[Network, ...]]:
    hosts, networks = set(), []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            hosts.add(entry.strip().lower())
    return frozenset(hosts), tuple(networks)
