"""A fake Ollama server that speaks Ollama's real HTTP wire protocol.

Tests drive the real ``ollama.AsyncClient`` (and so the real httpx transport) against this
server instead of mocking the library, so what the client parses, raises and times out on is
exactly what production code sees. Each reply is scripted as a list of steps (text, thinking,
tool calls, pauses, errors, broken connections); ``reached``/``release`` and ``stalled`` give
tests handshakes instead of sleeps. Scripts are compiled into chunk messages once, when queued,
so a stream costs one ``json.dumps`` and one write per chunk: ``python -m tests.fakes.ollama``
serves the same app on its own for benchmarks that drive many concurrent streams through it, and
for trying a real `kaiwa` process by hand (`--script` queues answers, tool calls included).

``/api/show`` reports a context length per model, and every chat request's prompt is sized by
``prompt_tokens``, a fixed rule of 3 characters a token that deliberately differs from a client's
own estimate, so tests can check that a client measures its prompts against the server's counts
(with ``count_prompts``) and keeps them under ``num_ctx``. Like real Ollama, the fake still
answers a prompt that overflows ``num_ctx`` (Ollama truncates it silently); ``prompts`` records it.

The ``tools`` of a request are read as Ollama's server reads them into its Go structs
(``read_tools``): a key of the wrong shape refuses the request with HTTP 400, and a key the
structs have no field for is dropped silently, so ``dropped`` records its path for tests to see
what the model would never have been shown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn, Self

from aiohttp import web

BENCHMARK_REPLY = (
    "Kaiwa benchmark reply: the quick brown fox jumps over the lazy dog, then streams on, "
    "one small piece at a time, until every chunk has reached the client and the reply is done."
)
DEFAULT_CONTEXT_LENGTH = 40960  # what /api/show reports for a model not in context_lengths
ARCHITECTURE = "qwen3"  # every model's, so /api/show names its "qwen3.context_length"
_CHARS_PER_TOKEN = 3
_MESSAGE_OVERHEAD_TOKENS = 4
_MODIFIED_AT = "2025-01-01T00:00:00Z"


@dataclass(frozen=True)
class Text:
    """Assistant content, sent as ``chunks`` roughly equal pieces (one NDJSON line each)."""

    text: str
    chunks: int = 1


@dataclass(frozen=True)
class Thinking:
    """Like ``Text``, but in ``message.thinking`` (with empty content)."""

    text: str
    chunks: int = 1


@dataclass(frozen=True)
class ToolCall:
    """One tool call; consecutive ``ToolCall`` steps share one chunk, as in real Ollama."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ChunkDelay:
    """From here on, sleep ``seconds`` before each following chunk."""

    seconds: float


@dataclass(frozen=True)
class Pause:
    """Hold the stream until ``FakeOllama.release(name)``; ``reached(name)`` resolves here."""

    name: str


@dataclass(frozen=True)
class Stall:
    """Send nothing more until ``close()``; before any chunk, not even the response headers."""


@dataclass(frozen=True)
class HttpError:
    """Answer with HTTP ``status`` and ``{"error": message}``; only valid as the first step."""

    status: int
    message: str


@dataclass(frozen=True)
class ErrorLine:
    """Send ``{"error": message}`` as an NDJSON line and end the response."""

    message: str


@dataclass(frozen=True)
class Cut:
    """Close the TCP connection mid-body, without the end of the chunked body."""


@dataclass(frozen=True)
class Done:
    """The final chunk, with token counts and a done reason."""

    prompt_tokens: int = 10
    output_tokens: int = 5
    reason: str = "stop"


Step = Text | Thinking | ToolCall | ChunkDelay | Pause | Stall | HttpError | ErrorLine | Cut | Done
_End = Done | ErrorLine | Cut | Stall
_TERMINAL = (Done, ErrorLine, Cut, Stall, HttpError)

_Message = dict[str, Any]


