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
- Tools reach Ollama whole: the client's `chat` would read them into its typed `Tool`, which
  drops a property's `anyOf` and an object's properties, so the request body is built here
  (`chat_body`) and sent through the client's own streaming request, whose parsing and errors
  stay the client's.
- Several Ollama hosts (`[ollama.hosts.<name>]`) each get their own client and slots; a request
  goes to the least loaded host that has its model, and a host that fails before the first
  piece is skipped for `host_skip_seconds` (said in the log) while the request is tried again
  on another. One host (`[ollama].url`) is the same with a list of one.
"""

import asyncio
import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import aclosing, contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import ollama
import pydantic

from core.agent.deadline import SlidingDeadline
from core.agent.messages import Usage
from core.agent.slots import RequestSlots
from core.errors import (
    ModelError,
    ModelHTTPError,
    ModelNotFound,
    ModelStreamError,
    ModelTimeout,
    ModelUnreachable,
)
from core.metrics import MODEL_TOKENS
from core.text import clean, clean_all, plural

logger = logging.getLogger(__name__)

T = TypeVar("T")
DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
DEFAULT_KEEP_ALIVE_SECONDS = 300.0
SLOW_START_SECONDS = 0.5
"""A model call whose first piece takes longer says what it waits for."""
MODELS_READ_SECONDS = 60.0
"""How long a host's list of pulled models is trusted."""
MAX_IDLE_CONNECTIONS = 32
"""httpcore scans its whole pool on every request, so a burst's worth of idle connections would
slow every later request; a few dozen cover any realistic OLLAMA_NUM_PARALLEL."""


@dataclass(frozen=True)
class OllamaHost:
    url: str
    max_concurrent_requests: int = 1


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
    hosts: dict[str, OllamaHost] = field(default_factory=dict)
    """Several Ollama servers, by name; empty: the one at `url`."""
    host_skip_seconds: float = 30.0
    """A host that failed is not asked again for this long (unless no other is left)."""

    def all_hosts(self) -> dict[str, OllamaHost]:
        return self.hosts or {"ollama": OllamaHost(self.url, self.max_concurrent_requests)}


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


class _Host:
    """One Ollama server: its client, its request slots, and whether it is being skipped."""

    def __init__(self, name: str, host: OllamaHost, connect_timeout: float) -> None:
        self.name = name
        self.url = host.url
        self.slots = RequestSlots(host.max_concurrent_requests)
        self.limit = host.max_concurrent_requests
        self.skipped_until = 0.0
        self.models: list[str] | None = None
        self.models_read = 0.0
        connections = host.max_concurrent_requests
        self.client = ollama.AsyncClient(
            host=host.url,
            timeout=httpx.Timeout(connect=connect_timeout, read=None, write=None, pool=None),
            limits=httpx.Limits(
                max_connections=connections,
                max_keepalive_connections=min(connections, MAX_IDLE_CONNECTIONS),
            ),
        )

    @property
    def load(self) -> float:
        return (self.slots.busy + self.slots.waiting) / self.limit

    def skipped(self, now: float) -> bool:
        return now < self.skipped_until


