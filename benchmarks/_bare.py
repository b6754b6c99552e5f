"""What the bare bots (`bare_telegram_bot.py`, `bare_slack_bot.py`, `bare_discord_bot.py`) share:
one reply as a plain bot on Ollama streams it, and the model request that feeds it.

A bare bot is the baseline a benchmark sets Kaiwa beside, so it does what any bot of this kind
must and nothing more: posts the first text with a Stop button, edits it as the text grows at
most once per interval, and shows the final text without the button the moment the stream ends.
No store, no history, no tools, no pacing beyond the interval. Each bot supplies only its
platform's post and edit (`Post`, `Edit`).
"""

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import ollama

from benchmarks import _common as bench

Post = Callable[[str, bool], Awaitable[Any]]
"""Post a text, with the Stop button (True) or without it (False); returns what `Edit` needs to
edit that message."""
Edit = Callable[[Any, str, bool], Awaitable[None]]
"""Edit the message to this text, with the Stop button (True) or without it (False)."""


class BareReply:
    """One reply: posted with its first text, edited as it grows no more than once per
    `interval`, finished without the button at once; the stream never waits for a call."""

    def __init__(self, post: Post, edit: Edit, interval: float) -> None:
        self._post, self._edit, self._interval = post, edit, interval
        self._text, self._shown = "", ""
        self._message: Any = None
        self._grown = asyncio.Event()
        self._ended = asyncio.Event()
        self._pacing = asyncio.create_task(self._pace())

    def grow(self, piece: str) -> None:
        self._text += piece
        self._grown.set()

    async def finish(self) -> None:
        self._ended.set()
        self._grown.set()
        await self._pacing
        if self._message is None:
            await self._post(self._text, False)
        else:
            await self._edit(self._message, self._text, False)

    async def _pace(self) -> None:
        changed_at = -self._interval
        while not self._ended.is_set():
            await self._grown.wait()
            self._grown.clear()
            wait = changed_at + self._interval - time.monotonic()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, wait)):
                    await self._ended.wait()
            text = self._text
            if self._ended.is_set() or text == self._shown or not text.strip():
                continue
            if self._message is None:
                self._message = await self._post(text, True)
            else:
                await self._edit(self._message, text, True)
            self._shown, changed_at = text, time.monotonic()


async def stream_into(
    client: ollama.AsyncClient, slots: asyncio.Semaphore, text: str, reply: BareReply
) -> None:
    """The request a fresh Kaiwa conversation sends, streamed into `reply`, then its end."""
    messages = [
        {"role": "system", "content": bench.SYSTEM_PROMPT},
        {"role": "user", "content": text},
    ]
    async with slots:
        stream = await client.chat(model=bench.MODEL, messages=messages, stream=True)
        async for part in stream:
            reply.grow(part.message.content or "")
    await reply.finish()
