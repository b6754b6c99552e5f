"""Tools the model may call: one flat registry, JSON schemas generated from type hints.

A tool is a plain (async or sync) function. Its name is the function's name, its description is
the docstring's first paragraph, and its parameter schema comes from the signature, so the schema
the model sees can never drift from the code that runs. Parameters may carry a description with
`Annotated[str, "what it is"]`. Arguments are checked against the schema before the tool runs;
the agent loop turns a failed check into a tool result the model can act on.

`read_only` tools touch nothing outside themselves, so the loop may run several at once.

A synchronous tool runs in a thread of its own, so however long it works the event loop (every
other conversation, `/stop`) goes on. The thread is a daemon: one the loop gave up on cannot keep
the process from exiting. An async tool runs on the loop as a task; one the loop gave up on
(`abandon`) is remembered until it ends, so the process can exit without waiting for it.

A tool learns where it was called from with `calling()`: the place, the person, the provenance
and the turn (`ToolContext`). The turn sets it for its whole task (`called_from`), so every tool
the turn runs sees it, a synchronous one in its thread too; a tool outside any turn sees None.
A context variable rather than a parameter keeps tools' signatures (and so their schemas) what
the model is shown.
"""

import asyncio
import contextlib
import contextvars
import inspect
import logging
import threading
import types
import typing
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from core.errors import ConfigError

logger = logging.getLogger(__name__)

ToolFunction = Callable[..., Awaitable[str] | str]

_JSON_TYPES: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


@dataclass(frozen=True)
class ToolContext:
    """Where a tool is being called from: a turn in `place` on `platform`, started by `person`
    (a platform user id; None when nobody is: a scheduled firing, a sub-agents' wake turn),
    with `provenance` ("person", "schedule", "subagent")."""

    platform: str
    place: str
    person: str | None
    provenance: str
    person_name: str = ""
    """How the person is shown (their name where the platform gives one, else their id)."""
    granted: frozenset[str] = frozenset()
    """Tools a person approved beforehand for this whole run (a sub-agent's delegation)."""
    turn: Callable[[], Awaitable[int]] | None = None
    """The calling turn's id, once it is stored (None outside a conversation's turn)."""

    @property
    def attended(self) -> bool:
        """A person started the turn and sees its reply (no firing, no wake turn)."""
        return self.provenance == "person"


_calling: contextvars.ContextVar[ToolContext | None] = contextvars.ContextVar(
    "the turn calling tools", default=None
)


def calling() -> ToolContext | None:
    """The context of the turn running this tool (None outside a turn)."""
    return _calling.get()


@contextlib.contextmanager
def called_from(context: ToolContext) -> Iterator[None]:
    """Every tool run inside the block (and the tasks it starts) sees `context`."""
    token = _calling.set(context)
    try:
        yield
    finally:
        _calling.reset(token)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    function: ToolFunction
    parameters: dict[str, Any]
    read_only: bool = False
    timeout: float | None = None
    final: bool = False
    """Calling it ends the agent loop, its result the answer (a sub-agent's `report`)."""

    def schema(self) -> dict[str, Any]:
        """The tool as Ollama's `tools` request field expects it."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    async def invoke(self, arguments: dict[str, Any]) -> str:
        if inspect.iscoroutinefunction(self.function):
            return str(await self.function(**arguments))
        return str(await _in_thread(self.name, self.function, arguments))


def _in_thread(
    name: str, function: ToolFunction, arguments: dict[str, Any]
) -> "asyncio.Future[Any]":
    """`function(**arguments)` in a daemon thread; a future of its outcome. Cancelling the future
    stops nobody waiting on the thread, which finishes unobserved."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()  # the thread sees the turn's `calling()`

    def settle(outcome: Any, error: BaseException | None) -> None:
        if future.done():  # given up on: the outcome changes nothing
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(outcome)

    def run() -> None:
        try:
            outcome, error = context.run(function, **arguments), None
        except Exception as exc:
            outcome, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop has closed meanwhile
            loop.call_soon_threadsafe(settle, outcome, error)

    threading.Thread(target=run, name=f"tool {name}", daemon=True).start()
    return future


_ABANDONED: set["asyncio.Future[Any]"] = set()


def abandon(running: "asyncio.Future[Any]", name: str, grace: float) -> None:
    """Give up on a tool that did not end within `grace` seconds of being cancelled: whatever it
    does later is ignored, and it is remembered until it ends (`abandoned_tools`)."""
    logger.warning(
        "tool %s did not stop within %g s of being cancelled; it is abandoned and its result "
        "will be ignored",
        name,
        grace,
    )
    _ABANDONED.add(running)
    running.add_done_callback(_forget)


def _forget(running: "asyncio.Future[Any]") -> None:
    _ABANDONED.discard(running)
    if not running.cancelled():
        running.exception()  # retrieved, so asyncio does not log it


def abandoned_tools() -> int:
    """How many abandoned tools have still not ended."""
    return len(_ABANDONED)


