"""Tools the model may call: one flat registry, JSON schemas generated from type hints.

A tool is a plain (async or sync) function. Its name is the function's name, its description is
the docstring's first paragraph, and its parameter schema comes from the signature, so the schema
the model sees can never drift from the code that runs. Parameters may carry a description with
`Annotated[str, "what it is"]`. Arguments are checked against the schema before the tool runs;
the agent loop turns a failed check into a tool result the model can act on.

What Ollama is sent of a tool (`Tool.schema`, any tool's: built in or an MCP server's) is its
schema in the shape Ollama's API reads, losing nothing (`ollama_parameters`): Ollama keeps only
a few keywords of a property and drops the rest unseen, so references are inlined and what it has
no field for (a default, a range, a format) is said in the property's description.

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
import functools
import inspect
import json
import logging
import threading
import types
import typing
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
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
        """The tool as Ollama's `tools` request field carries it whole (`ollama_parameters`):
        what its schema has no field for is said in the descriptions."""
        return self._schema

    @functools.cached_property
    def _schema(self) -> dict[str, Any]:
        parameters, notes = ollama_parameters(self.parameters)
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": f"{self.description} {notes}" if notes else self.description,
                "parameters": parameters,
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


UNSAID = frozenset({"title", "$schema", "$id", "$comment", "$defs", "definitions"})
"""Keywords that tell a model nothing: a title repeats the name, the rest serve validators
(definitions are inlined where they are used)."""


def ollama_parameters(schema: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """A tool's parameter schema as Ollama's API carries it whole, and what the tool's
    description must add (what the schema says of all its arguments together: its own
    description, then its other keywords in brackets).

    Ollama reads an object's `properties` and `required`, and of each property only `anyOf`,
    `type`, `items`, `description`, `enum`, `properties` and `required` (its `api.ToolProperty`);
    it silently drops any other keyword, and refuses the whole request for one of the wrong
    shape. So each `$ref` is inlined (a recursive one is named instead), `allOf` merged, `oneOf`
    read as `anyOf` and `const` as a one-value `enum`, a keyword of the wrong shape is said
    rather than sent, and what Ollama has no field for (`default`, `minimum`, `maximum`,
    `format`, `pattern`, ...) is folded into the property's description, so the model still
    learns it.
    """
    said = schema.get("description")
    root = _Shaper(schema).shape(
        {key: value for key, value in schema.items() if key != "description"}
    )
    parameters = {
        "type": "object",
        "properties": root.pop("properties", {}),
        "required": root.pop("required", []),
    }
    root.pop("type", None)
    notes = [root.pop("description")] if "description" in root else []
    notes += [f"{key}: {_said(key, value)}" for key, value in root.items()]
    folded = f"({'; '.join(notes)})" if notes else ""
    return parameters, " ".join(filter(None, [said if isinstance(said, str) else "", folded]))


class _Shaper:
    """One JSON Schema into Ollama's shape, its references inlined from its own root."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self._root = root
        self._inlining: list[str] = []
        """The references being inlined, outermost first: meeting one again is recursion."""

    def shape(self, schema: Any) -> dict[str, Any]:
        if not isinstance(schema, Mapping):  # a boolean schema: anything, or nothing
            return {} if schema is not False else {"description": "no value is allowed"}
        schema = _plain(schema)
        reference = schema.get("$ref")
        if isinstance(reference, str) and (target := self._target(reference)) is not None:
            return self._inlined(reference, target, schema)
        shaped: dict[str, Any] = {}
        notes: list[str] = []
        description = schema.get("description")
        for key, value in schema.items():
            said_apart = key == "description" and isinstance(value, str)
            if key in UNSAID or said_apart or _leaves_open(key, value):
                continue
            if _ollama_reads(key, value):
                shaped[key] = self._inner(key, value)
            elif key == "additionalProperties" and isinstance(value, Mapping):
                notes.append(f"{key}: {json.dumps(self.shape(value), ensure_ascii=False)}")
            else:
                notes.append(f"{key}: {_said(key, value)}")
        said = "; ".join(notes)
        if isinstance(description, str) and description:
            said = f"{description} ({said})" if said else description
        if said:
            shaped["description"] = said
        return shaped

    def _inner(self, key: str, value: Any) -> Any:
        if key == "anyOf":
            return [self.shape(each) for each in value]
        if key == "properties":
            return {name: self.shape(each) for name, each in value.items()}
        if key == "items":
            return (
                [self.shape(each) for each in value]
                if isinstance(value, list)
                else self.shape(value)
            )
        return value

    def _inlined(
        self, reference: str, target: Mapping[str, Any], schema: Mapping[str, Any]
    ) -> dict[str, Any]:
        siblings = {key: value for key, value in schema.items() if key != "$ref"}
        if reference not in self._inlining:
            self._inlining.append(reference)
            try:
                return self.shape({**target, **siblings})
            finally:
                self._inlining.pop()
        name = reference.rsplit("/", 1)[-1] or "schema"
        again = self.shape(siblings)
        again.setdefault("type", target.get("type", "object"))
        note = f"a {name}, shaped as the enclosing {name}"
        again["description"] = (
            f"{again['description']} ({note})" if "description" in again else note
        )
        return again

    def _target(self, reference: str) -> Mapping[str, Any] | None:
        """What a local reference (`#/$defs/Name`) points at; None for any other."""
        if reference != "#" and not reference.startswith("#/"):
            return None
        node: Any = self._root
        for token in filter(None, reference[2:].split("/")):
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping):
                node = node.get(token)
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                return None
        return node if isinstance(node, Mapping) else None


