"""The one door to Ollama: streaming chat with timeouts, a shared concurrency cap, clear errors.

Why it is shaped this way:
- One `ollama.AsyncClient` (one HTTP connection pool) serves every conversation; a client per
  conversation costs memory and sockets for nothing.
- A semaphore caps simultaneous requests. Ollama serves `OLLAMA_NUM_PARALLEL` at once and queues
  the rest where our timeouts cannot tell waiting from hanging, so the queue lives here instead, and
  the first-chunk timeout starts only once a request is actually sent.
- Chunks go to a synchronous callback instead of out of an async generator: the timeouts and the
  semaphore then live in one coroutine, and a stop (task cancellation) can only land at an `await`
  inside this module, never between a chunk and the caller's bookkeeping of it.
- The client library's default timeout is none at all; every wait here has one.
- A request that fails before its first piece (Ollama unreachable, a reset connection, a 502,
  503 or 504) is tried again, at most `retries` times with a growing pause: nothing was shown
  yet, so nobody sees it twice. Once anything has arrived, a failure is final.
- ollama, httpx and json exceptions are mapped to `core.errors` here and nowhere else.
"""

import asyncio
import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import aclosing, contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import ollama
import pydantic

from core.deadline import SlidingDeadline
from core.errors import (
    ModelError,
    ModelHTTPError,
    ModelNotFound,
    ModelStreamError,
    ModelTimeout,
    ModelUnreachable,
)
from core.messages import Usage
from core.slots import RequestSlots
from core.text import clean, clean_all, plural

logger = logging.getLogger(__name__)

T = TypeVar("T")
DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
DEFAULT_KEEP_ALIVE_SECONDS = 300.0
SLOW_START_SECONDS = 0.5
"""A model call whose first piece takes longer says what it waits for."""
MAX_IDLE_CONNECTIONS = 32
"""httpcore scans its whole pool on every request, so a burst's worth of idle connections would
slow every later request; a few dozen cover any realistic OLLAMA_NUM_PARALLEL."""


@dataclass(frozen=True)
class ModelSettings:
    url: str = "http://127.0.0.1:11434"
    connect_timeout: float = 5.0
    first_chunk_timeout: float = 120.0
    idle_timeout: float = 60.0
    max_concurrent_requests: int = 1
    keep_alive: str = "5m"
    retries: int = 2
    """Tries again of a request that failed before its first piece."""
    retry_backoff: float = 0.5
    """Seconds before the first try again; doubled for each next one."""


@dataclass
class ModelReply:
    """A model call's reply, filled in as it streams: a stopped caller keeps what arrived."""

    text: str = ""
    thinking: str = ""
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    done_reason: str = ""
    pieces: int = 0
    """How many pieces of the stream arrived (any, even empty ones)."""


ChunkCallback = Callable[[str, str], None]
"""Called with (text, thinking) for each streamed piece that carries either."""
StatusCallback = Callable[[str], None]
"""Told what a request waits for before its first piece (for a person to see)."""


def _no_status(status: str) -> None:
    pass