@dataclass(frozen=True)
class _Plan:
    """A script compiled into chunk messages and control steps, ready to serve."""

    body: tuple[_Message | ChunkDelay | Pause, ...]
    end: _End
    error: HttpError | None = None


@dataclass(frozen=True)
class Prompt:
    """The size of one ``/api/chat`` request's prompt, and the context it asked for."""

    tokens: int
    num_ctx: int | None

    @property
    def overflows(self) -> bool:
        """Real Ollama would have truncated this prompt to fit ``num_ctx``."""
        return self.num_ctx is not None and self.tokens > self.num_ctx


def _tokens(text: str) -> int:
    return math.ceil(len(text) / _CHARS_PER_TOKEN)


def _json_tokens(value: Any) -> int:
    return _tokens(json.dumps(value, sort_keys=True))


def prompt_tokens(body: Mapping[str, Any]) -> int:
    """The fake's token count for a ``/api/chat`` body: 3 characters a token, rounded up.

    Each message costs its content plus 4, and each tool call in it its ``function`` as sorted
    JSON; the ``tools`` offered cost their sorted JSON too.
    """
    total = 0
    for message in body.get("messages") or ():
        total += _tokens(message.get("content") or "") + _MESSAGE_OVERHEAD_TOKENS
        total += sum(_json_tokens(call["function"]) for call in message.get("tool_calls") or ())
    if body.get("tools"):
        total += _json_tokens(body["tools"])
    return total


def _prompt(body: Mapping[str, Any]) -> Prompt:
    options = body.get("options") or {}
    return Prompt(tokens=prompt_tokens(body), num_ctx=options.get("num_ctx"))


def _counted(plan: _Plan, tokens: int) -> _Plan:
    """``plan`` with its final chunk reporting ``tokens`` as the prompt's size."""
    if not isinstance(plan.end, Done):
        return plan
    return replace(plan, end=replace(plan.end, prompt_tokens=tokens))


@dataclass
class _Gate:
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    released: asyncio.Event = field(default_factory=asyncio.Event)


def _split(text: str, chunks: int) -> list[str]:
    if chunks < 1:
        raise ValueError(f"chunks must be at least 1, got {chunks}")
    size, extra = divmod(len(text), chunks)
    pieces, start = [], 0
    for index in range(chunks):
        end = start + size + (index < extra)
        pieces.append(text[start:end])
        start = end
    return pieces


def _validate(steps: Sequence[Step]) -> None:
    for index, step in enumerate(steps):
        if isinstance(step, HttpError) and index != 0:
            raise ValueError("HttpError must be the first step")
        if isinstance(step, _TERMINAL) and index != len(steps) - 1:
            raise ValueError(f"{step!r} ends the response, so no step may follow it")


def _compile(steps: Sequence[Step]) -> _Plan:
    _validate(steps)
    body: list[_Message | ChunkDelay | Pause] = []
    end: _End = Done()
    for step in steps:
        match step:
            case HttpError():
                return _Plan(body=(), end=end, error=step)
            case Done() | ErrorLine() | Cut() | Stall():
                end = step
            case Text(text=text, chunks=chunks):
                body.extend({"role": "assistant", "content": p} for p in _split(text, chunks))
            case Thinking(text=text, chunks=chunks):
                body.extend(
                    {"role": "assistant", "content": "", "thinking": p}
                    for p in _split(text, chunks)
                )
            case ToolCall(name=name, arguments=arguments):
                call = {"function": {"name": name, "arguments": arguments}}
                last = body[-1] if body else None
                if isinstance(last, dict) and "tool_calls" in last:
                    last["tool_calls"].append(call)
                else:
                    body.append({"role": "assistant", "content": "", "tool_calls": [call]})
            case ChunkDelay() | Pause():
                body.append(step)
    return _Plan(body=tuple(body), end=end)


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _final(model: str, done: Done, started_ns: int, message: _Message) -> dict[str, Any]:
    total = max(time.perf_counter_ns() - started_ns, 1)
    load, prompt_eval = total // 10, total // 5
    return {
        "model": model,
        "created_at": _now(),
        "message": message,
        "done": True,
        "done_reason": done.reason,
        "total_duration": total,
        "load_duration": load,
        "prompt_eval_count": done.prompt_tokens,
        "prompt_eval_duration": prompt_eval,
        "eval_count": done.output_tokens,
        "eval_duration": total - load - prompt_eval,
    }


