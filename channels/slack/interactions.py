"""Slack's slash command and button presses, delivered as commands from the person who used them.

Slack does not deliver slash commands inside threads, so `!stop`, `!new`, ... (and a mention
followed by the bare word: "@kaiwa stop", `channels.presses.without_mention`) are the commands
there, read as messages (`channels.slack.receiving`); `/kaiwa stop <thread>` works from the
channel. Whatever name the app's settings give the slash command, it is Kaiwa's. Bolt
acknowledges the slash command at once (`ack_command` says where it went), then hands it over
(`command_message`), which waits for a stop.

A press comes to the `action` listener, which acknowledges it at once and then delivers its
command (`/stop`) in the button's thread from the presser (lazily, since a stop may take longer
than Slack waits for an ack), so the access rules apply as to a typed command; the command's
answer goes to the presser alone, as an ephemeral message (`channels.presses`). The person is
named as people know them (`channels.slack.names`).

Whatever else Slack sends (a shortcut, a button Kaiwa did not make, an event it does not read)
is `Unoffered`: acknowledged, so Slack neither waits for it nor sends it again, and logged once
per kind, with where to turn it off.
"""

import functools
import logging
import re
from collections.abc import Sequence
from typing import Any

from slack_bolt.response import BoltResponse
from slack_sdk.web.async_client import AsyncWebClient

from channels.formatting import slack_mrkdwn
from channels.places import SlackPlace
from channels.presses import COMMAND_WORDS, PAYLOAD_PREFIX, Press, pressed_command, pressing
from channels.slack.names import DisplayNames
from channels.slack.transport import mapped_errors, with_buttons
from core.channel import Button, ChannelMessage, Deliver

logger = logging.getLogger(__name__)

PRESSES = re.compile("^" + re.escape(PAYLOAD_PREFIX))
"""The action ids of Kaiwa's buttons (`channels.presses`)."""
THREAD_LINK = re.compile(r"p(\d{10})(\d{6})")
KINDS_LOGGED = 200  # kinds of unoffered envelopes remembered as already logged


async def ack_command(ack: Any, command: dict[str, Any]) -> None:
    target = _command_target(command)
    if target is None:
        await ack(
            f"Use `{command.get('command') or '/kaiwa'} stop <thread link>` here, or type "
            "`!stop`, `!new`, `!usage` or `!help` inside the thread (Slack does not send slash "
            "commands from threads)."
        )
    else:
        await ack(f"`!{target[0]}` sent to the thread.")


async def command_message(command: dict[str, Any], names: DisplayNames) -> ChannelMessage | None:
    """`/kaiwa <word> <thread>` as the typed command `!<word>` in that thread; None when it
    names no command or no thread."""
    target = _command_target(command)
    if target is None:
        return None
    word, where = target
    user = command.get("user_id", "")
    return ChannelMessage(
        platform=SlackPlace.platform,
        place=where.key,
        message_id=f"command:{command.get('trigger_id', '')}",
        author_id=user,
        author_name=await names.of(user),
        text=f"!{word}",
        room=where.channel,
    )


async def ack_press(ack: Any) -> None:
    await ack()


async def deliver_press(
    client: AsyncWebClient, body: dict[str, Any], deliver: Deliver, names: DisplayNames
) -> None:
    """A button pressed: its command in the button's thread, from the presser."""
    where, user = _pressed_in(body), (body.get("user") or {}).get("id", "")
    actions = body.get("actions") or [{}]
    command = pressed_command(actions[0].get("action_id"))
    if where is None or not user or command is None:
        return
    press = Press(where.key, functools.partial(_answer_privately, client, where, user))
    message = ChannelMessage(
        platform=SlackPlace.platform,
        place=where.key,
        message_id=f"press:{body.get('trigger_id', '')}",
        author_id=user,
        author_name=await names.of(user),
        text=command,
        room=where.channel,
    )
    with pressing(press):
        await deliver(message)


class Unoffered:
    """Envelopes of kinds Kaiwa does not offer, acknowledged, and logged once per kind."""

    def __init__(self) -> None:
        self._logged: set[str] = set()

    def acknowledged(self, body: dict[str, Any]) -> BoltResponse:
        """The answer that acknowledges `body` (empty: Slack shows nothing for it)."""
        kind = _kind_of(body)
        if kind not in self._logged and len(self._logged) < KINDS_LOGGED:
            self._logged.add(kind)
            logger.info(
                "Slack sent %s, which Kaiwa does not offer: acknowledged and ignored (this "
                "line is written once; the app's settings at api.slack.com/apps turn it off)",
                kind,
            )
        return BoltResponse(status=200, body="")


def _kind_of(body: dict[str, Any]) -> str:
    """What an envelope's payload is, in words: "the message shortcut 'summarize'"."""
    kind = str(body.get("type") or "")
    named = {"shortcut": "global shortcut", "message_action": "message shortcut"}
    if kind in named:
        return f"the {named[kind]} {body.get('callback_id')!r}"
    if kind == "block_actions":
        ids = [str(action.get("action_id")) for action in body.get("actions") or []]
        return f"a press of a button Kaiwa did not make ({', '.join(ids) or 'no action id'})"
    if kind == "event_callback":
        return f"the event {(body.get('event') or {}).get('type')!r}"
    if kind in ("view_submission", "view_closed"):
        return f"a {kind} of the view {(body.get('view') or {}).get('callback_id')!r}"
    return f"a request of type {kind or 'unknown'!r}"


async def _answer_privately(
    client: AsyncWebClient, where: SlackPlace, user: str, text: str, buttons: Sequence[Button]
) -> None:
    mrkdwn = slack_mrkdwn(text)
    with mapped_errors("chat.postEphemeral"):
        await client.chat_postEphemeral(
            channel=where.channel,
            user=user,
            text=mrkdwn,
            blocks=with_buttons(mrkdwn, buttons) if buttons else None,
            thread_ts=where.thread_ts,
        )


def _pressed_in(body: dict[str, Any]) -> SlackPlace | None:
    """The conversation of the message whose button was pressed: its thread, or the DM's top
    level for a message outside any thread."""
    channel = (body.get("channel") or {}).get("id")
    if not channel:
        return None
    team = (body.get("team") or {}).get("id") or (body.get("user") or {}).get("team_id", "")
    message = body.get("message") or body.get("container") or {}  # an ephemeral has no message
    thread = message.get("thread_ts") or SlackPlace.TOP
    return SlackPlace(team, channel, thread)


def _command_target(command: dict[str, Any]) -> tuple[str, SlackPlace] | None:
    """`/kaiwa <word> <thread>`: the command word and the thread it acts on, or None if either
    is missing (in a DM, the DM itself is the thread)."""
    word, _, target = (command.get("text") or "").strip().partition(" ")
    channel, team = command["channel_id"], command.get("team_id", "")
    thread = _thread_from(target) or (SlackPlace.TOP if channel.startswith("D") else None)
    if word not in COMMAND_WORDS or thread is None:
        return None
    return word, SlackPlace(team, channel, thread)


def _thread_from(target: str) -> str | None:
    """A thread's ts from a raw ts ("1700000000.000100") or a link (".../p1700000000000100")."""
    if re.fullmatch(r"\d{10}\.\d{6}", target):
        return target
    found = THREAD_LINK.search(target)
    return f"{found.group(1)}.{found.group(2)}" if found else None
