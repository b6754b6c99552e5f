"""Who may use the web chat, and what every request of it must be: signed session cookies that
survive a restart, one-time links any process can make, a limit on failed sign-ins, the person
a trusted proxy names, the Host and Origin checks against DNS rebinding and other sites' pages,
and the security headers. Real files in a temporary directory; requests by a real aiohttp client
to a real server on 127.0.0.1."""

import base64
import contextlib
import dataclasses
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from channels.settings import WebSettings
from channels.web.security import (
    COOKIE,
    CSP,
    Keys,
    Links,
    LoginLimiter,
    People,
    check_request,
    check_settings,
    with_headers,
)
from core.errors import ConfigError


class Clock:
    """Time that moves only when a test says so."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- sessions ------------------------------------------------------------------------------------


def test_a_session_cookie_survives_a_restart(tmp_path: Path) -> None:
    cookie = Keys(tmp_path / "web.key").cookie_for("operator")
    assert Keys(tmp_path / "web.key").person_of(cookie) == "operator"


def test_a_cookie_signed_with_another_key_is_refused(tmp_path: Path) -> None:
    cookie = Keys(tmp_path / "web.key").cookie_for("operator")
    assert Keys(tmp_path / "other.key").person_of(cookie) is None


def test_a_tampered_cookie_is_refused(tmp_path: Path) -> None:
    keys = Keys(tmp_path / "web.key")
    person, issued, mac = keys.cookie_for("operator").split(".")
    admin = base64.urlsafe_b64encode(b"admin").decode().rstrip("=")
    flipped = mac[:-1] + ("0" if mac[-1] != "0" else "1")
    for cookie in [
        f"{admin}.{issued}.{mac}",
        f"{person}.{int(issued) + 1}.{mac}",
        f"{person}.{issued}.{flipped}",
        f"{person}.{issued}",
        f"{person}.{issued}.{mac}é",
        "",
        "nonsense",
        None,
    ]:
        assert keys.person_of(cookie) is None, cookie


def test_a_session_ends_after_its_lifetime(tmp_path: Path) -> None:
    clock = Clock()
    keys = Keys(tmp_path / "web.key", lifetime=3600, clock=clock)
    cookie = keys.cookie_for("operator")
    clock.now += 3599
    assert keys.person_of(cookie) == "operator"
    clock.now += 1
    assert keys.person_of(cookie) is None


def test_the_key_file_is_the_owners_alone(tmp_path: Path) -> None:
    Keys(tmp_path / "web.key")
    assert mode(tmp_path / "web.key") == 0o600


def test_a_damaged_key_file_is_named_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "web.key").write_text("not a key\n")
    with pytest.raises(ConfigError, match=r"web\.key is not a key Kaiwa made.*delete it"):
        Keys(tmp_path / "web.key")


# -- one-time links ------------------------------------------------------------------------------


def test_a_link_signs_in_once(tmp_path: Path) -> None:
    links = Links(tmp_path / "web.links")
    secret = links.make()
    assert links.redeem(secret)
    assert not links.redeem(secret)


def test_a_link_never_made_is_refused(tmp_path: Path) -> None:
    links = Links(tmp_path / "web.links")
    links.make()
    assert not links.redeem("a-guess")
    assert not links.redeem("")
    assert not links.redeem("\udcff")


def test_an_expired_link_is_refused(tmp_path: Path) -> None:
    clock = Clock()
    links = Links(tmp_path / "web.links", lifetime=600, clock=clock)
    old = links.make()
    clock.now += 300
    fresh = links.make()
    clock.now += 300
    assert not links.redeem(old)
    assert links.redeem(fresh)


def test_a_link_made_by_another_process_is_accepted(tmp_path: Path) -> None:
    """`kaiwa web-link` adds a link that the running Kaiwa, which read the file before, takes."""
    running = Links(tmp_path / "web.links")
    before = running.make()
    made = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from channels.web.security import Links; "
            "print(Links(Path(sys.argv[1])).make())",
            str(tmp_path / "web.links"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert running.redeem(made.stdout.strip())
    assert running.redeem(before), "the other process kept the links it found"


def test_links_are_kept_hashed_in_a_file_of_the_owners_alone(tmp_path: Path) -> None:
    secret = Links(tmp_path / "web.links").make()
    assert secret not in (tmp_path / "web.links").read_text()
    assert mode(tmp_path / "web.links") == 0o600


def test_a_temporary_file_left_by_a_crash_does_not_lend_its_mode(tmp_path: Path) -> None:
    (tmp_path / "web.links.tmp").write_text("{}")
    (tmp_path / "web.links.tmp").chmod(0o644)
    Links(tmp_path / "web.links").make()
    assert mode(tmp_path / "web.links") == 0o600


def test_a_damaged_links_file_is_named_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "web.links").write_text("[1, 2]")
    with pytest.raises(ConfigError, match=r"web\.links is not a list of links.*kaiwa web-link"):
        Links(tmp_path / "web.links").redeem("anything")


# -- failed sign-ins -----------------------------------------------------------------------------


def test_the_eleventh_failure_from_an_address_waits() -> None:
    clock = Clock()
    limiter = LoginLimiter(clock=clock)
    for _ in range(10):
        assert limiter.allowed("192.0.2.1") is None
        limiter.failed("192.0.2.1")
        clock.now += 10

    wait = limiter.allowed("192.0.2.1")
    assert wait == 600 - 100, "until the first failure is ten minutes old"
    assert limiter.allowed("192.0.2.2") is None, "another address is not held up"

    clock.now += wait
    assert limiter.allowed("192.0.2.1") is None


# -- requests ------------------------------------------------------------------------------------

ALLOWED_HOSTS = ["chat.example.com", "proxy.example.com:8443"]
Client = TestClient[web.Request, web.Application]


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    """A server answering every path after the checks, on 127.0.0.1 at a port of its own."""
    served: list[int] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        refusal = check_request(
            request,
            served_host="127.0.0.1",
            served_port=served[0],
            allowed_hosts=ALLOWED_HOSTS,
            post=request.method == "POST",
        )
        if refusal is not None:
            return refusal
        return with_headers(web.json_response({"ok": True}), page=request.path != "/static")

    application = web.Application()
    application.router.add_route("*", "/{path:.*}", answer)
    async with TestClient(TestServer(application, host="127.0.0.1")) as client:
        assert client.port is not None
        served.append(client.port)
        yield client


def page(client: Client) -> str:
    return f"http://127.0.0.1:{client.port}"


def posting(client: Client, **headers: str) -> dict[str, str]:
    """The headers of the page's own POST, `headers` changed."""
    return {"Origin": page(client), "X-Kaiwa": "1", **headers}