def _chunk(message: _Message, model: str) -> dict[str, Any]:
    return {"model": model, "created_at": _now(), "message": message, "done": False}


def _last_line(end: Done | ErrorLine, model: str, started_ns: int) -> dict[str, Any]:
    if isinstance(end, ErrorLine):
        return {"error": end.message}
    return _final(model, end, started_ns, {"role": "assistant", "content": ""})


def _merge(body: Iterable[_Message | ChunkDelay | Pause]) -> _Message:
    """The whole message of a non-streamed reply: all chunks joined, pauses and delays dropped."""
    messages = [action for action in body if isinstance(action, dict)]
    merged: _Message = {"role": "assistant", "content": "".join(m["content"] for m in messages)}
    thinking = "".join(m.get("thinking", "") for m in messages)
    calls = [call for m in messages for call in m.get("tool_calls", ())]
    if thinking:
        merged["thinking"] = thinking
    if calls:
        merged["tool_calls"] = calls
    return merged


def _model_entry(name: str) -> dict[str, Any]:
    family = name.split(":", 1)[0]
    return {
        "name": name,
        "model": name,
        "modified_at": _MODIFIED_AT,
        "size": 2_500_000_000,
        "digest": hashlib.sha256(name.encode()).hexdigest(),
        "details": {
            "parent_model": "",
            "format": "gguf",
            "family": family,
            "families": [family],
            "parameter_size": "4.0B",
            "quantization_level": "Q4_K_M",
        },
    }


def _show_entry(name: str, context_length: int) -> dict[str, Any]:
    return {
        "modelfile": f"FROM {name}\n",
        "parameters": "",
        "template": "{{ .Prompt }}",
        "details": _model_entry(name)["details"],
        "model_info": {
            "general.architecture": ARCHITECTURE,
            "general.parameter_count": 4_000_000_000,
            f"{ARCHITECTURE}.context_length": context_length,
        },
        "capabilities": ["completion", "tools"],
        "modified_at": _MODIFIED_AT,
    }


async def _forever() -> NoReturn:
    """Wait until cancelled."""
    never = asyncio.Event()
    while True:
        await never.wait()


async def _write(request: web.Request, response: web.StreamResponse, body: dict[str, Any]) -> None:
    if not response.prepared:
        await response.prepare(request)
    await response.write((json.dumps(body) + "\n").encode())


async def _cut(request: web.Request, response: web.StreamResponse) -> None:
    if not response.prepared:
        await response.prepare(request)  # a StreamResponse sends its headers right away
    if request.transport is not None:
        request.transport.close()  # flushes what was written, then FIN: the body never ends


class ToolsRefused(ValueError):
    """Tools Ollama cannot read (its HTTP 400), e.g. a property's ``type`` that is a number."""


_Reader = Callable[[Any, str, list[str]], Any]
"""Reads (a value, its path, the paths dropped so far) into what Ollama keeps of the value."""


def _unmarshal(value: Any, path: str, wanted: str) -> ToolsRefused:
    """Ollama's (Go's) refusal of `value` at `path`, where `wanted` was expected."""
    return ToolsRefused(f"json: cannot unmarshal {type(value).__name__} into {path} {wanted}")


def _typed(kind: type | tuple[type, ...], go: str) -> _Reader:
    def read(value: Any, path: str, dropped: list[str]) -> Any:
        if value is not None and not isinstance(value, kind):
            raise _unmarshal(value, path, f"of type {go}")
        return value

    return read


def _anything(value: Any, path: str, dropped: list[str]) -> Any:
    return value


