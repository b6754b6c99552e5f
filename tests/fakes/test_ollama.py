"""The fake Ollama server, proven against the real ``ollama.AsyncClient``.

What the real client raises (ollama 0.6.3, httpx 0.28), as these tests pin down:
- unknown model, ``HttpError``: ``ollama.ResponseError`` with the HTTP status;
- ``ErrorLine`` mid-stream: ``ollama.ResponseError`` with status -1;
- ``Cut``: ``httpx.RemoteProtocolError`` ("incomplete chunked read"), not wrapped by ollama;
- ``Stall`` past the client's read timeout: ``httpx.ReadTimeout``, not wrapped either;
- server down: builtin ``ConnectionError`` for ``stream=False`` but a bare ``httpx.ConnectError``
  for ``stream=True``, because the client's streaming path does not translate it.

``AsyncClient.show`` exposes ``model_info`` as ``modelinfo``, where a client reads
``<architecture>.context_length``.

``AsyncClient.chat(tools=...)`` reads each tool into its typed ``Tool``, which keeps of a
property only ``type``, ``items``, ``description`` and ``enum``: a property's ``anyOf`` and an
object's ``properties`` never reach the server (why Kaiwa builds the body itself,
``core.agent.model.chat_body``).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from ollama import AsyncClient, ChatResponse, ResponseError

from .ollama import (
    BENCHMARK_REPLY,
    DEFAULT_CONTEXT_LENGTH,
    ChunkDelay,
    Cut,
    Done,
    ErrorLine,
    FakeOllama,
    HttpError,
    Pause,
    Prompt,
    Stall,
    Text,
    Thinking,
    ToolCall,
    prompt_tokens,
    read_tools,
)
from .patience import deadline

MODEL = "test-model"
HELLO = [{"role": "user", "content": "hello"}]
HELLO_TOKENS = 6  # ceil(5 / 3) for "hello", plus 4 for the message
LOOKUP_TOOL = {
    "type": "function",
    "function": {"name": "lookup", "description": "Look up.", "parameters": {}},
}
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def fake() -> AsyncIterator[FakeOllama]:
    async with FakeOllama() as server:
        yield server


@pytest.fixture
async def client(fake: FakeOllama) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(host=fake.url, timeout=5) as ollama_client:
        yield ollama_client


async def stream_chat(client: AsyncClient, **kwargs: Any) -> list[ChatResponse]:
    kwargs.setdefault("model", MODEL)
    async with asyncio.timeout(deadline()):
        stream = await client.chat(messages=HELLO, stream=True, **kwargs)
        return [chunk async for chunk in stream]


async def chat_whole(client: AsyncClient, **kwargs: Any) -> ChatResponse:
    kwargs.setdefault("model", MODEL)
    async with asyncio.timeout(deadline()):
        return await client.chat(messages=HELLO, stream=False, **kwargs)


def contents(chunks: list[ChatResponse]) -> list[str | None]:
    return [chunk.message.content for chunk in chunks if not chunk.done]


async def test_streams_text_in_chunks(fake: FakeOllama, client: AsyncClient) -> None:
    fake.script(Text("Hello world!", chunks=3))

    chunks = await stream_chat(client)

    assert contents(chunks) == ["Hell", "o wo", "rld!"]
    assert [chunk.done for chunk in chunks] == [False, False, False, True]
    for chunk in chunks:
        assert chunk.model == MODEL
        assert chunk.message.role == "assistant"
        assert chunk.created_at is not None
        assert datetime.fromisoformat(chunk.created_at).tzinfo is not None


async def test_uneven_split_keeps_every_character(fake: FakeOllama, client: AsyncClient) -> None:
    fake.script(Text("abcdefg", chunks=3))

    assert contents(await stream_chat(client)) == ["abc", "de", "fg"]


async def test_streams_thinking_before_content(fake: FakeOllama, client: AsyncClient) -> None:
    fake.script(Thinking("Let me think.", chunks=2), Text("Answer."))

    chunks = await stream_chat(client, think=True)

    assert [(c.message.thinking, c.message.content) for c in chunks[:3]] == [
        ("Let me ", ""),
        ("think.", ""),
        (None, "Answer."),
    ]


async def test_consecutive_tool_calls_share_one_chunk(
    fake: FakeOllama, client: AsyncClient
) -> None:
    fake.script(
        Text("Checking."),
        ToolCall("get_weather", {"city": "Paris", "days": 2}),
        ToolCall("get_time", {"zone": "CET"}),
    )

    chunks = await stream_chat(client)

    assert contents(chunks) == ["Checking.", ""]
    calls = chunks[1].message.tool_calls
    assert calls is not None
    assert [(call.function.name, call.function.arguments) for call in calls] == [
        ("get_weather", {"city": "Paris", "days": 2}),
        ("get_time", {"zone": "CET"}),
    ]
    assert isinstance(calls[0].function.arguments, dict)


async def test_done_chunk_carries_counts_and_durations(
    fake: FakeOllama, client: AsyncClient
) -> None:
    fake.script(Text("cut short"), Done(prompt_tokens=42, output_tokens=7, reason="length"))

    last = (await stream_chat(client))[-1]

    assert last.done is True
    assert last.done_reason == "length"
    assert (last.prompt_eval_count, last.eval_count) == (42, 7)
    assert last.message.content == ""
    durations = [
        last.total_duration,
        last.load_duration,
        last.prompt_eval_duration,
        last.eval_duration,
    ]
    assert all(isinstance(d, int) and d >= 0 for d in durations)
    assert last.total_duration == sum(durations[1:])


async def test_default_done_is_appended(fake: FakeOllama, client: AsyncClient) -> None:
    fake.script(Text("hi"))

    last = (await stream_chat(client))[-1]

    assert (last.done, last.done_reason, last.prompt_eval_count, last.eval_count) == (
        True,
        "stop",
        10,
        5,
    )


async def test_non_streaming_reply_is_one_whole_message(
    fake: FakeOllama, client: AsyncClient
) -> None:
    fake.script(
        Thinking("Hmm.", chunks=2),
        Pause("ignored when not streaming"),
        ChunkDelay(60),
        Text("Hello ", chunks=2),
        Text("there."),
        ToolCall("lookup", {"q": "kaiwa"}),
        Done(prompt_tokens=3, output_tokens=4, reason="length"),
    )

    reply = await chat_whole(client)

    assert reply.done is True
    assert reply.done_reason == "length"
    assert reply.message.content == "Hello there."
    assert reply.message.thinking == "Hmm."
    assert reply.message.tool_calls is not None
    assert reply.message.tool_calls[0].function.arguments == {"q": "kaiwa"}
    assert (reply.prompt_eval_count, reply.eval_count) == (3, 4)
    assert fake.requests[-1]["stream"] is False


async def test_scripts_are_consumed_fifo_then_default(
    fake: FakeOllama, client: AsyncClient
) -> None:
    fake.script(Text("first"))
    fake.script(Text("second"))

    replies = [(await chat_whole(client)).message.content for _ in range(3)]
    fake.default = [Text("fallback")]
    replies.append((await chat_whole(client)).message.content)

    assert replies == ["first", "second", "ok", "fallback"]


async def test_requests_are_recorded_in_order(fake: FakeOllama, client: AsyncClient) -> None:
    await stream_chat(client, tools=[LOOKUP_TOOL], options={"temperature": 0.1})
    await chat_whole(client)

    first, second = fake.requests
    assert first["model"] == MODEL
    assert first["messages"] == HELLO
    assert first["stream"] is True
    assert first["options"] == {"temperature": 0.1}
    assert first["tools"][0]["function"]["name"] == "lookup"
    assert second["stream"] is False


async def test_tags_lists_the_served_models(fake: FakeOllama, client: AsyncClient) -> None:
    fake.models.append("qwen3:4b")

    async with asyncio.timeout(deadline()):
        listed = await client.list()

    assert [model.model for model in listed.models] == [MODEL, "qwen3:4b"]
    qwen = listed.models[1]
    assert qwen.details is not None
    assert qwen.details.family == "qwen3"
    assert qwen.digest and qwen.size and qwen.modified_at
    assert fake.tags_requests == 1


async def test_unknown_model_is_404_and_keeps_the_script(
    fake: FakeOllama, client: AsyncClient
) -> None:
    fake.script(Text("still queued"))
    fake.models.append("late-model")

    with pytest.raises(ResponseError) as streamed:
        await stream_chat(client, model="nope")
    with pytest.raises(ResponseError) as whole:
        await chat_whole(client, model="nope")

    for raised in (streamed.value, whole.value):
        assert raised.status_code == 404
        assert raised.error == "model 'nope' not found"
    assert (await chat_whole(client, model="late-model")).message.content == "still queued"
    assert [request["model"] for request in fake.requests] == ["nope", "nope", "late-model"]


async def test_show_reports_each_models_context_length() -> None:
    async with (
        FakeOllama(models=[MODEL, "qwen3:4b"], context_lengths={"qwen3:4b": 8192}) as fake,
        AsyncClient(host=fake.url, timeout=5) as client,
        asyncio.timeout(deadline()),
    ):
        default = await client.show(MODEL)
        named = await client.show("qwen3:4b")

    assert default.modelinfo is not None and named.modelinfo is not None
    assert default.modelinfo["general.architecture"] == "qwen3"
    assert default.modelinfo["qwen3.context_length"] == DEFAULT_CONTEXT_LENGTH == 40960
    assert named.modelinfo["qwen3.context_length"] == 8192
    assert named.details is not None and named.details.family == "qwen3"
    assert named.capabilities == ["completion", "tools"]
    assert (named.template, named.parameters) == ("{{ .Prompt }}", "")
    assert named.modelfile and named.modified_at
    assert fake.show_requests == [MODEL, "qwen3:4b"]


async def test_show_unknown_model_is_404(fake: FakeOllama, client: AsyncClient) -> None:
    with pytest.raises(ResponseError) as raised:
        async with asyncio.timeout(deadline()):
            await client.show("nope")

    assert (raised.value.status_code, raised.value.error) == (404, "model 'nope' not found")
    assert fake.show_requests == ["nope"]


async def test_show_error_answers_every_show_until_cleared(
    fake: FakeOllama, client: AsyncClient
) -> None:
    fake.show_error = HttpError(500, "show broke")

    async with asyncio.timeout(deadline()):
        for _ in range(2):
            with pytest.raises(ResponseError) as raised:
                await client.show(MODEL)
            assert (raised.value.status_code, raised.value.error) == (500, "show broke")
        fake.show_error = None
        shown = await client.show(MODEL)

    assert shown.modelinfo is not None
    assert shown.modelinfo["qwen3.context_length"] == DEFAULT_CONTEXT_LENGTH
    assert fake.show_requests == [MODEL, MODEL, MODEL]


def test_prompt_tokens_counts_three_characters_a_token() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "You are Kaiwa."},  # 5 + 4
            {"role": "user", "content": "hello"},  # 2 + 4
            {
                "role": "assistant",
                "content": "",  # 0 + 4, and 16 for the call's 47 characters of sorted JSON
                "tool_calls": [{"function": {"name": "lookup", "arguments": {"q": "kaiwa"}}}],
            },
            {"role": "tool", "content": "found it"},  # 3 + 4
        ],
        "tools": [LOOKUP_TOOL],  # 99 characters of sorted JSON: 33
    }

    assert prompt_tokens(body) == 9 + 6 + 20 + 7 + 33
    assert prompt_tokens({"messages": []}) == 0


@pytest.mark.parametrize("stream", [True, False])
async def test_counted_prompts_replace_the_scripted_count(stream: bool) -> None:
    async with (
        FakeOllama(count_prompts=True) as fake,
        AsyncClient(host=fake.url, timeout=5) as client,
    ):
        fake.script(Text("hi"), Done(prompt_tokens=99, reason="length"))

        reply = (await stream_chat(client))[-1] if stream else await chat_whole(client)

    assert (reply.prompt_eval_count, reply.done_reason) == (HELLO_TOKENS, "length")


async def test_counted_prompts_include_tool_calls_and_tools() -> None:
    history = [
        *HELLO,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "lookup", "arguments": {"q": "kaiwa"}}}],
        },
        {"role": "tool", "content": "found it"},
    ]
    async with (
        FakeOllama(count_prompts=True) as fake,
        AsyncClient(host=fake.url, timeout=5) as client,
        asyncio.timeout(deadline()),
    ):
        reply = await client.chat(model=MODEL, messages=history, tools=[LOOKUP_TOOL])

    # 6 + 20 + 7 for the history; 39 for the tools, whose empty "parameters" the client sends
    # as {"type": "object"}; the client also drops the assistant's empty content.
    assert reply.prompt_eval_count == prompt_tokens(fake.requests[-1]) == 33 + 39
    assert fake.prompts == [Prompt(tokens=72, num_ctx=None)]


async def test_prompts_are_recorded_without_counting(fake: FakeOllama, client: AsyncClient) -> None:
    await stream_chat(client)
    reply = await chat_whole(client, options={"num_ctx": 4096})
    with pytest.raises(ResponseError):
        await chat_whole(client, model="nope")

    assert reply.prompt_eval_count == Done().prompt_tokens
    assert fake.prompts == [
        Prompt(tokens=HELLO_TOKENS, num_ctx=None),
        Prompt(tokens=HELLO_TOKENS, num_ctx=4096),
        Prompt(tokens=HELLO_TOKENS, num_ctx=None),
    ]
    assert len(fake.prompts) == len(fake.requests)


@pytest.mark.parametrize(
    ("num_ctx", "overflows"),
    [(None, False), (HELLO_TOKENS, False), (HELLO_TOKENS - 1, True)],
)
async def test_a_prompt_over_num_ctx_is_still_answered(
    fake: FakeOllama, client: AsyncClient, num_ctx: int | None, overflows: bool
) -> None:
    options = {} if num_ctx is None else {"num_ctx": num_ctx}

    reply = await chat_whole(client, options=options)

    assert reply.message.content == "ok"
    assert fake.prompts[-1].overflows is overflows


@pytest.mark.parametrize("stream", [True, False])
async def test_http_error_status_and_message(
    fake: FakeOllama, client: AsyncClient, stream: bool
) -> None:
    fake.script(HttpError(500, "model crashed"))

    with pytest.raises(ResponseError) as raised:
        await (stream_chat(client) if stream else chat_whole(client))

    assert (raised.value.status_code, raised.value.error) == (500, "model crashed")


async def test_error_line_mid_stream(fake: FakeOllama, client: AsyncClient) -> None:
    fake.script(Text("partial"), ErrorLine("out of memory"))
    received: list[str | None] = []

    with pytest.raises(ResponseError) as raised:
        async with asyncio.timeout(deadline()):
            async for chunk in await client.chat(model=MODEL, messages=HELLO, stream=True):
                received.append(chunk.message.content)

    assert received == ["partial"]
    assert (raised.value.status_code, raised.value.error) == (-1, "out of memory")


async def test_error_line_without_streaming_is_http_500(
    fake: FakeOllama, client: AsyncClient
) -> None:
    fake.script(ErrorLine("out of memory"))

    with pytest.raises(ResponseError) as raised:
        await chat_whole(client)

    assert (raised.value.status_code, raised.value.error) == (500, "out of memory")


async def test_cut_breaks_the_stream_after_what_was_sent(
    fake: FakeOllama, client: AsyncClient
) -> None:
    fake.script(Text("partial", chunks=2), Cut())
    received: list[str | None] = []

    with pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"):
        async with asyncio.timeout(deadline()):
            async for chunk in await client.chat(model=MODEL, messages=HELLO, stream=True):
                received.append(chunk.message.content)

    assert received == ["part", "ial"]


@pytest.mark.parametrize("stream", [True, False])
async def test_cut_before_any_chunk(fake: FakeOllama, client: AsyncClient, stream: bool) -> None:
    fake.script(Cut())

    with pytest.raises(httpx.RemoteProtocolError):
        await (stream_chat(client) if stream else chat_whole(client))


async def test_stall_before_headers_times_out_the_read(fake: FakeOllama) -> None:
    fake.script(Stall())

    async with AsyncClient(host=fake.url, timeout=0.5) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            await stream_chat(impatient)
        async with asyncio.timeout(deadline()):
            await fake.stalled()


async def test_stall_after_a_chunk_times_out_the_next_read(fake: FakeOllama) -> None:
    fake.script(Text("first"), Stall())
    received: list[str | None] = []

    async with AsyncClient(host=fake.url, timeout=0.5) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            async with asyncio.timeout(deadline()):
                async for chunk in await impatient.chat(model=MODEL, messages=HELLO, stream=True):
                    received.append(chunk.message.content)

    assert received == ["first"]


async def test_stall_without_streaming(fake: FakeOllama) -> None:
    fake.script(Stall())

    async with AsyncClient(host=fake.url, timeout=0.5) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            await chat_whole(impatient)


async def test_pause_holds_the_stream_until_released(fake: FakeOllama, client: AsyncClient) -> None:
    fake.script(Text("before"), Pause("gate"), Text("after"))
    reached = asyncio.create_task(fake.reached("gate"))  # awaited before the request exists

    async with asyncio.timeout(deadline()):
        stream = await client.chat(model=MODEL, messages=HELLO, stream=True)
        first = await anext(stream)
        await reached
        held = asyncio.create_task(anext(stream))
        done, _ = await asyncio.wait({held}, timeout=0.05)
        assert not done, "a chunk got past the pause before release()"
        fake.release("gate")
        rest = [await held] + [chunk async for chunk in stream]

    assert first.message.content == "before"
    assert contents(rest) == ["after"]
    assert rest[-1].done is True


async def test_close_cuts_held_requests(fake: FakeOllama, client: AsyncClient) -> None:
    fake.script(Text("before"), Pause("never released"))
    fake.script(Stall())

    async with asyncio.timeout(deadline()):
        stream = await client.chat(model=MODEL, messages=HELLO, stream=True)
        paused = asyncio.create_task(anext(stream))
        stalled = asyncio.create_task(stream_chat(client))
        await fake.reached("never released")
        await fake.stalled()
        await fake.close()
        await fake.close()  # idempotent
        assert (await paused).message.content == "before"
        with pytest.raises(httpx.RemoteProtocolError):
            await anext(stream)
        with pytest.raises(httpx.RemoteProtocolError):
            await stalled


async def test_chunk_delay_spaces_the_chunks(fake: FakeOllama, client: AsyncClient) -> None:
    fake.script(Text("no wait"), ChunkDelay(0.02), Text("slow", chunks=2))
    loop = asyncio.get_running_loop()

    started = loop.time()
    chunks = await stream_chat(client)
    elapsed = loop.time() - started

    assert contents(chunks) == ["no wait", "sl", "ow"]
    assert elapsed >= 0.05  # three delayed lines (two text, one done) of 0.02 s each


async def test_server_down_raises_connection_errors(fake: FakeOllama) -> None:
    url = fake.url
    await fake.close()

    async with AsyncClient(host=url, timeout=5) as orphan:
        with pytest.raises(ConnectionError):
            await chat_whole(orphan)
        with pytest.raises(httpx.ConnectError):
            await stream_chat(orphan)


@pytest.mark.parametrize(
    "steps",
    [
        (Text("a"), Done(), Text("b")),
        (Text("a"), HttpError(500, "late")),
        (Cut(), Stall()),
        (Text("a", chunks=0),),
    ],
)
def test_bad_scripts_are_refused(steps: tuple[Any, ...]) -> None:
    fake = FakeOllama()

    with pytest.raises(ValueError):
        fake.script(*steps)
    with pytest.raises(ValueError):
        fake.default = steps


async def test_command_line_server_for_benchmarks() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.fakes.ollama",
        "--port",
        "0",
        "--chunks",
        "5",
        "--delay-ms",
        "1",
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(deadline()):
            ready = (await process.stdout.readline()).decode().split()
        assert ready[0] == "READY"
        async with AsyncClient(host=ready[1], timeout=5) as benchmark_client:
            chunks = await stream_chat(benchmark_client)
    finally:
        process.terminate()
        async with asyncio.timeout(deadline()):
            await process.communicate()

    assert len(contents(chunks)) == 5
    assert "".join(c or "" for c in contents(chunks)) == BENCHMARK_REPLY


async def test_requests_without_tools_can_be_answered_apart(
    fake: FakeOllama, client: AsyncClient
) -> None:
    fake.script(Text("scripted"))
    fake.without_tools = [Text("a summary")]

    bare = await client.chat(model=MODEL, messages=HELLO)
    tooled = await client.chat(model=MODEL, messages=HELLO, tools=[LOOKUP_TOOL])

    assert (bare.message.content, tooled.message.content) == ("a summary", "scripted")


async def test_a_response_can_be_queued_for_requests_that_open_with_a_marker(
    fake: FakeOllama, client: AsyncClient
) -> None:
    fake.script(Text("in turn"))
    fake.script_for("apples", Text("for the apple task"))

    other = await client.chat(model=MODEL, messages=HELLO)
    marked = await client.chat(
        model=MODEL,
        messages=[{"role": "system", "content": "sub"}, {"role": "user", "content": "apples?"}],
    )

    assert (other.message.content, marked.message.content) == ("in turn", "for the apple task")


OPTIONAL_AND_NESTED = {
    "type": "function",
    "function": {
        "name": "file",
        "description": "File a ticket.",
        "parameters": {
            "type": "object",
            "properties": {
                "due": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
                "owner": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}},
                    "required": ["name"],
                },
                "ticket": {"$ref": "#/$defs/Ticket"},
            },
            "required": ["owner"],
            "$defs": {"Ticket": {"type": "object"}},
        },
    },
}


async def test_the_clients_typed_tools_drop_any_of_and_an_objects_properties(
    fake: FakeOllama, client: AsyncClient
) -> None:
    await stream_chat(client, tools=[OPTIONAL_AND_NESTED])

    properties = fake.requests[0]["tools"][0]["function"]["parameters"]["properties"]
    assert properties == {"due": {}, "owner": {"type": "object"}, "ticket": {}}


async def test_tools_are_read_as_ollama_reads_them_and_what_it_drops_is_recorded(
    fake: FakeOllama,
) -> None:
    async with httpx.AsyncClient(base_url=fake.url) as raw:
        body = {"model": MODEL, "messages": HELLO, "tools": [OPTIONAL_AND_NESTED]}
        answered = await raw.post("/api/chat", json=body)

    assert answered.status_code == 200
    where = "tools[0].function.parameters.properties"
    assert fake.dropped == [[f"{where}.due.default", f"{where}.ticket.$ref"]]
    kept, _ = read_tools([OPTIONAL_AND_NESTED])
    assert kept[0]["function"]["parameters"]["properties"]["owner"]["required"] == ["name"]
    assert kept[0]["function"]["parameters"]["$defs"] == {"Ticket": {"type": "object"}}


@pytest.mark.parametrize(
    "wrong",
    [{"type": 5}, {"type": "string", "required": True}, {"anyOf": {"type": "string"}}],
)
async def test_a_property_of_a_shape_ollama_cannot_read_is_http_400(
    fake: FakeOllama, wrong: dict[str, Any]
) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "read",
            "parameters": {"type": "object", "properties": {"path": wrong}},
        },
    }
    async with httpx.AsyncClient(base_url=fake.url) as raw:
        body = {"model": MODEL, "messages": HELLO, "tools": [tool]}
        answered = await raw.post("/api/chat", json=body)

    assert answered.status_code == 400
    assert answered.json()["error"].startswith("json: cannot unmarshal ")
    assert "tools[0].function.parameters.properties.path" in answered.json()["error"]
