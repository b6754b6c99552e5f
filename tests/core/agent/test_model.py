"""The model client's failure modes, each through the real ollama client against the fake.

Every failure must become one of our errors with a one-line message that says what to do.
"""

import asyncio

import pytest

from core.agent.model import ModelClient, ModelReply, ModelSettings, OllamaHost, model_is_available
from core.agent.tools import Tool
from core.errors import (
    ModelHTTPError,
    ModelNotFound,
    ModelStreamError,
    ModelTimeout,
    ModelUnreachable,
)
from tests.fakes.ollama import Cut, ErrorLine, FakeOllama, HttpError, Pause, Stall, Text
from tests.fakes.patience import deadline
from tests.ports import free_port

HELLO = [{"role": "user", "content": "hello"}]


def ignore(text: str, thinking: str) -> None:
    pass


async def chat(client: ModelClient, model: str = "test-model") -> str:
    async with asyncio.timeout(deadline()):
        reply = await client.chat(model, HELLO, ModelReply(), ignore)
    return reply.text


async def test_unreachable_ollama_says_how_to_start_it() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    client = ModelClient(ModelSettings(url=url, connect_timeout=2))
    try:
        with pytest.raises(ModelUnreachable, match=r"cannot reach Ollama at .*ollama serve"):
            await chat(client)
        with pytest.raises(ModelUnreachable):
            await client.list_models()
    finally:
        await client.close()


async def test_missing_model_says_which_pull(model: ModelClient) -> None:
    with pytest.raises(
        ModelNotFound, match=r"model qwen3:4b not found: run `ollama pull qwen3:4b`"
    ):
        await chat(model, "qwen3:4b")


async def test_server_error_names_the_status(ollama: FakeOllama, model: ModelClient) -> None:
    ollama.script(HttpError(500, "out of memory"))
    with pytest.raises(ModelHTTPError, match="HTTP 500: out of memory"):
        await chat(model)


async def test_a_model_that_cannot_think_says_how_to_turn_it_off(
    ollama: FakeOllama, model: ModelClient
) -> None:
    ollama.script(HttpError(400, '"test-model" does not support thinking'))
    with pytest.raises(ModelHTTPError, match="set think = false for this agent"):
        await chat(model)


async def test_error_line_mid_stream(ollama: FakeOllama, model: ModelClient) -> None:
    ollama.script(Text("Start"), ErrorLine("runner crashed"))
    with pytest.raises(ModelStreamError, match="error mid-reply: runner crashed"):
        await chat(model)


async def test_cut_stream(ollama: FakeOllama, model: ModelClient) -> None:
    ollama.script(Text("Start"), Cut())
    with pytest.raises(ModelStreamError, match="broke off"):
        await chat(model)


async def test_stall_before_first_chunk(ollama: FakeOllama) -> None:
    client = ModelClient(ModelSettings(url=ollama.url, first_chunk_timeout=0.2))
    ollama.script(Stall())
    try:
        with pytest.raises(ModelTimeout, match=r"sent nothing for 0.2 s.*first_chunk_timeout"):
            await chat(client)
    finally:
        await client.close()


async def test_silence_mid_stream(ollama: FakeOllama) -> None:
    client = ModelClient(ModelSettings(url=ollama.url, idle_timeout=0.2))
    ollama.script(Text("Start"), Stall())
    try:
        with pytest.raises(ModelTimeout, match=r"went silent for 0.2 s.*idle_timeout"):
            await chat(client)
    finally:
        await client.close()


async def test_requests_beyond_the_cap_wait_in_kaiwa(ollama: FakeOllama) -> None:
    client = ModelClient(ModelSettings(url=ollama.url, max_concurrent_requests=2))
    ollama.script(Pause("first"), Text("one"))
    ollama.script(Pause("second"), Text("two"))
    ollama.script(Text("three"))
    try:
        replies = [asyncio.create_task(chat(client)) for _ in range(3)]
        await ollama.reached("first")
        await ollama.reached("second")
        assert len(ollama.requests) == 2
        ollama.release("first")
        ollama.release("second")
        assert sorted(await asyncio.gather(*replies)) == ["one", "three", "two"]
    finally:
        await client.close()


async def test_list_models(ollama: FakeOllama, model: ModelClient) -> None:
    ollama.models.append("qwen3:4b")
    assert await model.list_models() == ["test-model", "qwen3:4b"]


def test_a_name_without_a_tag_means_latest() -> None:
    assert model_is_available("llama3.2", ["llama3.2:latest"])
    assert model_is_available("llama3.2:latest", ["llama3.2"])
    assert not model_is_available("llama3.2", ["llama3.2:1b"])


