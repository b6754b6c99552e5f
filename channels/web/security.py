"""Who may use the web chat, and the checks every request of it passes: small pieces the
handlers call (`channels.web.api`), since the HTTP server is shared with other mounts
(`channels.http_server`) and so has no middleware of the web chat's own.

- Sign-in is a one-time link (`Links`): its secret is kept only as a sha256 hash, with an expiry,
  in `<data_dir>/web.links`, so `kaiwa web-link`, another process, can add a link the running
  Kaiwa accepts. Redeeming it removes it. Failures are limited per client address
  (`LoginLimiter`), so the secret cannot be guessed by asking.
- A session is a cookie (`COOKIE`) carrying the person and its issue time, signed with
  HMAC-SHA256 by the random key in `<data_dir>/web.key` (`Keys`): sessions survive a restart, and
  deleting the file signs every browser out.
- `check_request` refuses what a browser would send for another site: a Host that is not ours
  (DNS rebinding: 421), a foreign Origin (403), and for a POST a missing Origin, a missing
  `X-Kaiwa: 1` header (a form of another site cannot send one) or a body that is not JSON. No
  CORS header is ever sent, so no other origin can read an answer.
- `with_headers` puts the Content-Security-Policy (no inline script or style, nothing from
  elsewhere: a second wall behind `channels.web.markup`'s sanitizer) and the other headers on
  every answer.
- `People` says who a request is: the operator, by the cookie their link set, or, for a team,
  the person a reverse proxy names in `[channels.web].user_header`. That header is anyone's to
  write, so it counts only on a request from one of `trusted_proxies` (its peer address, never a
  header about it); and a name must be safe in a conversation's place (no ":", at most 128
  characters, never "operator"). Whether that person may use the chat is `allowed_users`, as on
  the platforms (the dispatcher refuses their messages, `channels.web.api` the page).
- `check_settings` keeps the server on loopback unless a team signs in through a trusted proxy:
  elsewhere the operator's link would be the only wall.

Both files are written whole to a temporary file of mode 0600 and moved into place, while the
data directory is locked (`flock`) against the other processes of that directory; secrets are
compared with `hmac.compare_digest`. No secret is logged or put into an error here.
"""

import base64
import fcntl
import hashlib
import hmac
import ipaddress
import json
import os
import re
import secrets
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from aiohttp import web

from channels.settings import WebSettings
from core.errors import ConfigError

COOKIE = "kaiwa_session"
SESSION_SECONDS = 30 * 24 * 3600
"""How long a session cookie signs in before its browser needs a new link."""
LINK_SECONDS = 24 * 3600
"""How long a one-time link can be used."""

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
OPERATOR = WebSettings.OPERATOR
MAX_NAME = 128
"""The longest name a proxy may give a person."""
_HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")

Clock = Callable[[], float]
AnyResponse = TypeVar("AnyResponse", bound=web.StreamResponse)


class Keys:
    """Session cookies, signed with the key in `path` (made, mode 0600, when there is none)."""

    def __init__(
        self, path: Path, *, lifetime: float = SESSION_SECONDS, clock: Clock = time.time
    ) -> None:
        self._key = _key(path)
        self._lifetime = lifetime
        self._clock = clock

    def cookie_for(self, person: str) -> str:
        """The value of a session cookie for `person`, issued now."""
        signed = f"{_b64(person.encode())}.{int(self._clock())}"
        return f"{signed}.{self._mac(signed)}"

    def person_of(self, cookie: str | None) -> str | None:
        """Whose session `cookie` is; None when there is none, or it is forged, damaged or old."""
        signed, _, mac = (cookie or "").rpartition(".")
        name, _, issued = signed.partition(".")
        if not (mac and issued.isdigit()) or not _same(mac, self._mac(signed)):
            return None
        if not 0 <= self._clock() - int(issued) < self._lifetime:
            return None
        return base64.urlsafe_b64decode(name + "=" * (-len(name) % 4)).decode()

    def sign_in(self, response: web.StreamResponse, person: str) -> None:
        """Set `person`'s session cookie on `response` (HttpOnly, SameSite=Strict, Path=/)."""
        response.set_cookie(
            COOKIE,
            self.cookie_for(person),
            max_age=int(self._lifetime),
            path="/",
            httponly=True,
            samesite="Strict",
        )

    def _mac(self, signed: str) -> str:
        return hmac.new(self._key, signed.encode(), hashlib.sha256).hexdigest()


