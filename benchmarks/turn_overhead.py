"""Turn overhead: what one Kaiwa turn costs on top of the bare Ollama client doing the same stream.

Kaiwa side: message in (`Dispatcher.handle`) → reply stored (the reply's `finish`, which the turn
calls only after its records are written). Baseline: one shared `ollama.AsyncClient` streaming the
same request and consuming every chunk. Both talk to a fake Ollama in its own process.

Shape: the two sides alternate round by round (and swap which goes first every round), so drift
in this noisy machine's speed hits both equally; only the ratio and the difference mean anything.
Each Kaiwa round is the first message of a new conversation (a new place), so every round sends
the same two-message request as the baseline; that is also the costliest path through the store
(look up, create, load history). Two streams:
- 50 chunks over ~100 ms (`--chunks 50 --delay-ms 2`): the relative overhead (median ratio);
- the same 50 chunks with no delay: the absolute time added (difference of the medians).

The store is a SQLite file (`--db sqlite`, the default) or a throwaway schema on PostgreSQL
(`--db postgres`, the server at $KAIWA_BENCH_POSTGRES_URL), optionally a network hop away
(`--db-rtt-ms X`: a TCP proxy in its own process adds X ms per round trip). Each stream gets a
fresh, empty database. Beside each side's times, the event loop's lag: how late a 5 ms sleep of a
monitor task wakes, over that side's measured rounds (median, p99, max).

Targets (the header of the verdict table names those of the chosen database):
- SQLite: ≤ 1.02× on the 100 ms stream, ≤ 2 ms added on the zero-delay stream;
- PostgreSQL, rtt 0: ≤ 1.02× on the 100 ms stream, ≤ 3 ms added on the zero-delay stream;
- PostgreSQL, rtt 1 ms: ≤ 8 ms added on the zero-delay stream (issue 36: it was about +23 ms
  while every unit on the turn path was BEGIN, its statements and COMMIT; a turn now pays about
  one round trip per unit: the message recorded, its conversation read, the turn started, the
  reply's records and its ending).

Run from the repository root:
    .venv/bin/python benchmarks/turn_overhead.py [--rounds 100] [--warmup 5] [--profile]
                                                 [--db sqlite|postgres] [--db-rtt-ms 0]
or  .venv/bin/python -m benchmarks.turn_overhead
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import tempfile
import time
from dataclasses import dataclass

from benchmarks import _common as bench  # clears the proxy variables

CHUNKS = 50
SIDES = ("kaiwa", "bare")


@dataclass(frozen=True)
class Targets:
    ratio: float | None  # median Kaiwa / median bare, 100 ms stream
    added_ms: float | None  # median Kaiwa - median bare, zero-delay stream
    anchor: str = ""


TARGETS = {
    ("sqlite", 0.0): Targets(1.02, 2.0, "anchor: 1.05x and +5 ms"),
    ("postgres", 0.0): Targets(1.02, 3.0),
    ("postgres", 1.0): Targets(None, 8.0, "issue 36: about +23 ms before"),
}
NO_TARGETS = Targets(None, None)


@dataclass
class Side:
    times: list[float]  # seconds per measured round
    lag: dict[str, float]  # the event loop's lag over those rounds (`bench.lag_summary`)


async def measure(
    url: str, server: str | None, rounds: int, warmup: int, profile: bench.Profile
) -> dict[str, Side]:
    """Seconds per round for Kaiwa and for the bare client, interleaved, on a fresh database."""
    with (
        tempfile.TemporaryDirectory(prefix="kaiwa-bench-") as tmp,
        bench.fresh_database(server, Path(tmp)) as database_url,
    ):
        kaiwa = await bench.build_kaiwa(url, Path(tmp), 1, database_url=database_url)
        client = bench.bare_client(url, connections=1)
        counter = iter(range(1_000_000))
        lag = bench.LoopLag().start()
        times: dict[str, list[float]] = {side: [] for side in SIDES}
        windows: dict[str, list[tuple[float, float]]] = {side: [] for side in SIDES}

        async def kaiwa_round() -> None:
            reply = await kaiwa.send(f"bench:turn-{next(counter)}", "Hello there")
            await reply.finished.wait()
            if reply.outcome is not bench.Outcome.DONE:
                raise RuntimeError(f"turn ended {reply.outcome}: {reply.note}")

        async def bare_round() -> None:
            await bench.bare_turn(client, "Hello there")

        async def timed(side: str) -> None:
            """One measured round; only these are profiled (never the warm-ups)."""
            begun, started = lag.now(), time.perf_counter()
            if side == "kaiwa":
                with profile.running():
                    await kaiwa_round()
            else:
                await bare_round()
            times[side].append(time.perf_counter() - started)
            windows[side].append((begun, lag.now()))

        try:
            for _ in range(warmup):
                await kaiwa_round()
                await bare_round()
            for index in range(rounds):
                for side in reversed(SIDES) if index % 2 else SIDES:
                    await timed(side)
        finally:
            await lag.stop()
            await client.close()
            await kaiwa.close()
    return {
        side: Side(times[side], bench.lag_summary(lag.lateness(windows[side]))) for side in SIDES
    }


def report(slow: dict[str, Side], fast: dict[str, Side], label: str, targets: Targets) -> None:
    rows = []
    for stream, sides in (("50 chunks / 100 ms", slow), ("50 chunks / 0 ms", fast)):
        for side, name in (("kaiwa", "kaiwa"), ("bare", "bare client")):
            times = sides[side].times
            p50, p99 = bench.median(times), bench.percentile(times, 99)
            lag = bench.lag_cell(sides[side].lag)
            rows.append((stream, name, len(times), bench.ms(p50), bench.ms(p99), lag))
    bench.print_table(
        f"Per round, Kaiwa storing in {label}",
        ("stream", "side", "n", "median", "p99", "loop lag p50 / p99 / max (ms)"),
        rows,
    )

    kaiwa, bare = slow["kaiwa"].times, slow["bare"].times
    ratio = bench.median(kaiwa) / bench.median(bare)
    ratio_p99 = bench.percentile(kaiwa, 99) / bench.percentile(bare, 99)
    added = (bench.median(fast["kaiwa"].times) - bench.median(fast["bare"].times)) * 1000
    added_slow = (bench.median(kaiwa) - bench.median(bare)) * 1000
    rows = [
        ("median ratio, 100 ms stream", f"{ratio:.3f}x", *judged(ratio, targets.ratio, "{:g}x")),
        ("p99 ratio, 100 ms stream", f"{ratio_p99:.3f}x", "(info)", ""),
        ("median added, 100 ms stream", f"{added_slow:+.2f} ms", "(info)", ""),
        ("median added, 0 ms stream", f"{added:+.2f} ms",
         *judged(added, targets.added_ms, "{:g} ms")),
    ]  # fmt: skip
    bench.print_table(
        f"Kaiwa against the bare client on {label}; {describe(targets)}",
        ("figure", "value", "target", "verdict"),
        rows,
    )


def judged(value: float, target: float | None, shape: str) -> tuple[str, str]:
    """The target and verdict cells: `(info)` and none where this database has no target."""
    if target is None:
        return "(info)", ""
    return "<= " + shape.format(target), bench.verdict(value, target)


def describe(targets: Targets) -> str:
    """The targets that apply, for the table's header."""
    parts = []
    if targets.ratio is not None:
        parts.append(f"100 ms stream <= {targets.ratio:g}x")
    if targets.added_ms is not None:
        parts.append(f"0 ms stream <= +{targets.added_ms:g} ms")
    if not parts:
        return "no targets set for this database (figures for information)"
    anchor = f" ({targets.anchor})" if targets.anchor else ""
    return "targets: " + ", ".join(parts) + anchor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=100, help="measured rounds per side")
    parser.add_argument("--warmup", type=int, default=5, help="unmeasured rounds per side first")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="cProfile Kaiwa's measured zero-delay rounds, not the warm-ups (to stderr)",
    )
    bench.add_database_arguments(parser)
    args = parser.parse_args()
    bench.check_database_arguments(parser, args)
    label = bench.database_label(args.db, args.db_rtt_ms)
    targets = TARGETS.get((args.db, args.db_rtt_ms), NO_TARGETS)
    print(f"turn overhead: {args.rounds} rounds per side after {args.warmup} warm-ups, interleaved")
    print(f"store: {label}")
    with bench.database_server(args.db, args.db_rtt_ms) as server:
        with bench.fake_ollama(CHUNKS, 2) as slow_url:
            slow = asyncio.run(
                measure(slow_url, server, args.rounds, args.warmup, bench.Profile(False))
            )
        profile = bench.Profile(args.profile)  # the zero-delay stream: overhead is all there is
        with bench.fake_ollama(CHUNKS, 0) as fast_url:
            fast = asyncio.run(measure(fast_url, server, args.rounds, args.warmup, profile))
    report(slow, fast, label, targets)
    profile.report("measured turns on the zero-delay stream")


if __name__ == "__main__":
    main()