def _strings(value: Any, path: str, dropped: list[str]) -> Any:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(each, str) for each in value):
        return value
    raise _unmarshal(value, path, "of type []string")


def _struct(fields: Mapping[str, _Reader]) -> _Reader:
    def read(value: Any, path: str, dropped: list[str]) -> Any:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise _unmarshal(value, path, "(an object)")
        kept = {}
        for key, each in value.items():
            if key in fields:
                kept[key] = fields[key](each, f"{path}.{key}", dropped)
            else:
                dropped.append(f"{path}.{key}")
        return kept

    return read


def _map_of(reader: _Reader) -> _Reader:
    def read(value: Any, path: str, dropped: list[str]) -> Any:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise _unmarshal(value, path, "(an object)")
        return {key: reader(each, f"{path}.{key}", dropped) for key, each in value.items()}

    return read


def _list_of(reader: _Reader) -> _Reader:
    def read(value: Any, path: str, dropped: list[str]) -> Any:
        if value is None:
            return None
        if not isinstance(value, list):
            raise _unmarshal(value, path, "(an array)")
        return [reader(each, f"{path}[{index}]", dropped) for index, each in enumerate(value)]

    return read


_STRING = _typed(str, "string")
_REQUIRED = _list_of(_STRING)
_PROPERTY_FIELDS: dict[str, _Reader] = {}
_PROPERTY = _struct(_PROPERTY_FIELDS)
_PROPERTY_FIELDS.update(  # api.ToolProperty, which holds properties of its own
    anyOf=_list_of(_PROPERTY),
    type=_strings,
    items=_anything,
    description=_STRING,
    enum=_list_of(_anything),
    properties=_map_of(_PROPERTY),
    required=_REQUIRED,
)
_TOOL = _struct(
    {
        "type": _STRING,
        "items": _anything,
        "function": _struct(
            {
                "name": _STRING,
                "description": _STRING,
                "parameters": _struct(
                    {
                        "type": _STRING,
                        "$defs": _anything,
                        "items": _anything,
                        "required": _REQUIRED,
                        "properties": _map_of(_PROPERTY),
                    }
                ),
            }
        ),
    }
)


def read_tools(tools: Any) -> tuple[list[Any], list[str]]:
    """``tools`` as Ollama's server reads them (``api.Tool``, its ``api.ToolProperty`` with
    ``anyOf``, ``type``, ``items``, ``description``, ``enum``, ``properties`` and
    ``required``): what it keeps, and the path of every key it drops. Raises ``ToolsRefused``
    where it answers HTTP 400."""
    dropped: list[str] = []
    kept = _list_of(_TOOL)(tools, "tools", dropped)
    return kept or [], dropped


