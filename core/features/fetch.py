"""`fetch_url`: a web page as readable text, without letting the model reach inside the network.

A model can be talked into asking for `http://169.254.169.254/` (a cloud's metadata, with its
credentials) or `http://localhost:5432/`. So every address a request would go to is checked
before any connection is made: the host's DNS answers, every one of them, must be public, and
the connection goes to the address that was checked (the URL's host is kept for the `Host`
header and TLS's server name), so a second DNS answer cannot swap in a private one (DNS
rebinding). Redirects are followed by hand, each hop checked the same way. `[fetch].allow` names
hosts or networks a person trusts (an intranet wiki), which lifts the check for them alone.

`ipaddress`'s `is_global` alone lets through IPv6 spellings of inside addresses, so
`AddressCheck` refuses, besides private, loopback, link-local, multicast and reserved addresses:
- IPv6 outside global unicast (2000::/3), which takes in site-local fec0::/10 and the reserved
  ::/8 with its IPv4-compatible (`::a.b.c.d`) and IPv4-translated (`::ffff:0:a.b.c.d`) forms,
  refused even for a public IPv4: nothing routes them;
- NAT64 (64:ff9b::/96) and 6to4 (2002::/16) addresses whose embedded IPv4 is not public
  (they reach that IPv4 address; with a public one they are fine);
- local-use NAT64 (64:ff9b:1::/48), where the operator picks how the IPv4 address is carried,
  and Teredo (2001::/32), a tunnel to a host behind some NAT (its address carries the NAT's
  outside address, not the host's, and Teredo is all but retired): neither says checkably
  where it leads, so they are refused outright.
IPv4-mapped addresses (`::ffff:a.b.c.d`) are the IPv4 address they map, checked and connected to
as such. An allowed network lifts the refusal for an address in it and for one embedding an
address in it (NAT64 of an allowed 10.0.0.5 is fine).

What comes back is limited in size (`max_bytes` of the decoded body, gzip or deflate undone here a
network chunk at a time and never past the limit, so a small compressed body cannot inflate in
memory) and time (`timeout` for the whole fetch). HTML becomes Markdown-ish text through
`html2text` (a maintained converter, not hand-written parsing); other text types pass as they
are; anything else is described by its type and size. The result always says the final URL and
the status.
"""

import asyncio
import contextlib
import ipaddress
import logging
import socket
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Annotated
from urllib.parse import urljoin, urlsplit

import httpx

from core.agent.tools import Tool, tool
from core.errors import KaiwaError

logger = logging.getLogger(__name__)

REDIRECTS = 5
TEXT_TYPES = ("text/", "application/json", "application/xml", "application/xhtml+xml")
ACCEPT_ENCODING = "gzip, deflate"
"""What fetch_url asks servers to compress with: what it undoes itself, bounded."""
COMPRESSED = frozenset({"gzip", "x-gzip", "deflate"})
UNENCODED = frozenset({"", "identity"})
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
IN_LOW_32_BITS = {
    NAT64: "a NAT64 address (64:ff9b::/96)",
    IPV4_COMPATIBLE: "an IPv4-compatible address (::/96)",
    ipaddress.IPv6Network("::ffff:0:0:0/96"): "an IPv4-translated address (::ffff:0:0:0/96)",
}
"""IPv6 forms that carry the IPv4 address they lead to in their last 32 bits."""
LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")
TEREDO = ipaddress.IPv6Network("2001::/32")
UNCHECKABLE = {
    TEREDO: "a Teredo tunnel address (2001::/32), which ends at a host behind a NAT that this "
    "check cannot see into",
    LOCAL_NAT64: "a local-use NAT64 address (64:ff9b:1::/48), which the local network "
    "translates to an IPv4 address this check cannot see",
}


class FetchRefused(KaiwaError):
    """A URL fetch_url will not fetch, in words for the model."""


class FetchFailed(KaiwaError):
    """A fetch that did not come back (a timeout, a refused connection)."""


