"""A 30-second voice note answered by a real `kaiwa run`: its time beside the transcription
server's own, and Kaiwa's overhead.

Everything is as shipped but the addresses: `kaiwa run` in its own process with the defaults
(`[channels.telegram]` with its `edit_interval`, `[transcription]` with only its `url`, SQLite
in a temporary folder), polling the fake Bot API (`tests.fakes.telegram.FakeTelegram`, in this
process), the fake Ollama (in this process too, 20 chunks 5 ms apart, which notes when each
request arrives) and the fake speech-to-text server (`python -m tests.fakes.transcription`,
which reads every upload whole: each Ogg page's CRC and the Opus headers). The note is 30
seconds of OGG Opus as Telegram sends voice notes (`tests.fakes.voice.spoken_note`: espeak-ng,
padded, ffmpeg).

Sides, alternating round by round (a new chat each time), each from the update queued on the
fake Telegram to the model's request arriving (what the note costs before the model is asked)
and to the whole answer shown (the first call that shows it: what a person waits for, which
includes the Telegram channel's `edit_interval`, 1 s after the reply's first post, and so hides
the note's cost if it is smaller):
- `voice note`: the note, downloaded through `getFile`, screened, transcribed, reworded,
  answered, with the quote of what was heard above the answer;
- `typed`: the words the server hears in the note, typed: the same turn without the note;
- `server alone`: a bare `httpx` upload of the note to the fake server and its answer: the
  server's own time, as Kaiwa's client pays it plus nothing.
Kaiwa's overhead for a voice note is `voice note` less `typed` less `server alone` (the
download from Telegram, the screening, the upload's own framing, the rewording and the quote);
the ratio `voice note / (typed + server alone)` should be close to 1.

Run from the repository root:
    .venv/bin/python benchmarks/voice_note_reply.py [--rounds 15] [--seconds 30]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import itertools
import os
import subprocess
import tempfile
import time
from collections.abc import Callable

import httpx

from benchmarks import _common as bench  # clears the proxy variables
from core.features.attachments.transcription import TRANSCRIPTIONS_PATH
from tests.fakes.ollama import BENCHMARK_REPLY, ChunkDelay, FakeOllama, Text
from tests.fakes.telegram import BOT_TOKEN, FakeTelegram
from tests.fakes.transcription import DEFAULT_MODEL
from tests.fakes.voice import spoken_note

WORDS = "This is a voice note for the benchmark. Please water the plants on Friday."
CHUNKS, DELAY_MS = 20, 5
WAIT = 60.0
SIDES = ("voice note", "typed", "server alone")
_CHATS = itertools.count(7001)


def config_text(data_dir: Path, ollama: str, speech: str, telegram: FakeTelegram) -> str:
    return (
        f'[ollama]\nurl = "{ollama}"\n\n[agents.assistant]\nmodel = "test-model"\n\n'
        f'[storage]\ndata_dir = "{data_dir}"\n\n[channels.terminal]\nenabled = false\n\n'
        f'[transcription]\nurl = "{speech}"\n\n'
        f'[channels.telegram]\nbase_url = "{telegram.base_url}"\n'
        f'base_file_url = "{telegram.base_file_url}"\nanyone = true\n'
    )


async def answered(
    telegram: FakeTelegram, ollama: FakeOllama, send: Callable[[int], None]
) -> tuple[float, float]:
    """Seconds from the update queued to the model's request arriving, and to the first call
    that shows the whole answer."""
    chat = next(_CHATS)
    whole = BENCHMARK_REPLY.strip()
    asked = len(ollama.arrivals)
    queued = time.time()
    send(chat)

    def shown_at(words: str) -> float | None:
        for call in telegram.calls:
            if int(call.params.get("chat_id", 0) or 0) != chat:
                continue
            if words in str(call.params.get("text", "")):
                return call.at
        return None

    await telegram.wait_until(lambda: shown_at(whole) is not None, WAIT, what=f"{chat}'s answer")
    ends = shown_at(whole)
    assert ends is not None and len(ollama.arrivals) == asked + 1
    return ollama.arrivals[asked] - queued, ends - queued


async def server_alone(client: httpx.AsyncClient, url: str, note: bytes) -> tuple[float, float]:
    started = time.perf_counter()
    response = await client.post(
        url.rstrip("/") + TRANSCRIPTIONS_PATH,
        files={"file": ("voice note.ogg", note, "audio/ogg")},
        data={"model": DEFAULT_MODEL, "response_format": "verbose_json"},
    )
    response.raise_for_status()
    response.json()
    took = time.perf_counter() - started
    return took, took


async def measure(
    ollama: str, speech: str, note: bytes, seconds: int, rounds: int
) -> dict[str, list[float]]:
    times: dict[str, list[tuple[float, float]]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="kaiwa-bench-") as folder:
        async with (
            FakeTelegram() as telegram,
            FakeOllama() as ollama,
            httpx.AsyncClient(trust_env=False) as client,
        ):
            ollama.default = [ChunkDelay(DELAY_MS / 1000), Text(BENCHMARK_REPLY, CHUNKS)]
            state = Path(folder) / "state"
            config = Path(folder) / "kaiwa.toml"
            config.write_text(config_text(state, ollama.url, speech, telegram))
            environment = {**os.environ, "KAIWA_TELEGRAM_TOKEN": BOT_TOKEN, "KAIWA_CONFIG": ""}
            kaiwa = await asyncio.create_subprocess_exec(
                *(sys.executable, "-m", "bot", "run", "--config", str(config)),
                cwd=bench.ROOT,
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                await telegram.wait_until(
                    lambda: telegram.calls_to("getUpdates"), WAIT, what="kaiwa's first poll"
                )
                sides = {
                    "voice note": lambda: answered(
                        telegram,
                        ollama,
                        lambda chat: telegram.user_file(chat, note, kind="voice", seconds=seconds),
                    ),
                    "typed": lambda: answered(
                        telegram, ollama, lambda chat: telegram.user_message(chat, WORDS)
                    ),
                    "server alone": lambda: server_alone(client, speech, note),
                }
                for side in SIDES:  # one warm-up each
                    await sides[side]()
                order = list(SIDES)
                for index in range(rounds):
                    for side in reversed(order) if index % 2 else order:
                        times[side].append(await sides[side]())
            finally:
                kaiwa.terminate()
                await asyncio.wait_for(kaiwa.wait(), 30)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=15, help="measured rounds per side")
    parser.add_argument("--seconds", type=int, default=30, help="the voice note's length")
    args = parser.parse_args()
    note = spoken_note(WORDS, seconds=args.seconds)
    with (
        bench.fake_ollama(CHUNKS, DELAY_MS) as ollama,
        bench.ready_process(
            ["tests.fakes.transcription", "--port", "0", "--text", WORDS]
        ) as speech,
    ):
        times = asyncio.run(measure(ollama, speech, note, args.seconds, args.rounds))
    begins = {side: [each[0] for each in times[side]] for side in SIDES}
    ends = {side: [each[1] for each in times[side]] for side in SIDES}
    rows = [
        [
            side,
            bench.ms(bench.median(begins[side])),
            bench.ms(bench.median(ends[side])),
            bench.ms(bench.percentile(ends[side], 99)),
        ]
        for side in SIDES
    ]
    bench.print_table(
        f"a {args.seconds}-second voice note through `kaiwa run` on the fake Telegram, "
        f"{args.rounds} rounds per side, alternating (after one warm-up)",
        ["side", "model asked, median", "whole answer, median", "whole answer, p99"],
        rows,
    )
    for label, figures in (("model asked", begins), ("whole answer", ends)):
        median = {side: bench.median(values) for side, values in figures.items()}
        floor = median["typed"] + median["server alone"]
        print(
            f"  {label:12}: Kaiwa's overhead (voice - typed - server) "
            f"{(median['voice note'] - floor) * 1e3:+8.1f} ms, "
            f"voice / (typed + server) {median['voice note'] / floor:.3f}x   (info)"
        )


if __name__ == "__main__":
    main()