class FakeOllama:
    """A fake Ollama on 127.0.0.1: scripted ``/api/chat``, plus ``/api/show`` and ``/api/tags``.

    ``requests``, ``prompts`` and ``dropped`` (the keys of its tools Ollama would drop,
    ``read_tools``) record every ``/api/chat`` request, index for index. With
    ``count_prompts``, the final chunk's ``prompt_eval_count`` is ``prompt_tokens`` of the
    request instead of the scripted ``Done.prompt_tokens``. ``show_error``, while set, is what
    every ``/api/show`` answers. ``without_tools``, while set, answers every request that offers
    no tools (a summary request, say), leaving the script for the others.
    """

    def __init__(
        self,
        models: Iterable[str] = ("test-model",),
        context_lengths: Mapping[str, int] | None = None,
        count_prompts: bool = False,
    ) -> None:
        self.models: list[str] = list(models)
        self.context_lengths: dict[str, int] = dict(context_lengths or {})
        self.count_prompts = count_prompts
        self.requests: list[dict[str, Any]] = []
        self.arrivals: list[float] = []
        """When each ``/api/chat`` request arrived (``time.time()``), index for index."""
        self.prompts: list[Prompt] = []
        self.dropped: list[list[str]] = []
        self.show_requests: list[str] = []
        self.show_error: HttpError | None = None
        self.without_tools = None
        self._routed: list[tuple[str, _Plan]] = []
        self.tags_requests = 0
        self.url = ""
        self._queue: deque[_Plan] = deque()
        self.default = [Text("ok")]
        self._gates: dict[str, _Gate] = {}
        self._stalled = asyncio.Event()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._runner: web.AppRunner | None = None
        self._closing = False

    @property
    def default(self) -> Sequence[Step]:
        """Steps served when no script is queued."""
        return self._default_steps

    @default.setter
    def default(self, steps: Sequence[Step]) -> None:
        self._default = _compile(steps)
        self._default_steps = tuple(steps)

    @property
    def without_tools(self) -> Sequence[Step] | None:
        """Steps served to every request that offers no tools, whatever is queued."""
        return self._without_tools_steps

    @without_tools.setter
    def without_tools(self, steps: Sequence[Step] | None) -> None:
        self._without_tools = None if steps is None else _compile(steps)
        self._without_tools_steps = None if steps is None else tuple(steps)

    def script_for(self, marker: str, *steps: Step) -> None:
        """Queue a response for the next request whose first two messages (a system prompt and
        the first user message: an agent's, or a sub-agent's task) contain `marker`; such a
        request takes it before anything else queued."""
        self._routed.append((marker, _compile(steps)))

    def script(self, *steps: Step) -> None:
        """Queue one response for the next ``/api/chat`` call (FIFO, one per request).

        A request for an unknown model gets a 404 and leaves the queue alone.
        """
        self._queue.append(_compile(steps))

    def release(self, name: str) -> None:
        """Let streams held at ``Pause(name)`` go on; a later ``Pause(name)`` will not hold."""
        self._gate(name).released.set()

    async def reached(self, name: str) -> None:
        """Wait until a stream arrives at ``Pause(name)`` (may be awaited before it is sent)."""
        await self._gate(name).reached.wait()

    async def stalled(self) -> None:
        """Wait until a request arrives at a ``Stall``."""
        await self._stalled.wait()

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.router.add_post("/api/chat", self._chat)
        app.router.add_post("/api/show", self._show)
        app.router.add_get("/api/tags", self._tags)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", port, backlog=1024).start()
        host, bound_port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{bound_port}"

    async def close(self) -> None:
        """Cut every request still held (Pause, Stall, ChunkDelay), then stop the server."""
        if self._runner is None:
            return
        runner, self._runner = self._runner, None
        self._closing = True
        handlers = set(self._handlers)
        for task in handlers:
            task.cancel()
        if handlers:
            await asyncio.wait(handlers)
        await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _route(self, body: Mapping[str, Any]) -> _Plan | None:
        opening = " ".join(str(m.get("content", "")) for m in body.get("messages", [])[:2])
        for index, (marker, plan) in enumerate(self._routed):
            if marker in opening:
                del self._routed[index]
                return plan
        return None

    def _gate(self, name: str) -> _Gate:
        return self._gates.setdefault(name, _Gate())

    async def _tags(self, request: web.Request) -> web.Response:
        self.tags_requests += 1
        return web.json_response({"models": [_model_entry(name) for name in self.models]})

    async def _show(self, request: web.Request) -> web.Response:
        model = (await request.json()).get("model", "")
        self.show_requests.append(model)
        if self.show_error is not None:
            return _error(self.show_error.status, self.show_error.message)
        if model not in self.models:
            return _error(404, f"model '{model}' not found")
        context_length = self.context_lengths.get(model, DEFAULT_CONTEXT_LENGTH)
        return web.json_response(_show_entry(model, context_length))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        if self._closing:
            return _error(503, "server is shutting down")
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            return await self._answer(request)
        finally:
            self._handlers.discard(task)

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = _prompt(body)
        self.arrivals.append(time.time())
        self.requests.append(body)
        self.prompts.append(prompt)
        try:
            self.dropped.append(read_tools(body.get("tools"))[1])
        except ToolsRefused as exc:
            self.dropped.append([])
            return _error(400, str(exc))
        model = body.get("model", "")
        if model not in self.models:
            return _error(404, f"model '{model}' not found")
        routed = self._route(body)
        if routed is not None:
            plan = routed
        elif self._without_tools is not None and not body.get("tools"):
            plan = self._without_tools
        else:
            plan = self._queue.popleft() if self._queue else self._default
        if self.count_prompts:
            plan = _counted(plan, prompt.tokens)
        if plan.error is not None:
            return _error(plan.error.status, plan.error.message)
        if body.get("stream", True):
            return await self._stream(request, model, plan)
        return await self._whole(request, model, plan)

    async def _stream(self, request: web.Request, model: str, plan: _Plan) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        response.enable_chunked_encoding()
        started = time.perf_counter_ns()
        delay = 0.0
        with contextlib.suppress(ConnectionResetError):  # the client went away
            for action in plan.body:
                if isinstance(action, ChunkDelay):
                    delay = action.seconds
                elif isinstance(action, Pause):
                    await self._pause(action.name)
                else:
                    if delay:
                        await asyncio.sleep(delay)
                    await _write(request, response, _chunk(action, model))
            match plan.end:
                case Stall():
                    await self._stall()
                case Cut():
                    await _cut(request, response)
                case Done() | ErrorLine() as end:
                    if delay:
                        await asyncio.sleep(delay)
                    await _write(request, response, _last_line(end, model, started))
        return response

    async def _whole(self, request: web.Request, model: str, plan: _Plan) -> web.StreamResponse:
        started = time.perf_counter_ns()
        match plan.end:
            case Stall():
                await self._stall()
            case ErrorLine(message=message):
                return _error(500, message)
            case Cut():
                response = web.StreamResponse()
                await _cut(request, response)
                return response
            case Done() as done:
                return web.json_response(_final(model, done, started, _merge(plan.body)))

    async def _pause(self, name: str) -> None:
        gate = self._gate(name)
        gate.reached.set()
        await gate.released.wait()

    async def _stall(self) -> NoReturn:
        self._stalled.set()
        await _forever()


