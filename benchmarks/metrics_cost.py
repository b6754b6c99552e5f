"""Metrics cost: a plain message's turn with Kaiwa's Prometheus metrics on, and off, in one run.

The metrics (`core.metrics`) are moved whether or not `[metrics]` serves them, and the modules
that move them hold the metric objects themselves, so "off" here is prometheus-client's own
operations made no-ops for the rounds that are off (`metrics_off`): `labels` returns the metric
itself and `inc`, `dec`, `set` and `observe` do nothing. That is a turn path with no metrics at
all, the same code otherwise.

Shape (as `turn_overhead.py`): one Kaiwa on a SQLite file, against the fake Ollama's zero-delay
stream (the turn where overhead is all there is; a 100 ms stream would only dilute it). Rounds
alternate on and off, swapping which goes first every round, so the machine's drift hits both;
each round is the first message of a new conversation. Printed: the median and p99 of each side,
the median added by the metrics (target ≤ 1 % of the turn), and, since the machine's noise is
larger than the metrics' cost, the same operations timed alone (`PLAIN_TURN`'s µs, repeated
`--repeats` times), which is the precise figure. A scrape's own cost (`generate_latest`) is
printed too: it runs only when Prometheus asks, every 15 s by default, never inside a turn.

Run from the repository root:
    .venv/bin/python benchmarks/metrics_cost.py [--rounds 200] [--repeats 20000]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase

from benchmarks import _common as bench
from benchmarks.turn_overhead import CHUNKS
from core.metrics import (
    FIRST_POST_SECONDS,
    MODEL_REQUESTS_IN_FLIGHT,
    MODEL_TOKENS,
    TURN_SECONDS,
    TURNS,
)

TARGET = 0.01
SIDES = ("on", "off")
SWITCHED: list[tuple[type, str, Callable[..., Any]]] = [
    (MetricWrapperBase, "labels", lambda self, *args, **kwargs: self),
    (Counter, "inc", lambda self, *args, **kwargs: None),
    (Gauge, "inc", lambda self, *args, **kwargs: None),
    (Gauge, "dec", lambda self, *args, **kwargs: None),
    (Gauge, "set", lambda self, *args, **kwargs: None),
    (Histogram, "observe", lambda self, *args, **kwargs: None),
]


@contextmanager
def metrics_off() -> Iterator[None]:
    """prometheus-client's moving operations as no-ops for the block."""
    kept = [(owner, name, owner.__dict__[name]) for owner, name, _ in SWITCHED]
    for owner, name, nothing in SWITCHED:
        setattr(owner, name, nothing)
    try:
        yield
    finally:
        for owner, name, original in kept:
            setattr(owner, name, original)


async def measure(url: str, rounds: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per turn with the metrics on and off, interleaved, on one fresh SQLite file."""
    with tempfile.TemporaryDirectory(prefix="kaiwa-bench-") as tmp:
        kaiwa = await bench.build_kaiwa(url, Path(tmp), 1)
        counter = iter(range(1_000_000))
        times: dict[str, list[float]] = {side: [] for side in SIDES}

        async def turn() -> None:
            reply = await kaiwa.send(f"bench:turn-{next(counter)}", "Hello there")
            await reply.finished.wait()
            if reply.outcome is not bench.Outcome.DONE:
                raise RuntimeError(f"turn ended {reply.outcome}: {reply.note}")

        async def timed(side: str) -> None:
            started = time.perf_counter()
            if side == "off":
                with metrics_off():
                    await turn()
            else:
                await turn()
            times[side].append(time.perf_counter() - started)

        try:
            for _ in range(warmup):
                await turn()
            for index in range(rounds):
                for side in reversed(SIDES) if index % 2 else SIDES:
                    await timed(side)
        finally:
            await kaiwa.close()
    return times


def plain_turn() -> None:
    """The metric operations of one plain message's turn, as the turn path performs them."""
    MODEL_REQUESTS_IN_FLIGHT.inc()  # core.agent.slots: the model call holds a slot
    MODEL_REQUESTS_IN_FLIGHT.dec()
    MODEL_TOKENS.labels("bench-model", "in").inc(12)  # core.agent.model: its usage
    MODEL_TOKENS.labels("bench-model", "out").inc(50)
    TURNS.labels("bench", "done").inc()  # core.turns.endings.count_turn
    TURN_SECONDS.labels("bench").observe(0.012)
    FIRST_POST_SECONDS.labels("bench").observe(0.004)


def seconds_each(operation: Callable[[], object], repeats: int, batches: int = 7) -> float:
    """Median seconds of one `operation` over `batches` batches of `repeats`."""
    each = []
    for _ in range(batches):
        started = time.perf_counter()
        for _ in range(repeats):
            operation()
        each.append((time.perf_counter() - started) / repeats)
    return bench.median(each)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=200, help="measured turns per side")
    parser.add_argument("--repeats", type=int, default=20_000, help="metric turns per batch")
    args = parser.parse_args()
    with bench.fake_ollama(CHUNKS, 0) as url:
        times = asyncio.run(measure(url, args.rounds, 5))
    on, off = bench.median(times["on"]), bench.median(times["off"])
    added = (on - off) / off
    alone = seconds_each(plain_turn, args.repeats)
    scrape = seconds_each(generate_latest, 200)
    rows = [
        [side, bench.ms(bench.median(times[side])), bench.ms(bench.percentile(times[side], 99))]
        for side in SIDES
    ]
    bench.print_table(
        f"metrics cost: {args.rounds} plain turns per side (SQLite, zero-delay stream), "
        "on and off interleaved",
        ["metrics", "median", "p99"],
        rows,
    )
    print(
        f"  added by the metrics (median on vs off)   {(on - off) * 1e3:+8.3f} ms  "
        f"{added:+8.3%}   target <= {TARGET:.0%}  {bench.verdict(added, TARGET)}"
    )
    print(
        f"  the same operations timed alone           {alone * 1e6:8.2f} µs  "
        f"{alone / off:8.3%} of the turn off"
    )
    print(f"  one scrape of /metrics (not in a turn)    {scrape * 1e3:8.3f} ms")


if __name__ == "__main__":
    main()