async def test_a_request_that_must_queue_says_how_many_are_ahead(ollama: FakeOllama) -> None:
    """A person whose turn waits for a model slot sees why, instead of a silent reply."""
    client = ModelClient(ModelSettings(url=ollama.url, max_concurrent_requests=1))
    ollama.script(Pause("first"), Text("one"))
    ollama.script(Text("two"))
    said: list[str] = []
    heard = asyncio.Event()

    def status(text: str) -> None:
        said.append(text)
        heard.set()

    try:
        first = asyncio.create_task(chat(client))
        await ollama.reached("first")
        second = asyncio.create_task(
            client.chat("test-model", HELLO, ModelReply(), ignore, on_status=status)
        )
        await heard.wait()
        assert said == ["waiting for the model: 1 request ahead"]
        ollama.release("first")
        assert await first == "one"
        assert (await second).text == "two"
    finally:
        await client.close()
    assert said[1] == "waiting for test-model…", "then, at once, what it waits for next"


async def test_a_slow_first_piece_says_the_model_is_loading(
    ollama: FakeOllama, model: ModelClient
) -> None:
    ollama.script(Pause("loading"), Text("ready"))
    said: list[str] = []
    heard = asyncio.Event()

    def status(text: str) -> None:
        said.append(text)
        heard.set()

    chatting = asyncio.create_task(
        model.chat("test-model", HELLO, ModelReply(), ignore, on_status=status)
    )
    await heard.wait()  # after half a second without a piece
    ollama.release("loading")
    await chatting
    assert said == ["loading test-model…"]
    ollama.script(Pause("warm"), Text("again"))
    heard.clear()
    chatting = asyncio.create_task(
        model.chat("test-model", HELLO, ModelReply(), ignore, on_status=status)
    )
    await heard.wait()
    ollama.release("warm")
    await chatting
    assert said[-1] == "waiting for test-model…", "a model that just answered is not loading"


async def test_a_503_before_the_first_piece_is_tried_again(
    ollama: FakeOllama, model: ModelClient, caplog: pytest.LogCaptureFixture
) -> None:
    ollama.script(HttpError(503, "busy loading another model"))
    ollama.script(Text("Fine.", chunks=2))
    shown: list[str] = []

    reply = await model.chat("test-model", HELLO, ModelReply(), lambda text, _: shown.append(text))

    assert reply.text == "Fine." and "".join(shown) == "Fine.", "nothing shown twice"
    assert len(ollama.requests) == 2
    assert "Ollama answered HTTP 503: busy loading another model" in caplog.text
    assert "trying again in 0.01 s (1 of 2)" in caplog.text


async def test_a_failure_after_the_first_piece_is_final(
    ollama: FakeOllama, model: ModelClient
) -> None:
    ollama.script(Text("Half of it"), Cut())
    ollama.script(Text("never asked for"))

    with pytest.raises(ModelStreamError):
        await chat(model)
    assert len(ollama.requests) == 1


async def test_tries_again_are_bounded_and_only_for_passing_failures(
    ollama: FakeOllama, model: ModelClient
) -> None:
    for _ in range(3):
        ollama.script(HttpError(503, "busy"))
    ollama.script(HttpError(500, "broken"))
    ollama.script(Text("never asked for"))

    with pytest.raises(ModelHTTPError, match="503"):
        await chat(model)
    with pytest.raises(ModelHTTPError, match="500"):
        await chat(model)
    assert len(ollama.requests) == 4, "three tries of the 503, one of the 500"


# -- tools -----------------------------------------------------------------------------------

SEARCH = {  # as a TypeScript MCP server writes it
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "query": {"type": "string", "minLength": 1, "description": "what to find"},
        "filter": {
            "type": "object",
            "properties": {
                "since": {"type": "string", "format": "date"},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
            },
            "required": ["since"],
        },
        "mode": {"oneOf": [{"const": "fast"}, {"const": "thorough"}], "default": "fast"},
        "tree": {"$ref": "#/$defs/node"},
    },
    "required": ["query"],
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        }
    },
}


async def search(**arguments: object) -> str:
    return "found"