def scripted_steps(line: str) -> list[Step]:
    """One response of a `--script` file: a JSON list of `{"text": ...}`, `{"tool": name,
    "arguments": {...}}` and `{"delay_ms": n}` (before each following chunk)."""
    steps: list[Step] = []
    for item in json.loads(line):
        if "tool" in item:
            steps.append(ToolCall(item["tool"], item.get("arguments", {})))
        elif "delay_ms" in item:
            steps.append(ChunkDelay(item["delay_ms"] / 1000))
        else:
            steps.append(Text(item["text"], item.get("chunks", 1)))
    return steps


async def _serve(port: int, chunks: int, delay_ms: float, model: str, script: list[str]) -> None:
    fake = FakeOllama(models=[model])
    fake.default = [ChunkDelay(delay_ms / 1000), Text(BENCHMARK_REPLY, chunks)]
    for line in filter(str.strip, script):
        fake.script(*scripted_steps(line))
    await fake.start(port)
    print(f"READY {fake.url}", flush=True)
    try:
        await _forever()
    finally:
        await fake.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a fake Ollama for benchmarks.")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--chunks", type=int, default=50, help="text chunks per reply")
    parser.add_argument("--delay-ms", type=float, default=2.0, help="sleep before each chunk")
    parser.add_argument("--model", default="test-model", help="the one model served")
    parser.add_argument(
        "--script",
        type=Path,
        help="answers served first, in order: one JSON list of steps per line "
        '([{"text": "Hi"}], [{"tool": "current_time", "arguments": {}}], ...)',
    )
    args = parser.parse_args(argv)
    script = args.script.read_text(encoding="utf-8").splitlines() if args.script else []
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.port, args.chunks, args.delay_ms, args.model, script))


if __name__ == "__main__":
    main()
