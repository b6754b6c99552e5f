"""Stop latency: from `/stop` received to the stopped reply's partial text stored.

Each round sends a message in a new place, waits until the reply shows some text, waits a random
0-300 ms more (so stops land at different points of the stream), then times
`await dispatcher.handle(<the /stop message>)`. The clock starts just before that call and stops
when the stopped turn calls its reply's `finish` with outcome STOPPED: the turn writes its records
(the partial assistant text, the turn status "stopped") before it calls `finish`, so that instant
is "partial text stored". After each round, outside the clock, the benchmark checks the store: the
turn's status is "stopped" and the stored assistant text equals the text the reply finished with
(and the last frame shown is a prefix of it).

The fake streams 2,000 chunks (~10 s at 5 ms apart), so a stop always lands mid-stream. The reply
is 175 characters, so the first 175 chunks carry one character each and the rest are empty: text
grows for the first ~0.9 s, which is where the random stop delay puts the stops.

Three conditions, each with a fresh store and its own fake:
- idle: only the measured conversation (model cap 1), chunks 5 ms apart;
- loaded, 100 x 200 chunks/s: 100 other conversations stream from the same fake throughout (each
  sends a new message as soon as its previous reply ends; model cap 101). 20,000 chunks/s is more
  than one Python event loop can parse through ollama/httpx one chunk per read (the bare client
  manages ~10,000/s here), so this measures a saturated loop;
- loaded, 100 x 50 chunks/s: the same with chunks 20 ms apart, a load the loop keeps up with.
The timer lag of the event loop (how late a 10 ms sleep wakes) is printed beside each condition
as context. Targets: p99 ≤ 5 ms idle, ≤ 50 ms loaded (anchor: 3.6 ms idle, but it stored none of
the partial text).

Run from the repository root:
    .venv/bin/python benchmarks/stop_latency.py [--rounds 100] [--load 100]
or  .venv/bin/python -m benchmarks.stop_latency
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import random
import tempfile
import time
from dataclasses import dataclass

from benchmarks import _common as bench  # clears the proxy variables

CHUNKS, DELAY_MS = 2000, 5
SLOWER_DELAY_MS = 20  # 100 streams x 50 chunks/s: within what one client event loop can parse
TARGET_IDLE_MS, TARGET_LOADED_MS = 5.0, 50.0
STOP_DELAY_MAX = 0.3
WAIT = 30.0
LAG_PERIOD = 0.01


@dataclass
class Round:
    latency: float  # seconds from /stop received to the stopped reply's finish
    problem: str  # what the store check found; "" when all is right


async def stop_round(kaiwa: bench.Kaiwa, place: str, rng: random.Random) -> Round:
    reply = await kaiwa.send(place, "Tell me a long story")
    async with asyncio.timeout(WAIT):
        await reply.has_text.wait()
    await asyncio.sleep(rng.uniform(0, STOP_DELAY_MAX))
    stop = kaiwa.message(place, "/stop")
    started = time.perf_counter()
    await kaiwa.dispatcher.handle(stop)  # returns once the stopped turn's task is done
    if not reply.finished.is_set() or reply.outcome is not bench.Outcome.STOPPED:
        return Round(float("nan"), f"reply ended {reply.outcome} ({reply.note})")
    return Round(reply.finished_at - started, await check_store(kaiwa, place, reply))


async def check_store(kaiwa: bench.Kaiwa, place: str, reply: bench.BenchReply) -> str:
    conversation = await kaiwa.store.active_conversation(place)
    if conversation is None:
        return "no conversation stored"
    turn = (await kaiwa.store.turns(conversation.id))[-1]
    rows = await kaiwa.store.history(conversation.id)
    stored = "\n\n".join(r.text for r in rows if r.turn_id == turn.id and r.role == "assistant")
    if turn.status != "stopped":
        return f"turn status {turn.status!r}"
    if stored != reply.text:
        return f"stored {stored!r} but the reply finished with {reply.text!r}"
    if not stored.startswith(reply.shown):
        return f"the last frame {reply.shown!r} is not a prefix of the stored {stored!r}"
    if not stored:
        return "nothing stored (the stop landed before any text)"
    return ""


async def keep_streaming(
    kaiwa: bench.Kaiwa, place: str, showing: asyncio.Event, stopping: asyncio.Event
) -> None:
    """A background conversation: a new message as soon as the previous reply ends."""
    while not stopping.is_set():
        reply = await kaiwa.send(place, "Keep talking")
        await reply.has_text.wait()
        showing.set()
        await reply.finished.wait()


async def measure(url: str, rounds: int, load: int, seed: int) -> tuple[list[Round], list[float]]:
    """The measured stops, and the event loop's timer lag sampled while they ran."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="kaiwa-bench-") as tmp:
        kaiwa = await bench.build_kaiwa(url, Path(tmp), max_concurrent=load + 1)
        stopping = asyncio.Event()
        showing = [asyncio.Event() for _ in range(load)]
        background = [
            asyncio.create_task(keep_streaming(kaiwa, f"bench:load-{i}", showing[i], stopping))
            for i in range(load)
        ]
        try:
            async with asyncio.timeout(WAIT):  # every background reply is streaming
                await asyncio.gather(*(event.wait() for event in showing))
            await stop_round(kaiwa, "bench:warm-up", rng)
            lag = bench.LoopLag(LAG_PERIOD).start()  # how busy the loop is: context
            results = [await stop_round(kaiwa, f"bench:stop-{i}", rng) for i in range(rounds)]
            await lag.stop()
            return results, lag.lateness()
        finally:
            stopping.set()
            await kaiwa.close()  # stops every background turn
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=100, help="measured stops per condition")
    parser.add_argument("--load", type=int, default=100, help="background conversations")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random stop delays")
    args = parser.parse_args()
    print(
        f"stop latency: {args.rounds} stops per condition, each 0-{STOP_DELAY_MAX * 1000:.0f} ms "
        f"after the first text; streams of {CHUNKS} chunks"
    )
    conditions = [
        ("idle", 0, DELAY_MS, TARGET_IDLE_MS),
        (f"loaded, {args.load} x 200 chunks/s", args.load, DELAY_MS, TARGET_LOADED_MS),
        (f"loaded, {args.load} x 50 chunks/s", args.load, SLOWER_DELAY_MS, TARGET_LOADED_MS),
    ]
    rows, verdicts = [], []
    for label, load, delay_ms, target in conditions:
        with bench.fake_ollama(CHUNKS, delay_ms) as url:
            results, lags = asyncio.run(measure(url, args.rounds, load, args.seed))
        latencies = [r.latency for r in results]
        p50, p99 = bench.median(latencies), bench.percentile(latencies, 99)
        checked = f"{sum(not r.problem for r in results)}/{len(results)} ok"
        lag = f"{bench.ms(bench.median(lags))} / {bench.ms(bench.percentile(lags, 99))}"
        rows.append((label, len(results), bench.ms(p50), bench.ms(p99),
                     bench.ms(max(latencies)), checked, lag))  # fmt: skip
        verdicts.append((f"p99, {label}", bench.ms(p99), f"<= {target:g} ms",
                         bench.verdict(p99 * 1000, target)))  # fmt: skip
        for index, result in enumerate(results):
            if result.problem:
                print(f"  store check failed: {label}, round {index}: {result.problem}")
    bench.print_table(
        "/stop received -> stopped reply's records stored (its finish with STOPPED)",
        ("condition", "n", "p50", "p99", "max", "store check", "loop lag p50 / p99"),
        rows,
    )
    bench.print_table(
        "Targets (anchor: 3.6 ms idle, storing none of the partial text)",
        ("figure", "value", "target", "verdict"),
        verdicts,
    )


if __name__ == "__main__":
    main()
