"""People's names on Slack: member ids looked up with `users.info`, remembered for a while.

Slack's events, slash commands and button presses name a person by member id alone
(U0123ABCD), while people know each other by the profile's display name (else the real name,
else the handle: `name_in`). `DisplayNames.of` asks `users.info` once per person and keeps the
name `FRESH_SECONDS`; an older name is still used at once while a new lookup runs. At most `KEPT`
people are remembered, the least recently seen forgotten first.

A message never waits long for a name: past `WAIT_SECONDS`, or when Slack refuses, it carries
the member id, and the lookup goes on for the next message. A failed lookup is not tried again
for `RETRY_SECONDS` (or as long as a rate limit asks), so a Slack in trouble costs a person's
messages one short wait at most, not one each. A refusal is logged (once per interval: a
missing `users:read` scope would refuse every lookup). One lookup per person is in flight at a
time; `close` ends those still running.
"""

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from channels.slack.refusals import Refusal
from channels.throttled_log import ThrottledLog

logger = logging.getLogger(__name__)

FRESH_SECONDS = 6 * 3600.0
RETRY_SECONDS = 300.0
WAIT_SECONDS = 1.0  # Slack waits 3 s for an event's ack, which follows the lookup
KEPT = 2000
SCOPE_FIX = "; give the app the users:read scope (then reinstall it) for people's names"


@dataclass(frozen=True)
class _Known:
    name: str
    """Empty when the lookup failed: the member id stands in."""
    until: float
    """When to ask Slack again."""


class DisplayNames:
    def __init__(self, client: AsyncWebClient, clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._clock = clock
        self._known: OrderedDict[str, _Known] = OrderedDict()
        self._asking: dict[str, asyncio.Task[None]] = {}
        self._refused = ThrottledLog(logger)

    async def of(self, user: str) -> str:
        """The name `user` goes by, or the member id itself when Slack has not said (yet)."""
        if not user:
            return ""
        known = self._known.get(user)
        if known is not None:
            self._known.move_to_end(user)
        if known is None or self._clock() >= known.until:
            lookup = self._look_up(user)
            if known is None:  # a first lookup is waited for, briefly
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(lookup), WAIT_SECONDS)
                known = self._known.get(user)
        return known.name if known is not None and known.name else user

    async def close(self) -> None:
        """End the lookups still running."""
        asking = list(self._asking.values())
        for task in asking:
            task.cancel()
        await asyncio.gather(*asking, return_exceptions=True)

    def _look_up(self, user: str) -> asyncio.Task[None]:
        task = self._asking.get(user)
        if task is None:
            task = asyncio.create_task(self._ask(user), name=f"slack users.info {user}")
            self._asking[user] = task
            task.add_done_callback(lambda done: self._asked(user, done))
        return task

    async def _ask(self, user: str) -> None:
        try:
            answer = await self._client.users_info(user=user)
        except SlackApiError as exc:
            refusal = Refusal.of(exc, "users.info")
            fix = SCOPE_FIX if refusal.needs_a_person else ""
            self._failed(user, refusal.described() + fix, refusal.retry_after)
        except (SlackClientError, aiohttp.ClientError, TimeoutError) as exc:
            self._failed(user, f"users.info failed: {exc or type(exc).__name__}", 0.0)
        else:
            self._remember(user, name_in(answer.get("user") or {}), FRESH_SECONDS)

    def _failed(self, user: str, why: str, retry_after: float) -> None:
        self._refused.warning("Slack: no name for %s, its member id stands in: %s", user, why)
        self._remember(user, self._stale_name(user), max(RETRY_SECONDS, retry_after))

    def _stale_name(self, user: str) -> str:
        known = self._known.get(user)
        return known.name if known is not None else ""

    def _remember(self, user: str, name: str, seconds: float) -> None:
        self._known[user] = _Known(name, self._clock() + seconds)
        self._known.move_to_end(user)
        while len(self._known) > KEPT:
            self._known.popitem(last=False)

    def _asked(self, user: str, task: asyncio.Task[None]) -> None:
        self._asking.pop(user, None)
        if not task.cancelled() and task.exception() is not None:
            logger.error("Slack: looking up %s's name failed", user, exc_info=task.exception())


def name_in(user: Mapping[str, Any]) -> str:
    """A `users.info` user's name as people see it: display name, real name, then handle."""
    profile = user.get("profile") or {}
    for name in (
        profile.get("display_name"),
        profile.get("real_name"),
        user.get("real_name"),
        user.get("name"),
    ):
        if isinstance(name, str) and name.strip():
            return name.strip()
    return ""