class ModelClient:
    """Streams chat replies from Ollama. Safe to share between every conversation."""

    def __init__(self, settings: ModelSettings) -> None:
        self.settings = settings
        self._slots = RequestSlots(settings.max_concurrent_requests)
        self._keep_alive_seconds = keep_alive_seconds(settings.keep_alive)
        self._context_lengths: dict[str, int | None] = {}
        self._warm: dict[str, float] = {}
        """When each model last answered: one that has not within `keep_alive` may be loading."""
        connections = settings.max_concurrent_requests
        self._client = ollama.AsyncClient(
            host=settings.url,
            timeout=httpx.Timeout(
                connect=settings.connect_timeout, read=None, write=None, pool=None
            ),
            limits=httpx.Limits(
                max_connections=connections,
                max_keepalive_connections=min(connections, MAX_IDLE_CONNECTIONS),
            ),
        )

    async def close(self) -> None:
        await self._client.close()

    async def chat(
        self,
        model: str,
        messages: Sequence[dict[str, Any]],
        reply: ModelReply,
        on_chunk: ChunkCallback,
        *,
        tools: Sequence[dict[str, Any]] = (),
        think: bool | None = None,
        on_status: StatusCallback = _no_status,
        options: dict[str, Any] | None = None,
        background: bool = False,
    ) -> ModelReply:
        """Stream one reply into `reply`, calling `on_chunk` for each piece; raise a
        `ModelError` on failure. Returns `reply`, complete with its usage. `options` are
        Ollama's (`num_ctx`, `num_predict`, ...); a `background` request (a sub-agent's) waits
        for a slot behind those a person waits for. Until the first
        piece, `on_status` hears what the request waits for: a slot ("waiting for the model: 2
        requests ahead"), then, if the first piece is slow to come, the model ("loading
        qwen3:4b…" when it has not answered within its keep-alive, else "waiting for
        qwen3:4b…")."""

        waited = False

        def queued(ahead: int) -> None:
            nonlocal waited
            waited = True
            on_status(f"waiting for the model: {ahead} {plural(ahead, 'request')} ahead")

        async with self._slots.held(queued, background=background):
            state = "waiting for" if self._is_warm(model) else "loading"
            # A quick start shows nothing; a slow one (or one that queued) says what it waits for.
            slow = asyncio.get_running_loop().call_later(
                0 if waited else SLOW_START_SECONDS, on_status, f"{state} {model}…"
            )

            def shown(text: str, thinking: str) -> None:
                slow.cancel()
                on_chunk(text, thinking)

            try:
                answered = await self._tries(
                    model,
                    reply,
                    lambda: self._stream(model, messages, reply, shown, tools, think, options),
                )
            finally:
                slow.cancel()
            self._warm[model] = time.monotonic()
            return answered

    async def _tries(
        self, model: str, reply: ModelReply, attempt: Callable[[], Awaitable[ModelReply]]
    ) -> ModelReply:
        """`attempt()` with errors mapped, tried again while it fails for a passing reason
        before the first piece of `reply` arrived."""
        for retry in range(self.settings.retries + 1):
            try:
                with self._errors_mapped(model):
                    return await attempt()
            except ModelError as exc:
                if retry == self.settings.retries or not exc.transient or reply.pieces:
                    raise
                pause = self.settings.retry_backoff * 2**retry
                logger.warning(
                    "%s; trying again in %g s (%d of %d)",
                    exc,
                    pause,
                    retry + 1,
                    self.settings.retries,
                )
                await asyncio.sleep(pause)
        raise AssertionError("unreachable: the last try raises or returns")

    def _is_warm(self, model: str) -> bool:
        answered = self._warm.get(model)
        return answered is not None and time.monotonic() - answered < self._keep_alive_seconds

    async def _stream(
        self,
        model: str,
        messages: Sequence[dict[str, Any]],
        reply: ModelReply,
        on_chunk: ChunkCallback,
        tools: Sequence[dict[str, Any]],
        think: bool | None,
        options: dict[str, Any] | None,
    ) -> ModelReply:
        started = time.monotonic()
        final: ollama.ChatResponse | None = None
        stream = await self._client.chat(
            model=model,
            messages=messages,
            tools=list(tools) or None,
            think=think,
            stream=True,
            keep_alive=self.settings.keep_alive,
            options=options,
        )
        deadline = SlidingDeadline(self.settings.first_chunk_timeout, self.settings.idle_timeout)
        try:
            with deadline:
                async with aclosing(stream):
                    # Read to the end, past the done chunk, so the connection goes back to the
                    # pool instead of being closed and opened again for the next request.
                    async for part in stream:
                        reply.pieces += 1
                        deadline.touch()
                        _absorb(part, reply, on_chunk)
                        if part.done:
                            final = part
        except TimeoutError as exc:
            raise self._timeout_error(model, deadline.waiting_for_first) from exc
        if final is None:
            raise ModelStreamError(
                f"the reply from {model} ended before the model finished; try again, and check "
                "the Ollama server log if it keeps happening",
                transient=True,
            )
        reply.usage = Usage(
            prompt_tokens=final.prompt_eval_count or 0,
            output_tokens=final.eval_count or 0,
            seconds=time.monotonic() - started,
        )
        reply.done_reason = final.done_reason or ""
        return reply

    def _timeout_error(self, model: str, waiting_for_first: bool) -> ModelTimeout:
        if waiting_for_first:
            return ModelTimeout(
                f"{model} sent nothing for {self.settings.first_chunk_timeout:g} s; the model may "
                "still be loading: try again, or raise [ollama].first_chunk_timeout"
            )
        return ModelTimeout(
            f"{model} went silent for {self.settings.idle_timeout:g} s mid-reply; try again, or "
            "raise [ollama].idle_timeout"
        )

    @contextmanager
    def _errors_mapped(self, model: str) -> Iterator[None]:
        """The one boundary where library exceptions become ours; unforeseen ones pass through."""
        try:
            yield
        except ModelError:
            raise
        except Exception as exc:
            mapped = self._translate(exc, model)
            if mapped is None:
                raise
            raise mapped from exc

    def _translate(self, exc: Exception, model: str) -> ModelError | None:
        url = self.settings.url
        if isinstance(exc, ollama.ResponseError):
            if exc.status_code == 404:
                return ModelNotFound(f"model {model} not found: run `ollama pull {model}`")
            if exc.status_code == -1:
                return ModelStreamError(f"Ollama reported an error mid-reply: {exc.error}")
            fix = (
                "set think = false for this agent"
                if "thinking" in exc.error
                else "check the Ollama server log"
            )
            return ModelHTTPError(
                f"Ollama answered HTTP {exc.status_code}: {exc.error}; {fix}", exc.status_code
            )
        if isinstance(exc, ConnectionError | httpx.ConnectError | httpx.ConnectTimeout):
            return ModelUnreachable(
                f"cannot reach Ollama at {url}: start it with `ollama serve`, or set [ollama].url"
            )
        if isinstance(exc, httpx.HTTPError | json.JSONDecodeError | pydantic.ValidationError):
            return ModelStreamError(
                f"the reply stream from {model} broke off ({type(exc).__name__}); try again, and "
                "check the Ollama server log if it keeps happening",
                transient=isinstance(exc, httpx.TransportError),
            )
        return None

    async def list_models(self) -> list[str]:
        """Names of the models Ollama has pulled (`GET /api/tags`)."""
        listing = await self._quick(self._client.list(), "")
        return [entry.model for entry in listing.models if entry.model]

    async def context_length(self, model: str) -> int | None:
        """The longest context `model` was trained for (`<architecture>.context_length` from
        `POST /api/show`), asked once per model; None if Ollama does not say."""
        if model not in self._context_lengths:
            shown = await self._quick(self._client.show(model), model)
            lengths = [
                value
                for key, value in (shown.modelinfo or {}).items()
                if key.endswith(".context_length") and isinstance(value, int)
            ]
            self._context_lengths[model] = lengths[0] if lengths else None
        return self._context_lengths[model]

    async def _quick(self, request: Awaitable[T], model: str) -> T:
        """A short request (not a chat): errors mapped, and an answer within a few seconds."""
        limit = self.settings.connect_timeout * 2
        try:
            with self._errors_mapped(model):
                async with asyncio.timeout(limit):
                    return await request
        except TimeoutError as exc:
            raise ModelUnreachable(
                f"Ollama at {self.settings.url} did not answer within {limit:g} s; check that it "
                "is running and that [ollama].url points at it"
            ) from exc