@dataclass(frozen=True)
class FetchSettings:
    timeout: float = 15.0
    """Seconds for the whole fetch, redirects included."""
    max_bytes: int = 2_000_000
    """Bytes of a body read at most, counted after gzip or deflate is undone; the rest is cut."""
    max_chars: int = 20_000
    """Characters of text handed to the model at most."""
    allow: list[str] = field(default_factory=list)
    """Hosts ("wiki.internal") or networks ("10.0.0.0/8", "127.0.0.1") fetched even though
    they are private; a network also allows IPv6 addresses embedding an address in it."""
    user_agent: str = "Kaiwa (fetch_url)"


class AddressCheck:
    """Which addresses fetch_url may connect to: public ones, and what `[fetch].allow` names."""

    def __init__(self, allow: Iterable[str]) -> None:
        hosts: set[str] = set()
        networks: list[Network] = []
        for entry in allow:
            try:
                networks.append(ipaddress.ip_network(entry.strip(), strict=False))
            except ValueError:
                hosts.add(entry.strip().lower())
        self.hosts = frozenset(hosts)
        self.networks = tuple(networks)

    def refusal(self, host: str, address: Address) -> str | None:
        """Why `host` at `address` is not fetched ("a loopback address"), or None if it is."""
        embedded = _embedded_ipv4(address)
        if host in self.hosts or self._allows(address):
            return None
        if embedded is not None and self._allows(embedded[1]):
            return None
        return _not_public(address, embedded)

    def _allows(self, address: Address) -> bool:
        return any(address in network for network in self.networks)


def fetch_tool(settings: FetchSettings) -> Tool:
    """The `fetch_url` tool with `settings`."""
    check = AddressCheck(settings.allow)

    @tool(read_only=True, timeout=settings.timeout + 5)
    async def fetch_url(url: Annotated[str, "an http or https URL"]) -> str:
        """Fetch a web page and return its readable text, with the final URL and status.
        Addresses inside a network (private, loopback, link-local, in any IPv4 or IPv6
        spelling) are refused."""
        try:
            async with asyncio.timeout(settings.timeout):
                return await _fetch(url, settings, check)
        except TimeoutError as exc:
            raise FetchFailed(f"{url} did not answer within {settings.timeout:g} s") from exc
        except httpx.HTTPError as exc:
            raise FetchFailed(f"{url} could not be fetched: {exc or type(exc).__name__}") from exc

    return fetch_url


async def _fetch(url: str, settings: FetchSettings, check: AddressCheck) -> str:
    headers = {
        "User-Agent": settings.user_agent,
        "Accept": "text/html, text/*;q=0.9, */*;q=0.5",
        "Accept-Encoding": ACCEPT_ENCODING,
    }
    async with httpx.AsyncClient(trust_env=False, follow_redirects=False) as client:
        for _ in range(REDIRECTS + 1):
            target, host, address = await _checked(url, check)
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