def _plain(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The same schema in the words Ollama knows: `allOf` merged into it (unless two parts
    refer elsewhere), `oneOf` as `anyOf`, `const` as a one-value `enum`."""
    plain = dict(schema)
    parts = plain.get("allOf")
    mergeable = isinstance(parts, list) and all(isinstance(part, Mapping) for part in parts)
    if mergeable and sum("$ref" in each for each in (plain, *parts)) <= 1:
        del plain["allOf"]
        for part in parts:
            plain = _merged(plain, part)
    if "oneOf" in plain and "anyOf" not in plain:
        plain["anyOf"] = plain.pop("oneOf")
    if "const" in plain and "enum" not in plain:
        plain["enum"] = [plain.pop("const")]
    return plain


def _merged(schema: dict[str, Any], part: Mapping[str, Any]) -> dict[str, Any]:
    merged = {**part, **schema}
    if isinstance(schema.get("properties"), Mapping) and isinstance(
        part.get("properties"), Mapping
    ):
        merged["properties"] = {**part["properties"], **schema["properties"]}
    if isinstance(schema.get("required"), list) and isinstance(part.get("required"), list):
        merged["required"] = list(dict.fromkeys([*schema["required"], *part["required"]]))
    return merged


def _leaves_open(key: str, value: Any) -> bool:
    """Whether the keyword says nothing beyond what the properties say: whether other keys are
    allowed (JSON Schema's default) or not (the properties are all the model is shown)."""
    return key == "additionalProperties" and isinstance(value, bool)


def _ollama_reads(key: str, value: Any) -> bool:
    """Whether Ollama reads `key` of a property with this value (a value of the wrong shape
    makes it refuse the whole request)."""
    if key == "type":
        return isinstance(value, str) or (
            isinstance(value, list) and all(isinstance(each, str) for each in value)
        )
    if key == "required":
        return isinstance(value, list) and all(isinstance(each, str) for each in value)
    if key in ("anyOf", "enum"):
        return isinstance(value, list)
    if key == "properties":
        return isinstance(value, Mapping)
    return key == "items"


def _said(key: str, value: Any) -> str:
    """A keyword's value for a description: text as it is (a default quoted, so it reads as
    text), anything else as JSON."""
    if isinstance(value, str) and key != "default":
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


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