def _absorb(part: ollama.ChatResponse, reply: ModelReply, on_chunk: ChunkCallback) -> None:
    message = part.message
    if message.tool_calls:
        reply.tool_calls.extend(
            (clean(call.function.name), clean_all(dict(call.function.arguments)))
            for call in message.tool_calls
        )
    text, thinking = clean(message.content or ""), clean(message.thinking or "")
    if text or thinking:
        reply.text += text
        reply.thinking += thinking
        on_chunk(text, thinking)


def keep_alive_seconds(keep_alive: str) -> float:
    """Ollama's keep-alive ("5m", "1h30m", "300", "-1" for ever) in seconds; five minutes when
    it cannot be read."""
    text = keep_alive.strip()
    if text.lstrip("-").replace(".", "", 1).isdigit():
        seconds = float(text)
        return math.inf if seconds < 0 else seconds
    parts = DURATION.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text.lstrip("-"):
        return DEFAULT_KEEP_ALIVE_SECONDS
    if text.startswith("-"):
        return math.inf
    return sum(float(number) * UNIT_SECONDS[unit] for number, unit in parts)


def model_is_available(name: str, available: Sequence[str]) -> bool:
    """Ollama treats a name without a tag as `:latest`."""
    wanted = name if ":" in name else f"{name}:latest"
    return any(wanted == (have if ":" in have else f"{have}:latest") for have in available)