class Links:
    """One-time sign-in links, kept hashed with their expiry in `path` (mode 0600), so any
    process of the data directory can make one that another redeems."""

    def __init__(self, path: Path, *, lifetime: float = LINK_SECONDS, clock: Clock = time.time):
        self._path = path
        self._lifetime = lifetime
        self._clock = clock

    def make(self) -> str:
        """A new link's secret (32 random bytes, urlsafe), usable once within the lifetime."""
        secret = secrets.token_urlsafe(32)
        with _locked(self._path.parent):
            links = self._unexpired()
            links[_digest(secret)] = self._clock() + self._lifetime
            _write_private(self._path, json.dumps(links))
        return secret

    def redeem(self, secret: str) -> bool:
        """Whether `secret` is a link made and not yet used or expired; it is used up now."""
        digest = _digest(secret)
        with _locked(self._path.parent):
            links = self._unexpired()
            found = [kept for kept in links if _same(kept, digest)]
            for kept in found:
                del links[kept]
            _write_private(self._path, json.dumps(links))
        return bool(found)

    def _unexpired(self) -> dict[str, float]:
        now = self._clock()
        return {digest: expiry for digest, expiry in _links(self._path).items() if expiry > now}


class LoginLimiter:
    """At most `failures` failed sign-ins per client address within `window` seconds."""

    def __init__(
        self, *, failures: int = 10, window: float = 600.0, clock: Clock = time.monotonic
    ) -> None:
        self._failures = failures
        self._window = window
        self._clock = clock
        self._seen: dict[str, deque[float]] = {}

    def allowed(self, address: str) -> float | None:
        """None when `address` may try to sign in now; else the seconds it must wait."""
        recent = self._recent(address)
        if len(recent) < self._failures:
            return None
        return recent[0] + self._window - self._clock()

    def failed(self, address: str) -> None:
        """`address` tried a link that was wrong, used or expired."""
        self._recent(address).append(self._clock())

    def _recent(self, address: str) -> deque[float]:
        recent = self._seen.setdefault(address, deque())
        while recent and recent[0] <= self._clock() - self._window:
            recent.popleft()
        return recent


class People:
    """Who a request is signed in as, and whether they may use the web chat.

    The session cookie comes first: a browser that opened the operator's link is the operator's,
    through the proxy too. Else the person the proxy names, when the request's peer is one of
    `trusted_proxies`; from any other address the header is ignored (the request is unsigned)."""

    def __init__(self, keys: Keys, settings: WebSettings) -> None:
        self._keys = keys
        self._header = settings.user_header
        self._proxies = [_network(each) for each in settings.trusted_proxies]
        self._allowed = None if settings.anyone else {*settings.allowed_users, OPERATOR}
        self.team = bool(settings.user_header)
        """Whether a proxy signs people in besides the operator's link."""

    def of(self, request: web.BaseRequest) -> str | None:
        """Who `request` is signed in as; None: no one. A name the proxy gives that cannot be a
        person's is refused (HTTPBadRequest, saying why)."""
        return self._keys.person_of(request.cookies.get(COOKIE)) or self.named(request)

    def named(self, request: web.BaseRequest) -> str | None:
        """The person the trusted proxy names in `request`, None when it names none (or the
        request did not come from it)."""
        if not self._header or not self._trusted(request.remote):
            return None
        name = request.headers.get(self._header, "")
        problem = _name_problem(name)
        if problem is not None:
            raise web.HTTPBadRequest(
                text=f"Kaiwa's web chat cannot sign in the person its proxy named: {problem}. "
                "The proxy's [channels.web].user_header must name people otherwise",
                headers=_HEADERS | {"Cache-Control": "no-store"},
            )
        return name or None

    def may_use(self, person: str) -> bool:
        """Whether `person` is the operator, in `allowed_users`, or anyone may (`anyone`)."""
        return self._allowed is None or person in self._allowed

    def sign_in_operator(self, response: web.StreamResponse) -> None:
        """Set the operator's session cookie on `response` (their link was redeemed)."""
        self._keys.sign_in(response, OPERATOR)

    def client(self, request: web.BaseRequest) -> str:
        """Whom `request`'s failed sign-ins count against: the person the proxy names (behind a
        proxy every request comes from its address, so that would lock a whole team out), else
        the peer address."""
        named = self.named(request)
        return f"{named} (named by the proxy)" if named else request.remote or ""

    def _trusted(self, remote: str | None) -> bool:
        try:
            address = ipaddress.ip_address(remote or "")
        except ValueError:
            return False
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped  # an IPv4 peer of a dual-stack socket
        return any(address in network for network in self._proxies)


def check_request(
    request: web.BaseRequest,
    *,
    served_host: str,
    served_port: int,
    allowed_hosts: Collection[str],
    post: bool,
) -> web.Response | None:
    """The refusal of a request the web chat must not answer, None when it may. `served_host`
    and `served_port`: what the server listens on; `allowed_hosts`: `[channels.web]
    .allowed_hosts`, names (with a port or not: then any) the page may also be reached by."""
    host = request.headers.get("Host", "").lower()
    if not _our_host(host, served_host, served_port, allowed_hosts):
        return _refusal(
            421,
            "This address is not one Kaiwa's web chat answers at: open the link Kaiwa printed, "
            "or add the host to [channels.web].allowed_hosts",
        )
    origin = request.headers.get("Origin")
    own = (f"http://{host}", f"https://{host}")
    if (origin is None and post) or (origin is not None and origin.lower() not in own):
        return _refusal(403, "Only Kaiwa's own web chat page may ask this")
    if post and request.headers.get("X-Kaiwa") != "1":
        return _refusal(403, "Only Kaiwa's own web chat page may post (the X-Kaiwa header)")
    if post and request.content_type != "application/json":
        return _refusal(415, "Kaiwa's web chat takes a JSON body (Content-Type: application/json)")
    return None