async def test_a_tools_whole_schema_reaches_ollama(ollama: FakeOllama, model: ModelClient) -> None:
    """Regression (issue 26): the client's typed tools dropped each property's `anyOf` and the
    properties of an object, and Ollama has no field for a default, a format or a length, nor
    can it follow a `$ref`: the body carries every property with its type, constraints said in
    its description, references inlined (a recursive one named), and nothing Ollama drops."""
    tool = Tool("search", "Search the notes.", search, SEARCH)

    await model.chat("test-model", HELLO, ModelReply(), ignore, tools=[tool.schema()])

    assert ollama.requests[0]["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "search",
                "description": "Search the notes.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "query": {"type": "string", "description": "what to find (minLength: 1)"},
                        "filter": {
                            "type": "object",
                            "properties": {
                                "since": {"type": "string", "description": "format: date"},
                                "tags": {
                                    "type": "array",
                                    "items": {"type": "string"},
                                    "description": "maxItems: 5",
                                },
                            },
                            "required": ["since"],
                        },
                        "mode": {
                            "anyOf": [{"enum": ["fast"]}, {"enum": ["thorough"]}],
                            "description": 'default: "fast"',
                        },
                        "tree": {
                            "type": "object",
                            "properties": {
                                "children": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "description": "a node, shaped as the enclosing node",
                                    },
                                }
                            },
                        },
                    },
                    "required": ["query"],
                },
            },
        }
    ]
    assert ollama.dropped == [[]]


async def test_a_keyword_of_a_shape_ollama_refuses_is_said_not_sent(
    ollama: FakeOllama, model: ModelClient
) -> None:
    """Ollama answers HTTP 400 to the whole request for one property of the wrong shape (a
    `required` of an old draft, a type that is not a name): that one tool would fail every
    turn of every agent that has it."""
    old = {"type": "object", "properties": {"path": {"type": "string", "required": True}}}
    tool = Tool("read", "Read a file.", search, old)

    reply = await model.chat("test-model", HELLO, ModelReply(), ignore, tools=[tool.schema()])

    assert reply.text == "ok"
    parameters = ollama.requests[0]["tools"][0]["function"]["parameters"]
    assert parameters["properties"] == {"path": {"type": "string", "description": "required: true"}}


async def test_what_a_whole_schema_says_beside_its_properties_joins_the_description(
    ollama: FakeOllama, model: ModelClient
) -> None:
    either = {
        "type": "object",
        "description": "Give a path or an id.",
        "properties": {"path": {"type": "string"}, "id": {"type": "integer"}},
        "minProperties": 1,
    }
    tool = Tool("open", "Open a document.", search, either)

    await model.chat("test-model", HELLO, ModelReply(), ignore, tools=[tool.schema()])

    function = ollama.requests[0]["tools"][0]["function"]
    assert function["description"] == "Open a document. Give a path or an id. (minProperties: 1)"
    assert ollama.dropped == [[]]


# -- several hosts ---------------------------------------------------------------------------


async def test_a_request_goes_to_a_host_that_has_its_model_and_the_least_loaded_one() -> None:
    async with FakeOllama(models=["small"]) as one, FakeOllama(models=["small", "big"]) as two:
        hosts = {"one": OllamaHost(one.url), "two": OllamaHost(two.url)}
        client = ModelClient(ModelSettings(hosts=hosts, connect_timeout=2))
        try:
            assert await chat(client, "big") == "ok"
            assert (len(one.requests), len(two.requests)) == (0, 1), "only two has big"
            one.script(Pause("one busy"), Text("from one"))
            two.script(Pause("two busy"), Text("from two"))
            first = asyncio.create_task(chat(client, "small"))
            second = asyncio.create_task(chat(client, "small"))
            await one.reached("one busy")  # one request each: the least loaded host takes it
            await two.reached("two busy")
            one.release("one busy")
            two.release("two busy")
            assert sorted(await asyncio.gather(first, second)) == ["from one", "from two"]
            assert sorted(await client.list_models()) == ["big", "small"]
        finally:
            await client.close()


async def test_a_host_that_fails_is_skipped_and_the_request_answered_by_another(
    caplog: pytest.LogCaptureFixture,
) -> None:
    down = f"http://127.0.0.1:{free_port()}"
    async with FakeOllama() as up:
        hosts = {"gone": OllamaHost(down), "up": OllamaHost(up.url)}
        client = ModelClient(ModelSettings(hosts=hosts, connect_timeout=2, retry_backoff=0.01))
        try:
            answers = [await chat(client) for _ in range(3)]
        finally:
            await client.close()
    assert answers == ["ok"] * 3 and len(up.requests) == 3
    skipped = [r.getMessage() for r in caplog.records if "Ollama host gone" in r.getMessage()]
    assert len(skipped) == 1 and "the others answer for 30 s" in skipped[0]