async def test_answers_carry_the_security_headers(client: Client) -> None:
    for path, cached in [("/api/conversations", False), ("/", False), ("/static", True)]:
        async with client.get(path) as answer:
            assert answer.status == 200
            assert answer.headers["Content-Security-Policy"] == CSP
            assert answer.headers["X-Content-Type-Options"] == "nosniff"
            assert answer.headers["Referrer-Policy"] == "no-referrer"
            assert ("Cache-Control" not in answer.headers) == cached, path
            assert not any(name.startswith("Access-Control-") for name in answer.headers)


async def test_the_hosts_the_server_answers_as_pass(client: Client) -> None:
    port = client.port
    for host in [
        f"127.0.0.1:{port}",
        f"localhost:{port}",
        f"LOCALHOST:{port}",
        f"[::1]:{port}",
        "chat.example.com",
        "chat.example.com:443",
        "proxy.example.com:8443",
    ]:
        async with client.get("/", headers={"Host": host}) as answer:
            assert answer.status == 200, host


async def test_a_foreign_host_is_refused_against_dns_rebinding(client: Client) -> None:
    port = client.port
    for host in [
        f"attacker.example:{port}",
        f"127.0.0.1:{port + 1}",
        "127.0.0.1",
        "proxy.example.com",
        "proxy.example.com:443",
        f"chat.example.com.attacker.example:{port}",
    ]:
        async with client.get("/", headers={"Host": host}) as answer:
            assert answer.status == 421, host
            assert "[channels.web].allowed_hosts" in await answer.text()
            assert answer.headers["Content-Security-Policy"] == CSP