class ModelClient:
    """Streams chat replies from Ollama. Safe to share between every conversation."""

    def __init__(self, settings: ModelSettings) -> None:
        self.settings = settings
        self._hosts = [
            _Host(name, host, settings.connect_timeout)
            for name, host in settings.all_hosts().items()
        ]
        self._keep_alive_seconds = keep_alive_seconds(settings.keep_alive)
        self._context_lengths: dict[str, int | None] = {}
        self._warm: dict[str, float] = {}
        """When each model last answered: one that has not within `keep_alive` may be loading."""

    async def close(self) -> None:
        for host in self._hosts:
            await host.client.close()

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
        qwen3:4b…"). A request that fails before its first piece for a passing reason is tried
        again (on another host, if there is one)."""
        for retry in range(self.settings.retries + 1):
            host = await self._host_for(model)
            try:
                with self._errors_mapped(model, host):
                    answered = await self._chat_on(
                        host,
                        model,
                        messages,
                        reply,
                        on_chunk,
                        tools,
                        think,
                        on_status,
                        options,
                        background,
                    )
            except ModelError as exc:
                if retry == self.settings.retries or not exc.transient or reply.pieces:
                    raise
                self._skip(host, exc)
                pause = self.settings.retry_backoff * 2**retry
                logger.warning(
                    "%s; trying again in %g s (%d of %d)",
                    exc,
                    pause,
                    retry + 1,
                    self.settings.retries,
                )
                await asyncio.sleep(pause)
                continue
            host.skipped_until = 0.0
            return answered
        raise AssertionError("unreachable: the last try raises or returns")

    async def _chat_on(
        self,
        host: _Host,
        model: str,
        messages: Sequence[dict[str, Any]],
        reply: ModelReply,
        on_chunk: ChunkCallback,
        tools: Sequence[dict[str, Any]],
        think: bool | None,
        on_status: StatusCallback,
        options: dict[str, Any] | None,
        background: bool,
    ) -> ModelReply:
        waited = False

        def queued(ahead: int) -> None:
            nonlocal waited
            waited = True
            on_status(f"waiting for the model: {ahead} {plural(ahead, 'request')} ahead")

        async with host.slots.held(queued, background=background):
            state = "waiting for" if self._is_warm(model) else "loading"
            # A quick start shows nothing; a slow one (or one that queued) says what it waits for.
            slow = asyncio.get_running_loop().call_later(
                0 if waited else SLOW_START_SECONDS, on_status, f"{state} {model}…"
            )

            def shown(text: str, thinking: str) -> None:
                slow.cancel()
                on_chunk(text, thinking)

            try:
                answered = await self._stream(
                    host, model, messages, reply, shown, tools, think, options
                )
            finally:
                slow.cancel()
            self._warm[model] = time.monotonic()
            return answered

    async def _host_for(self, model: str) -> _Host:
        """The least loaded host that has `model`, among those not being skipped (all of them,
        when every one is)."""
        if len(self._hosts) == 1:
            return self._hosts[0]
        now = time.monotonic()
        live = [host for host in self._hosts if not host.skipped(now)] or self._hosts
        having = [host for host in live if await self._has(host, model)] or live
        return min(having, key=lambda host: host.load)

    async def _has(self, host: _Host, model: str) -> bool:
        """Whether `host` has pulled `model` (its list read at most once a minute); a host that
        cannot say is skipped."""
        if host.models is None or time.monotonic() - host.models_read > MODELS_READ_SECONDS:
            try:
                host.models = await self._models_on(host)
            except ModelError as exc:
                self._skip(host, exc)
                return False
            host.models_read = time.monotonic()
        return model_is_available(model, host.models)

    def _skip(self, host: _Host, error: ModelError) -> None:
        if len(self._hosts) == 1:
            return
        seconds = self.settings.host_skip_seconds
        host.skipped_until = time.monotonic() + seconds
        host.models = None
        logger.warning(
            "Ollama host %s (%s) failed (%s); the others answer for %g s",
            host.name,
            host.url,
            error,
            seconds,
        )

    def _is_warm(self, model: str) -> bool:
        answered = self._warm.get(model)
        return answered is not None and time.monotonic() - answered < self._keep_alive_seconds

    async def _stream(
        self,
        host: _Host,
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
        body = chat_body(model, messages, tools, think, self.settings.keep_alive, options)
        # The client's own request, streamed and parsed as `chat` does, with a body it did not
        # narrow (see `chat_body`).
        stream = await host.client._request(
            ollama.ChatResponse, "POST", "/api/chat", json=body, stream=True
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
        MODEL_TOKENS.labels(model, "in").inc(reply.usage.prompt_tokens)
        MODEL_TOKENS.labels(model, "out").inc(reply.usage.output_tokens)
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
    def _errors_mapped(self, model: str, host: _Host) -> Iterator[None]:
        """The one boundary where library exceptions become ours; unforeseen ones pass through."""
        try:
            yield
        except ModelError:
            raise
        except Exception as exc:
            mapped = self._translate(exc, model, host)
            if mapped is None:
                raise
            raise mapped from exc

    def _translate(self, exc: Exception, model: str, host: _Host) -> ModelError | None:
        url = host.url
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
            where = "[ollama].url" if len(self._hosts) == 1 else f"[ollama.hosts.{host.name}].url"
            return ModelUnreachable(
                f"cannot reach Ollama at {url}: start it with `ollama serve`, or set {where}"
            )
        if isinstance(exc, httpx.HTTPError | json.JSONDecodeError | pydantic.ValidationError):
            return ModelStreamError(
                f"the reply stream from {model} broke off ({type(exc).__name__}); try again, and "
                "check the Ollama server log if it keeps happening",
                transient=isinstance(exc, httpx.TransportError),
            )
        return None

    async def list_models(self) -> list[str]:
        """Names of the models Ollama has pulled (`GET /api/tags`): on any host that answers
        (the first host's error if none does)."""
        found: list[str] = []
        failures: list[ModelError] = []
        for host in self._hosts:
            try:
                found += [name for name in await self._models_on(host) if name not in found]
            except ModelError as exc:
                failures.append(exc)
        if failures and len(failures) == len(self._hosts):
            raise failures[0]
        return found

    async def _models_on(self, host: _Host) -> list[str]:
        listing = await self._quick(host.client.list(), "", host)
        return [entry.model for entry in listing.models if entry.model]

    async def context_length(self, model: str) -> int | None:
        """The longest context `model` was trained for (`<architecture>.context_length` from
        `POST /api/show`), asked once per model; None if Ollama does not say."""
        if model not in self._context_lengths:
            host = await self._host_for(model)
            shown = await self._quick(host.client.show(model), model, host)
            lengths = [
                value
                for key, value in (shown.modelinfo or {}).items()
                if key.endswith(".context_length") and isinstance(value, int)
            ]
            self._context_lengths[model] = lengths[0] if lengths else None
        return self._context_lengths[model]

    async def _quick(self, request: Awaitable[T], model: str, host: _Host) -> T:
        """A short request (not a chat): errors mapped, and an answer within a few seconds."""
        limit = self.settings.connect_timeout * 2
        try:
            with self._errors_mapped(model, host):
                async with asyncio.timeout(limit):
                    return await request
        except TimeoutError as exc:
            raise ModelUnreachable(
                f"Ollama at {host.url} did not answer within {limit:g} s; check that it "
                "is running and that [ollama].url points at it"
            ) from exc


def chat_body(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[dict[str, Any]],
    think: bool | None,
    keep_alive: str,
    options: dict[str, Any] | None,
) -> dict[str, Any]:
    """The body of a streamed `POST /api/chat`, as the ollama client's `chat` builds it but for
    the tools, which go as the JSON they are (`core.agent.tools.Tool.schema`). The client reads
    each tool into its `Tool` model, which keeps of a property only its type, items, description
    and enum: every `anyOf` (each optional argument of a Python MCP server) and the properties of
    an object argument would reach the model without a type, though Ollama's API carries them."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [_message_body(message) for message in messages],
        "stream": True,
        "keep_alive": keep_alive,
    }
    if tools:
        body["tools"] = list(tools)
    if think is not None:
        body["think"] = think
    if options is not None:
        body["options"] = options
    return body


def _message_body(message: Mapping[str, Any]) -> dict[str, Any]:
    """One message as the client sends it: empty fields left out, images in base64."""
    fields = {key: value for key, value in message.items() if value}
    if "images" in fields:
        fields["images"] = [ollama.Image(value=image) for image in fields["images"]]
    return ollama.Message.model_validate(fields).model_dump(exclude_none=True)


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
