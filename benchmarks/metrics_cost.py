"""Metrics cost: what moving Kaiwa's Prometheus metrics adds to a plain message's turn.

The metrics (`core.metrics`) are moved whether or not `[metrics]` serves them, so there is no
switch to compare a turn with and without them. Instead this measures both halves in one run:
- a plain turn, message in → reply stored, against the fake Ollama's zero-delay stream (the
  turn where overhead is all there is; `benchmarks/turn_overhead.py`'s Kaiwa side);
- the metric operations that turn performs (`PLAIN_TURN`: the turn counted and timed, its
  first post timed, its tokens counted, its model slot held), repeated `--repeats` times.
The verdict is their ratio (target ≤ 1 %), with the median of each.

Run from the repository root:
    .venv/bin/python benchmarks/metrics_cost.py [--rounds 60] [--repeats 20000]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import statistics
import time

from benchmarks import _common as bench
from benchmarks.turn_overhead import CHUNKS, measure
from core.metrics import (
    FIRST_POST_SECONDS,
    MODEL_REQUESTS_IN_FLIGHT,
    MODEL_TOKENS,
    TURN_SECONDS,
    TURNS,
)

TARGET = 0.01


def plain_turn() -> None:
    """The metric operations of one plain message's turn, as the turn path performs them."""
    MODEL_REQUESTS_IN_FLIGHT.inc()  # core.agent.slots: the model call holds a slot
    MODEL_REQUESTS_IN_FLIGHT.dec()
    MODEL_TOKENS.labels("bench-model", "in").inc(12)  # core.agent.model: its usage
    MODEL_TOKENS.labels("bench-model", "out").inc(50)
    TURNS.labels("bench", "done").inc()  # core.turns.endings.count_turn
    TURN_SECONDS.labels("bench").observe(0.012)
    FIRST_POST_SECONDS.labels("bench").observe(0.004)


def metric_seconds(repeats: int, samples: int = 7) -> float:
    """Median seconds of `plain_turn` over `samples` batches of `repeats`."""
    batches = []
    for _ in range(samples):
        started = time.perf_counter()
        for _ in range(repeats):
            plain_turn()
        batches.append((time.perf_counter() - started) / repeats)
    return statistics.median(batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=60, help="measured turns")
    parser.add_argument("--repeats", type=int, default=20_000, help="metric turns per batch")
    args = parser.parse_args()
    with bench.fake_ollama(CHUNKS, 0) as url:
        sides = asyncio.run(measure(url, None, args.rounds, 5, bench.Profile(False)))
    turn = statistics.median(sides["kaiwa"].times)
    metrics = metric_seconds(args.repeats)
    share = metrics / turn
    verdict = "ok" if share <= TARGET else "MISS"
    print(f"metrics cost: {args.rounds} plain turns (SQLite, zero-delay stream), same run")
    print(f"  median turn                         {turn * 1000:8.2f} ms")
    print(f"  a turn's metric operations          {metrics * 1e6:8.2f} µs")
    print(f"  share of the turn                   {share:8.3%}   target <= {TARGET:.0%}  {verdict}")


if __name__ == "__main__":
    main()
