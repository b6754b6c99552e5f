"""Long conversations: a turn late in a conversation costs what an early one costs.

History building and storing must not grow with a conversation's age. One conversation runs
`--turns` turns in a row (each a ~300-character message, answered by the fake Ollama's stream);
every turn is timed from message in to reply stored. Compaction (`core.agent.context`) keeps what is
sent inside the window, so a late turn sends about as much as an early one; the turns that
compact also wait for a summary call, and are shown apart.

The baseline is the same conversation's early turns, measured in the same run: the median of
turns 1-10 ("turn 5") against the median of the last ten ("turn 500" for 500 turns), over
`--conversations` conversations, each on a fresh database. Target: turn 500 ≤ 1.2× turn 5. The
bare client's time for one request of an early turn's size is printed for scale.

Run from the repository root:
    .venv/bin/python benchmarks/long_conversation.py [--turns 500] [--conversations 3]
                                                     [--window 4096] [--db sqlite|postgres]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import tempfile
import time
from dataclasses import dataclass, field

from benchmarks import _common as bench  # clears the proxy variables

CHUNKS = 20
EDGE = 10
"""Turns in each of the two windows compared."""
TARGET = 1.2
PLACE = "bench:long"
MESSAGE = "Here is what happened today at the workshop, with names, times and numbers: {n}. " * 4


@dataclass
class Run:
    """One conversation: each turn's seconds, and whether it compacted."""

    seconds: list[float] = field(default_factory=list)
    compacted: list[bool] = field(default_factory=list)
    compactions: int = 0
    database_bytes: int = 0


async def converse(url: str, database_url: str, data_dir: Path, turns: int, window: int) -> Run:
    run = Run()
    kaiwa = await bench.build_kaiwa(
        url, data_dir, 1, database_url=database_url, context_window=window
    )
    try:
        warm_up = await kaiwa.send("bench:warm-up", "Hello")  # connections, the model's window
        await warm_up.finished.wait()
        for number in range(turns):
            started = time.perf_counter()
            reply = await kaiwa.send(PLACE, MESSAGE.format(n=number))
            await reply.finished.wait()
            run.seconds.append(time.perf_counter() - started)
            if reply.outcome is not bench.Outcome.DONE:
                raise RuntimeError(f"turn {number + 1} ended {reply.outcome}: {reply.note}")
            report = await kaiwa.runner.context_report(PLACE)
            assert report is not None
            run.compacted.append(report.compactions > run.compactions)
            run.compactions = report.compactions
    finally:
        await kaiwa.close()
    return run


def measured(url: str, server: str | None, turns: int, window: int) -> Run:
    """One conversation on a fresh database, and the size the database grew to."""
    with (
        tempfile.TemporaryDirectory(prefix="kaiwa-bench-") as tmp,
        bench.fresh_database(server, Path(tmp)) as database_url,
    ):
        run = asyncio.run(converse(url, database_url, Path(tmp), turns, window))
        run.database_bytes = sum(f.stat().st_size for f in Path(tmp).glob("bench.db*"))
    return run


async def bare_seconds(url: str, rounds: int) -> list[float]:
    client = bench.bare_client(url, connections=1)
    times = []
    try:
        for number in range(rounds):
            started = time.perf_counter()
            await bench.bare_turn(client, MESSAGE.format(n=number))
            times.append(time.perf_counter() - started)
    finally:
        await client.close()
    return times


def row(name: str, seconds: list[float]) -> tuple[str, int, str, str]:
    if not seconds:
        return (name, 0, "-", "-")
    p50, p99 = bench.median(seconds), bench.percentile(seconds, 99)
    return (name, len(seconds), bench.ms(p50), bench.ms(p99))


def report(runs: list[Run], bare: list[float], turns: int, window: int, label: str) -> None:
    def turns_where(pick: slice, compacted: bool | None = None) -> list[float]:
        return [
            seconds
            for run in runs
            for seconds, did in zip(run.seconds[pick], run.compacted[pick], strict=True)
            if compacted is None or did == compacted
        ]

    early, late = turns_where(slice(None, EDGE)), turns_where(slice(-EDGE, None))
    bench.print_table(
        f"Per turn, one conversation of {turns} turns, window {window:,} tokens, {label}",
        ("turns", "n", "median", "p99"),
        [
            row(f"turns 1-{EDGE} (turn 5)", early),
            row(f"turns {turns - EDGE + 1}-{turns} (turn {turns})", late),
            row("  the same, without compacting turns", turns_where(slice(-EDGE, None), False)),
            row("turns that compacted", turns_where(slice(None), True)),
            row("every turn", turns_where(slice(None))),
            row("bare client, one early-sized request", bare),
        ],
    )
    ratio = bench.median(late) / bench.median(early)
    sizes = ", ".join(f"{run.database_bytes / 2**20:.1f} MiB" for run in runs)
    print(f"\ncompactions per conversation: {', '.join(str(run.compactions) for run in runs)}")
    print(f"database size after each conversation: {sizes if runs[0].database_bytes else 'n/a'}")
    print(f"peak memory: {bench.peak_rss_mib():.0f} MiB")
    print(
        f"turn {turns} / turn 5: {ratio:.3f}x (target ≤ {TARGET}x): {bench.verdict(ratio, TARGET)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--turns", type=int, default=500, help="turns in each conversation")
    parser.add_argument("--conversations", type=int, default=3, help="conversations measured")
    parser.add_argument("--window", type=int, default=4096, help="the agent's context window")
    bench.add_database_arguments(parser)
    args = parser.parse_args()
    bench.check_database_arguments(parser, args)
    if args.turns < 2 * EDGE:
        parser.error(f"--turns must be at least {2 * EDGE}")
    label = bench.database_label(args.db, args.db_rtt_ms)
    print(f"long conversation: {args.conversations} x {args.turns} turns; store: {label}")
    with (
        bench.database_server(args.db, args.db_rtt_ms) as server,
        bench.fake_ollama(CHUNKS, 0) as url,
    ):
        runs = [measured(url, server, args.turns, args.window) for _ in range(args.conversations)]
        bare = asyncio.run(bare_seconds(url, EDGE * args.conversations))
    report(runs, bare, args.turns, args.window, label)


if __name__ == "__main__":
    main()