async def _checked(url: str, check: AddressCheck) -> tuple[str, str, Address]:
    """The URL to connect to (its host replaced by a checked address), the Host header, and
    the address. `FetchRefused` for a URL that is not http(s), or whose host is private."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchRefused(f"{url!r} is not an http or https URL")
    host = parts.hostname.lower()
    port = parts.port or (443 if parts.scheme == "https" else 80)
    addresses = await _resolve(host, port)
    for address in addresses:
        reason = check.refusal(host, address)
        if reason is not None:
            _refuse(url, host, address, reason)
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


Embedded = tuple[str, ipaddress.IPv4Address]
"""An IPv6 form ("a 6to4 address (2002::/16)") and the IPv4 address it carries."""


def _embedded_ipv4(address: Address) -> Embedded | None:
    """The IPv4 address an IPv6 one carries and leads to (6to4, NAT64, the ::/96 forms)."""
    if isinstance(address, ipaddress.IPv4Address) or address.is_loopback or address.is_unspecified:
        return None
    if address.sixtofour is not None:
        return "a 6to4 address (2002::/16)", address.sixtofour
    for network, form in IN_LOW_32_BITS.items():
        if address in network:
            return form, ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return None


def _not_public(address: Address, embedded: Embedded | None) -> str | None:
    """Why `address` is not on the public internet, or None if it is."""
    for network, reason in UNCHECKABLE.items():
        if address in network:
            return reason
    if embedded is None:
        return _kind(address)
    form, ipv4 = embedded
    inner = _kind(ipv4)
    if inner is not None:
        return f"{form} leading to {ipv4}, {inner}"
    if address in NAT64 or address.sixtofour is not None:
        return None
    return f"{form} leading to {ipv4}, a form the internet does not route; ask for {ipv4} itself"


def _kind(address: Address) -> str | None:
    """What kind of inside address `address` is, or None for a public one."""
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address (cloud metadata lives there)"
    if address.is_multicast:
        return "a multicast address"
    if isinstance(address, ipaddress.IPv6Address) and address.is_site_local:
        return "a site-local address (fec0::/10, a private network)"
    if not address.is_global or (address.version == 6 and address not in GLOBAL_UNICAST):
        return "a private or reserved address"
    return None


def _refuse(url: str, host: str, address: Address, reason: str) -> None:
    named = host if host == str(address) else f"{host} ({address})"
    logger.warning("fetch_url refused %s: %s is %s", url, named, reason)
    raise FetchRefused(
        f"{url} refused: {named} is {reason}. fetch_url only reaches the public internet, and "
        "refuses every spelling of an address inside the network; a person can allow a host or "
        "network in [fetch].allow"
    )


async def _read(response: httpx.Response, limit: int) -> tuple[bytearray, bool]:
    """The body, decoded, at most `limit` bytes, and whether it was cut there. It is decoded
    here a network chunk at a time, asking zlib for no more than still fits, so what is held
    stays within `limit` and one chunk however far a compressed body would inflate."""
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding not in UNENCODED | COMPRESSED:
        raise httpx.DecodingError(
            f"the body came {encoding}-encoded, which fetch_url does not decode (it asks for "
            f"{ACCEPT_ENCODING})",
            request=response.request,
        )
    inflater = _Inflater() if encoding in COMPRESSED else None
    body = bytearray()
    try:
        async with contextlib.aclosing(response.aiter_raw()) as chunks:
            async for chunk in chunks:
                room = limit - len(body)
                piece = chunk if inflater is None else inflater.inflate(chunk, room + 1)
                body += memoryview(piece)[:room]
                if len(piece) > room:
                    return body, True
                if inflater is not None and inflater.finished:
                    break
    except zlib.error as exc:
        raise httpx.DecodingError(
            f"the {encoding} body is corrupt ({exc})", request=response.request
        ) from exc
    return body, False


class _Inflater:
    """gzip or deflate undone a chunk at a time, never giving more than asked for. Which of
    gzip, zlib-wrapped or raw deflate a body is comes from its first two bytes, as browsers
    tell (servers mislabel raw deflate)."""

    def __init__(self) -> None:
        self._start = b""
        self._zlib: zlib._Decompress | None = None

    @property
    def finished(self) -> bool:
        """Whether the compressed stream has ended (what may follow it is not read)."""
        return self._zlib is not None and self._zlib.eof

    def inflate(self, chunk: bytes, most: int) -> bytes:
        """What `chunk` decodes to, at most `most` bytes. What would come past that is left
        undecoded: the reader stops once it has more than fits."""
        if self._zlib is None:
            self._start += chunk
            if len(self._start) < 2:
                return b""
            self._zlib = zlib.decompressobj(_window_bits(self._start))
            chunk, self._start = self._start, b""
        return self._zlib.decompress(chunk, most)


def _window_bits(start: bytes) -> int:
    """zlib's `wbits` for a stream starting with `start`: gzip, zlib-wrapped or raw deflate."""
    if start[:2] == b"\x1f\x8b":
        return 16 + zlib.MAX_WBITS
    if start[0] & 0x0F == 8 and int.from_bytes(start[:2], "big") % 31 == 0:
        return zlib.MAX_WBITS
    return -zlib.MAX_WBITS


def _described(
    url: str, response: httpx.Response, body: bytearray, cut: bool, max_chars: int
) -> str:
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
