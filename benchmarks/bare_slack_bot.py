"""The bare bot `reply_alone.py` measures Kaiwa against on Slack: slack_sdk's Socket Mode client
and Web API client and the ollama client, nothing else.

For each direct message: the model's stream (one `ollama.AsyncClient`, at most `--slots`
requests at once) into the reply `benchmarks/_bare.py` streams: posted in the DM with its first
text and a Stop button (`chat.postMessage`), edited as it grows no more than once per
`--edit-interval`, the final text without the button (`chat.update`) the moment the stream
ends. Each envelope is acknowledged before its reply starts, as Slack asks.

    python -m benchmarks.bare_slack_bot --bot-token T --app-token A --api-url URL --ollama URL
                                        [--edit-interval 1.0] [--slots 1]

prints `READY` once its socket is open; it runs until killed.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
from typing import Any

from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from benchmarks import _common as bench  # clears the proxy variables
from benchmarks._bare import BareReply, stream_into

BUTTON = {"type": "button", "text": {"type": "plain_text", "text": "Stop"}, "action_id": "stop"}
STOP = [{"type": "actions", "elements": [BUTTON]}]


async def run(args: argparse.Namespace) -> None:
    web = AsyncWebClient(token=args.bot_token, base_url=args.api_url)
    client = bench.bare_client(args.ollama, connections=32)
    model_slots = asyncio.Semaphore(args.slots)
    socket = SocketModeClient(app_token=args.app_token, web_client=web)
    replies: set[asyncio.Task[None]] = set()

    async def answer(channel: str, text: str) -> None:
        async def post(text: str, live: bool) -> str:
            answer = await web.chat_postMessage(
                channel=channel, text=text, blocks=_blocks(text, live)
            )
            return str(answer["ts"])

        async def edit(ts: str, text: str, live: bool) -> None:
            await web.chat_update(channel=channel, ts=ts, text=text, blocks=_blocks(text, live))

        await stream_into(client, model_slots, text, BareReply(post, edit, args.edit_interval))

    async def heard(client: SocketModeClient, request: SocketModeRequest) -> None:
        await client.send_socket_mode_response(SocketModeResponse(request.envelope_id))
        event = request.payload.get("event", {})
        from_a_person = not event.get("bot_id") and not event.get("subtype")
        if request.type == "events_api" and event.get("type") == "message" and from_a_person:
            task = asyncio.create_task(answer(event["channel"], event.get("text", "")))
            replies.add(task)
            task.add_done_callback(replies.discard)

    socket.socket_mode_request_listeners.append(heard)  # type: ignore[arg-type]
    await socket.connect()
    print("READY socket", flush=True)
    await asyncio.Event().wait()


def _blocks(text: str, live: bool) -> list[dict[str, Any]]:
    section = {"type": "section", "text": {"type": "mrkdwn", "text": text}}
    return [section, *(STOP if live else [])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bot-token", required=True)
    parser.add_argument("--app-token", required=True)
    parser.add_argument("--api-url", required=True, help="the (fake) Web API, ending in /")
    parser.add_argument("--ollama", required=True, help="the (fake) Ollama's URL")
    parser.add_argument("--edit-interval", type=float, default=1.0)
    parser.add_argument("--slots", type=int, default=1, help="model requests at once")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