def with_headers(response: AnyResponse, *, page: bool) -> AnyResponse:
    """`response` with the security headers; `page`: it answers `/` or `/api/*`, holding the
    person's conversations, so it is never cached (static files may be)."""
    response.headers.update(_HEADERS)
    if page:
        response.headers["Cache-Control"] = "no-store"
    return response


def check_settings(settings: WebSettings) -> None:
    """A ConfigError for `[channels.web]` settings that would leave the chat open: a `user_header`
    without the proxies it may come from, or a host other machines can reach without a proxy in
    front (loopback: 127.0.0.0/8, ::1, localhost)."""
    header, proxies = settings.user_header, settings.trusted_proxies
    if header and not _HEADER_NAME.fullmatch(header):
        raise ConfigError(
            f'[channels.web].user_header is "{header}", which is not a header name: write one '
            'like "X-Forwarded-User"'
        )
    for each in proxies:
        _network(each)
    if header and not proxies:
        raise ConfigError(
            f'[channels.web].user_header is "{header}" but [channels.web].trusted_proxies is '
            "empty: list the addresses or networks the proxy connects from (e.g. "
            '["127.0.0.1"]); from any other, anyone could write the header'
        )
    if not header and not _loopback(settings.host):
        shown = settings.host or '""'
        raise ConfigError(
            f"[channels.web].host is {shown}, which other machines can reach, and the "
            "web chat's only sign-in is the operator's link: keep host = \"127.0.0.1\" and reach "
            "it through an SSH tunnel or a reverse proxy, or sign a team in through a reverse "
            "proxy that names each person ([channels.web].user_header and trusted_proxies)"
        )


def _network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """`text`, an address or a network of `[channels.web].trusted_proxies`, as a network."""
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise ConfigError(
            f'[channels.web].trusted_proxies has "{text}", which is not an address or a '
            'network: write one like "10.0.0.5" or "10.0.0.0/24"'
        ) from None


def _name_problem(name: str) -> str | None:
    """Why `name` cannot be a person's in a conversation's place, None when it can."""
    if ":" in name:
        return f'"{name[:MAX_NAME]}" has a ":", which separates the parts of a place'
    if len(name) > MAX_NAME:
        return f"the name is longer than {MAX_NAME} characters"
    if name == OPERATOR:
        return f'"{OPERATOR}" is the name of the operator\'s own sign-in (their link)'
    return None


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False


def _our_host(host: str, served_host: str, port: int, allowed_hosts: Collection[str]) -> bool:
    served = {_bracketed(served_host.lower()), *_LOOPBACK_NAMES}
    ours = {f"{name}:{port}" for name in served} | (served if port == 80 else set())
    allowed = {name.lower() for name in allowed_hosts}
    return host in ours or host in allowed or _name(host) in allowed


def _bracketed(host: str) -> str:
    """`host` as a Host header writes it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _name(host: str) -> str:
    """The Host header `host` without its port."""
    return host if host.endswith("]") or ":" not in host else host.rpartition(":")[0]


def _refusal(status: int, reason: str) -> web.Response:
    return with_headers(web.Response(status=status, text=reason), page=True)


def _key(path: Path) -> bytes:
    """The key kept in `path`, made there first when there is none."""
    with _locked(path.parent):
        try:
            text = path.read_text()
        except FileNotFoundError:
            key = secrets.token_bytes(32)
            _write_private(path, key.hex() + "\n")
            return key
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        key = b""
    if len(key) != 32:
        raise ConfigError(
            f"{path} is not a key Kaiwa made (64 hex digits): delete it, and Kaiwa makes a new "
            "one as it starts (every browser then signs in again with a new link)"
        )
    return key


def _links(path: Path) -> dict[str, float]:
    """The links kept in `path`: hash → expiry (seconds since the epoch)."""
    try:
        links = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError:  # UnicodeDecodeError too
        links = None
    if not isinstance(links, dict) or not all(
        isinstance(expiry, int | float) for expiry in links.values()
    ):
        raise ConfigError(
            f"{path} is not a list of links Kaiwa made: delete it, and make a new link with "
            "`kaiwa web-link`"
        )
    return links


def _same(given: str, kept: str) -> bool:
    """Whether two secrets (or their hashes) are one, in a time that does not tell how alike."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), kept.encode())


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """`directory` locked against the other processes that lock it (a read and a write of one of
    its files then never interleave with theirs)."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def _write_private(path: Path, text: str) -> None:
    """`path` holds `text` (mode 0600), written whole to a temporary file and moved there."""
    temporary = path.with_name(f"{path.name}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)  # a temporary file left by a crash keeps its own mode else
    with os.fdopen(descriptor, "w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
