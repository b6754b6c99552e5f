"""Voice note overhead: what Kaiwa's transcription client adds to the server's own time for a
30-second voice note.

Kaiwa side: `Transcriber.transcribe` of a 30-second OGG Opus voice note (words spoken by
espeak-ng, padded with silence and encoded by ffmpeg as Telegram sends notes,
`tests.fakes.voice.spoken_note`): the caps checked, the note's length read from its own
container, the multipart upload, the answer read. Baseline: a bare `httpx.AsyncClient` posting
the same upload with the same fields and reading the same JSON, which is the server's own time
for the note plus the transport. Both talk to the fake speech-to-text server
(`python -m tests.fakes.transcription`) in its own process, which reads every upload whole (each
Ogg page's CRC, the Opus headers) and measures its length before it answers, so its time is
work on the file, not a stub's; a real server spends seconds more hearing it, which would only
shrink the ratio.

Shape: the two sides alternate round by round (and swap which goes first every round), so drift
in the machine's speed hits both alike; only the ratio and the difference mean anything.
Printed: each side's median and p99 over `--rounds` (50) after `--warmup` (5), the median ratio
and the median added. Target: ≤ 1.05× (information only, as every benchmark's).

Run from the repository root:
    .venv/bin/python benchmarks/voice_note.py [--rounds 50] [--warmup 5] [--seconds 30]
or  .venv/bin/python -m benchmarks.voice_note
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import time

import httpx

from benchmarks import _common as bench  # clears the proxy variables
from core.features.attachments.transcription import (
    TRANSCRIPTIONS_PATH,
    Transcriber,
    TranscriptionSettings,
)
from tests.fakes.transcription import DEFAULT_MODEL
from tests.fakes.voice import spoken_note

WORDS = "This is a voice note for the benchmark. Please water the plants on Friday."
TARGET_RATIO = 1.05
SIDES = ("kaiwa", "bare")


async def measure(url: str, note: bytes, rounds: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per round for each side, interleaved."""
    transcriber = Transcriber(TranscriptionSettings(url=url, model=DEFAULT_MODEL), {})
    client = httpx.AsyncClient(trust_env=False, timeout=60)
    form = {"model": DEFAULT_MODEL, "response_format": "verbose_json"}

    async def kaiwa_round() -> None:
        transcript = await transcriber.transcribe("voice.ogg", note, "audio/ogg")
        if not transcript.text:
            raise RuntimeError("the transcript came back empty")

    async def bare_round() -> None:
        response = await client.post(
            url + TRANSCRIPTIONS_PATH, data=form, files={"file": ("voice.ogg", note, "audio/ogg")}
        )
        response.raise_for_status()
        if not response.json()["text"]:
            raise RuntimeError("the transcript came back empty")

    rounds_of = {"kaiwa": kaiwa_round, "bare": bare_round}
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    try:
        for _ in range(warmup):
            await kaiwa_round()
            await bare_round()
        for index in range(rounds):
            for side in reversed(SIDES) if index % 2 else SIDES:
                started = time.perf_counter()
                await rounds_of[side]()
                times[side].append(time.perf_counter() - started)
    finally:
        await client.aclose()
        await transcriber.aclose()
    return times


def report(times: dict[str, list[float]], seconds: float, size: int) -> None:
    rows = [
        (
            name,
            len(times[side]),
            bench.ms(bench.median(times[side])),
            bench.ms(bench.percentile(times[side], 99)),
        )
        for side, name in (("kaiwa", "Transcriber.transcribe"), ("bare", "bare httpx POST"))
    ]
    bench.print_table(
        f"Per round, a {seconds:g}-second voice note ({size:,} bytes of OGG Opus)",
        ("side", "n", "median", "p99"),
        rows,
    )
    kaiwa, bare = bench.median(times["kaiwa"]), bench.median(times["bare"])
    ratio, target = kaiwa / bare, f"<= {TARGET_RATIO:g}x"
    rows = [
        ("median ratio", f"{ratio:.3f}x", target, bench.verdict(ratio, TARGET_RATIO)),
        ("median added", f"{(kaiwa - bare) * 1000:+.2f} ms", "(info)", ""),
    ]
    bench.print_table(
        f"Kaiwa's client against the server's own time plus transport; target <= {TARGET_RATIO:g}x",
        ("figure", "value", "target", "verdict"),
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=50, help="measured rounds per side")
    parser.add_argument("--warmup", type=int, default=5, help="unmeasured rounds per side first")
    parser.add_argument("--seconds", type=float, default=30.0, help="the voice note's length")
    args = parser.parse_args()
    note = spoken_note(WORDS, seconds=args.seconds)
    print(f"voice note: {args.rounds} rounds per side after {args.warmup} warm-ups, interleaved")
    with bench.ready_process(["tests.fakes.transcription", "--port", "0"]) as url:
        times = asyncio.run(measure(url, note, args.rounds, args.warmup))
    report(times, args.seconds, len(note))


if __name__ == "__main__":
    main()
