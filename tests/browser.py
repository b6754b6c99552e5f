"""A real browser for the web channel's page: Playwright driving Debian's `chromium`.

Playwright's own browser builds are downloaded from outside the package registries, which this
project cannot reach, so the browser is the system's chromium (`.ci/run` installs it). Without it
a test is skipped on a developer's machine, saying how to install it; on CI (`CI` set) it fails:
a browser test that quietly skips there would prove nothing.

A browser per test (function scope): the suite's event loop is the test's own
(`asyncio_default_fixture_loop_scope`), and Playwright's connection lives on the loop it was
opened on. Each launch gets a fresh temporary profile (user-data-dir) from Playwright, removed
when the browser closes, and each context within it is isolated (its own cookies and storage), so
no session cookie leaks from one test, or one context, to another. The flags keep chromium off
the network: no background updates, sync or QUIC, nothing but the pages a test opens.

Use: `from tests.browser import browser, page  # noqa: F401` in a conftest.py.
"""

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from tests.fakes.patience import deadline

CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium() -> str:
    """The chromium to run; skips the test (fails it on CI) when there is none."""
    found = shutil.which("chromium") or "/usr/bin/chromium"
    if Path(found).is_file():
        return found
    reason = "no chromium for the browser tests: install Debian's (apt-get install -y chromium)"
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; .ci/run installs it before the tests")
    pytest.skip(reason)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    executable = chromium()
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=executable, headless=True, args=CHROMIUM_FLAGS
        )
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def page(browser: Browser) -> AsyncIterator[Page]:
    """A page in a context of its own; Playwright's waits (and `expect`'s) end at the suite's
    deadline, not at Playwright's few seconds."""
    expect.set_options(timeout=deadline() * 1000)
    context = await browser.new_context()
    context.set_default_timeout(deadline() * 1000)
    try:
        yield await context.new_page()
    finally:
        await context.close()