async def test_a_post_of_the_page_itself_passes(client: Client) -> None:
    async with client.post("/api/messages", json={}, headers=posting(client)) as answer:
        assert answer.status == 200


async def test_a_post_from_another_origin_or_none_is_refused(client: Client) -> None:
    for origin in ["http://attacker.example", "null", f"http://127.0.0.1:{client.port + 1}", None]:
        headers = posting(client)
        if origin is None:
            del headers["Origin"]
        else:
            headers["Origin"] = origin
        async with client.post("/api/messages", json={}, headers=headers) as answer:
            assert answer.status == 403, origin


async def test_a_post_without_the_pages_header_is_refused(client: Client) -> None:
    """A form on another site can post here, but cannot add a header."""
    headers = posting(client)
    del headers["X-Kaiwa"]
    async with client.post("/api/messages", json={}, headers=headers) as answer:
        assert answer.status == 403
        assert "X-Kaiwa" in await answer.text()


async def test_a_post_whose_body_is_not_json_is_refused(client: Client) -> None:
    async with client.post("/api/messages", data={"text": "hi"}, headers=posting(client)) as answer:
        assert answer.status == 415


async def test_a_get_refuses_a_foreign_origin_but_not_none(client: Client) -> None:
    async with client.get("/api/events", headers={"Origin": "http://attacker.example"}) as answer:
        assert answer.status == 403
    async with client.get("/api/events", headers={"Origin": page(client)}) as answer:
        assert answer.status == 200
    async with client.get("/api/events") as answer:
        assert answer.status == 200


async def test_signing_in_sets_a_strict_http_only_cookie_that_signs_in(tmp_path: Path) -> None:
    keys = Keys(tmp_path / "web.key")

    async def login(_: web.Request) -> web.Response:
        response = web.Response(status=303, headers={"Location": "/"})
        keys.sign_in(response, "operator")
        return response

    async def who(request: web.Request) -> web.Response:
        return web.Response(text=str(keys.person_of(request.cookies.get(COOKIE))))

    application = web.Application()
    application.router.add_get("/login", login)
    application.router.add_get("/", who)
    async with TestClient(TestServer(application, host="127.0.0.1")) as client:
        async with client.get("/login", allow_redirects=False) as answer:
            cookie = answer.cookies[COOKIE]
        assert cookie["httponly"] is True
        assert cookie["samesite"] == "Strict"
        assert cookie["path"] == "/"
        assert not cookie["secure"], "served over plain http on loopback"
        async with client.get("/", headers={"Cookie": f"{COOKIE}={cookie.value}"}) as answer:
            assert await answer.text() == "operator"


# -- who a request is ----------------------------------------------------------------------------

TEAM = WebSettings(user_header="X-Forwarded-User", trusted_proxies=["127.0.0.0/30"])


@contextlib.asynccontextmanager
async def asking_who(
    tmp_path: Path, settings: WebSettings, host: str = "127.0.0.1"
) -> AsyncIterator[tuple[Client, Keys]]:
    """A server on `host` answering who each request is, and whom its failures count against."""
    keys = Keys(tmp_path / "web.key")
    people = People(keys, settings)

    async def who(request: web.Request) -> web.Response:
        return web.json_response({"person": people.of(request), "client": people.client(request)})

    application = web.Application()
    application.router.add_get("/", who)
    async with TestClient(TestServer(application, host=host)) as client:
        yield client, keys


async def ask(client: Client, **headers: str) -> dict[str, str | None]:
    return await ask_at(client, str(client.make_url("/")), **headers)


async def ask_at(client: Client, url: str, **headers: str) -> dict[str, str | None]:
    async with client.session.get(url, headers=headers) as answer:
        assert answer.status == 200, await answer.text()
        return dict(await answer.json())