def tool(
    *, read_only: bool = False, timeout: float | None = None, final: bool = False
) -> Callable[[ToolFunction], Tool]:
    """Decorator: build a `Tool` from a function's signature and docstring."""

    def build(function: ToolFunction) -> Tool:
        doc = inspect.getdoc(function) or ""
        return Tool(
            name=function.__name__,
            description=doc.split("\n\n")[0].replace("\n", " "),
            function=function,
            parameters=parameters_schema(function),
            read_only=read_only,
            timeout=timeout,
            final=final,
        )

    return build


def parameters_schema(function: Callable[..., Any]) -> dict[str, Any]:
    hints = typing.get_type_hints(function, include_extras=True)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, parameter in inspect.signature(function).parameters.items():
        properties[name] = _type_schema(hints.get(name, str))
        if parameter.default is inspect.Parameter.empty:
            required.append(name)
    return {"type": "object", "properties": properties, "required": required}


def _type_schema(hint: Any) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    if origin is Annotated:
        base, *extras = typing.get_args(hint)
        schema = _type_schema(base)
        descriptions = [extra for extra in extras if isinstance(extra, str)]
        return {**schema, "description": descriptions[0]} if descriptions else schema
    if origin is Literal:
        values = list(typing.get_args(hint))
        return {"type": _JSON_TYPES[type(values[0])], "enum": values}
    if origin in (types.UnionType, typing.Union):
        options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _type_schema(options[0])
    if origin is list:
        (item,) = typing.get_args(hint) or (str,)
        return {"type": "array", "items": _type_schema(item)}
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    raise TypeError(f"tool parameter type {hint!r} has no JSON schema mapping")


def argument_problems(tool: Tool, arguments: dict[str, Any]) -> list[str]:
    """What is wrong with `arguments` for `tool`, in words the model can act on; empty if fine."""
    properties: dict[str, Any] = tool.parameters["properties"]
    problems = [
        f"missing required argument '{name}'"
        for name in tool.parameters["required"]
        if name not in arguments
    ]
    for name, value in arguments.items():
        if name not in properties:
            problems.append(f"unknown argument '{name}' (valid: {', '.join(properties) or 'none'})")
        elif not _matches(properties[name], value):
            problems.append(f"argument '{name}' must be {_describe(properties[name])}")
    return problems


def _matches(schema: dict[str, Any], value: Any) -> bool:
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema.get("type")
    # A schema this check does not model (an MCP server's anyOf, null): the tool judges.
    if kind not in ("array", "object", "number", "integer", "string", "boolean"):
        return True
    if kind == "array":
        items = schema.get("items", {})
        return isinstance(value, list) and all(_matches(items, item) for item in value)
    if kind == "object":
        properties = schema.get("properties", {})
        return (
            isinstance(value, dict)
            and all(name in value for name in schema.get("required", ()))
            and all(_matches(properties[k], v) for k, v in value.items() if k in properties)
        )
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, {"string": str, "boolean": bool}[kind])


def _describe(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return "one of " + ", ".join(repr(value) for value in schema["enum"])
    if schema.get("type") == "array":
        return f"a list of {_describe(schema.get('items', {}))} values"
    if schema.get("type") == "object":
        return f"an object with {', '.join(schema.get('required', ())) or 'any'} keys"
    return f"a {schema['type']}"


class ToolRegistry:
    """Every tool Kaiwa knows, by name: one flat namespace, so a repeated name is an error."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for each in tools:
            self.register(each)

    def register(self, new: Tool) -> None:
        if new.name in self._tools:
            raise ValueError(f"a tool named '{new.name}' is already registered")
        self._tools[new.name] = new

    def names(self) -> list[str]:
        return sorted(self._tools)

    def select(self, names: Iterable[str], *, config_key: str) -> dict[str, Tool]:
        """The tools an agent may use; an unknown name fails naming the key and the valid names."""
        chosen: dict[str, Tool] = {}
        for name in names:
            if name not in self._tools:
                raise ConfigError(
                    f"{config_key}: unknown tool '{name}'; valid tools: {', '.join(self.names())}"
                )
            chosen[name] = self._tools[name]
        return chosen


def builtin_tools(default_timezone: str) -> list[Tool]:
    """The tools that ship with Kaiwa. `default_timezone` is an IANA name, or "" for local time."""

    @tool(read_only=True)
    def current_time(
        timezone: Annotated[str, "IANA time zone such as Europe/Paris; empty for the default"] = "",
    ) -> str:
        """The current date and time, with its time zone and weekday."""
        zone_name = timezone or default_timezone
        try:
            zone = ZoneInfo(zone_name) if zone_name else None
        except (ZoneInfoNotFoundError, ValueError):
            return f"Unknown time zone '{zone_name}'. Use an IANA name such as 'Europe/Paris'."
        now = datetime.now(zone).astimezone(zone)
        return now.strftime("%A %Y-%m-%d %H:%M:%S %Z (UTC%z)")

    return [current_time]