async def test_a_trusted_proxys_header_names_the_person(tmp_path: Path) -> None:
    async with asking_who(tmp_path, TEAM) as (client, _):
        assert await ask(client, **{"X-Forwarded-User": "ann"}) == {
            "person": "ann",
            "client": "ann (named by the proxy)",  # a team behind one proxy is not one address
        }
        assert await ask(client) == {"person": None, "client": "127.0.0.1"}


async def test_the_header_from_an_address_not_trusted_is_ignored(tmp_path: Path) -> None:
    elsewhere = dataclasses.replace(TEAM, trusted_proxies=["10.0.0.5", "192.168.0.0/16"])
    async with asking_who(tmp_path, elsewhere) as (client, _):
        assert await ask(client, **{"X-Forwarded-User": "ann"}) == {
            "person": None,
            "client": "127.0.0.1",
        }


async def test_without_a_user_header_setting_no_header_signs_in(tmp_path: Path) -> None:
    operator_only = WebSettings(trusted_proxies=["127.0.0.1"])
    async with asking_who(tmp_path, operator_only) as (client, _):
        assert (await ask(client, **{"X-Forwarded-User": "ann"}))["person"] is None


async def test_an_ipv4_proxy_reaching_a_dual_stack_server_is_trusted(tmp_path: Path) -> None:
    """A server on "::" sees an IPv4 peer as ::ffff:127.0.0.1, which is the trusted address."""
    async with asking_who(tmp_path, TEAM, host="::") as (client, _):
        url = f"http://127.0.0.1:{client.port}/"
        assert (await ask_at(client, url, **{"X-Forwarded-User": "ann"}))["person"] == "ann"


async def test_the_operators_cookie_comes_before_the_proxys_name(tmp_path: Path) -> None:
    async with asking_who(tmp_path, TEAM) as (client, keys):
        cookie = f"{COOKIE}={keys.cookie_for('operator')}"
        who = await ask(client, **{"X-Forwarded-User": "ann", "Cookie": cookie})
        assert who["person"] == "operator"


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("ann:x", '"ann:x" has a ":"'),
        ("a" * 129, "longer than 128 characters"),
        ("operator", "the name of the operator's own sign-in"),
    ],
)
async def test_a_name_that_cannot_be_a_persons_is_refused_saying_why(
    tmp_path: Path, name: str, why: str
) -> None:
    async with (
        asking_who(tmp_path, TEAM) as (client, _),
        client.get("/", headers={"X-Forwarded-User": name}) as answer,
    ):
        assert answer.status == 400
        assert why in await answer.text()
        assert "[channels.web].user_header" in await answer.text()
        assert answer.headers["Content-Security-Policy"] == CSP


async def test_a_name_of_128_characters_passes(tmp_path: Path) -> None:
    async with asking_who(tmp_path, TEAM) as (client, _):
        assert (await ask(client, **{"X-Forwarded-User": "a" * 128}))["person"] == "a" * 128


# -- the settings --------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_a_loopback_host_setting_passes(host: str) -> None:
    check_settings(WebSettings(host=host))


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "kaiwa.example.com", ""])
def test_a_host_other_machines_can_reach_is_refused_with_the_fix(host: str) -> None:
    with pytest.raises(ConfigError) as refused:
        check_settings(WebSettings(host=host))
    assert "[channels.web].host is " in str(refused.value)
    assert 'keep host = "127.0.0.1"' in str(refused.value)
    assert "SSH tunnel or a reverse proxy" in str(refused.value)


def test_the_host_settings_refusal_names_both_ways() -> None:
    with pytest.raises(ConfigError) as refused:
        check_settings(WebSettings(host="0.0.0.0"))
    assert str(refused.value) == (
        "[channels.web].host is 0.0.0.0, which other machines can reach, and the web chat's only "
        'sign-in is the operator\'s link: keep host = "127.0.0.1" and reach it through an SSH '
        "tunnel or a reverse proxy, or sign a team in through a reverse proxy that names each "
        "person ([channels.web].user_header and trusted_proxies)"
    )
