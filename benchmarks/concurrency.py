"""Concurrency: N conversations each sending one message at once; wall time and peak memory.

For N = 1, 100 and 1,000 distinct places, every message is handed to the dispatcher in one burst
and the clock stops when the last reply is stored. The baseline is one shared bare
`ollama.AsyncClient` running N streams with `asyncio.gather`. Both sides allow N at once (Kaiwa's
model cap and both sides' httpx connection limits are N) and use a 60 s connect timeout, since a
1,000-connection burst on two cores can take longer than Kaiwa's 5 s default to be accepted.

Shape: each (side, N) runs in a fresh child process (this script with `--child`) so its peak RSS
(VmHWM) is its own; the child first runs one unmeasured warm-up stream so one-time costs (lazy
imports, statement caches) stay out of the burst. The sides alternate, Kaiwa first for even
repeats and bare first for odd ones. The stream is short (`--chunks 20 --delay-ms 2`, ~40 ms):
through `ollama.AsyncClient` the client side, not the fake, is the bottleneck at N = 1,000.

The store is a SQLite file (`--db sqlite`, the default) or PostgreSQL (`--db postgres`, the server
at $KAIWA_BENCH_POSTGRES_URL), optionally a network hop away (`--db-rtt-ms X`: one TCP proxy in
its own process, started by this parent, adds X ms per round trip). Every Kaiwa child starts on an
empty database: its own SQLite file, or a schema it creates (through the proxy) and drops at the
end. The bare side touches no database. Each child also runs a monitor task that sleeps 5 ms over
and over; how late it wakes during the burst is the event loop's lag (median, p99, max).

Targets at N = 1,000 (the header of the verdict table names those of the chosen database); a
burst in which any Kaiwa reply did not end DONE misses the wall-time target whatever its time:
- SQLite: wall time ≤ 1.5× the bare client, Kaiwa peak RSS ≤ 400 MiB (anchor: 51× and 1.2 GiB);
- PostgreSQL, rtt 1 ms: wall time ≤ 1.5× the bare client, Kaiwa's loop lag p99 ≤ 50 ms.

Run from the repository root:
    .venv/bin/python benchmarks/concurrency.py [--sizes 1 100 1000] [--repeats 2]
                                               [--db sqlite|postgres] [--db-rtt-ms 0]
or  .venv/bin/python -m benchmarks.concurrency
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import json
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from benchmarks import _common as bench  # clears the proxy variables

CHUNKS, DELAY_MS = 20, 2
BIG_N = 1000
CONNECT_TIMEOUT = 60.0


@dataclass(frozen=True)
class Targets:
    """At N = BIG_N; None: no target for this database (the figure is printed for information)."""

    ratio: float | None  # Kaiwa's wall time / the bare client's, every reply DONE
    rss_mib: float | None  # Kaiwa's peak RSS
    lag_p99_ms: float | None  # Kaiwa's event loop lag during the burst, p99
    anchor: str = ""


TARGETS = {
    ("sqlite", 0.0): Targets(1.5, 400, None, "anchor: 51x and 1.2 GiB"),
    ("postgres", 1.0): Targets(1.5, None, 50),
}
NO_TARGETS = Targets(None, None, None)


# -- the child: one side, one N ----------------------------------------------------------------


async def kaiwa_burst(
    url: str, server: str | None, n: int, limit: float, profile: bench.Profile
) -> dict[str, object]:
    with (
        tempfile.TemporaryDirectory(prefix="kaiwa-bench-") as tmp,
        bench.fresh_database(server, Path(tmp)) as database_url,
    ):
        kaiwa = await bench.build_kaiwa(
            url, Path(tmp), n, database_url=database_url, connect_timeout=CONNECT_TIMEOUT
        )
        lag = bench.LoopLag()
        try:
            warm = await kaiwa.send("bench:warm-up", "Hello there")
            await warm.finished.wait()
            rss_ready = bench.current_rss_mib()
            lag.start()
            with profile.running():
                begun, started = lag.now(), time.perf_counter()
                # Handed over at once, as platforms deliver: each message waits for its record.
                sending = (kaiwa.send(f"bench:conv-{i}", "Hello there") for i in range(n))
                replies = await asyncio.gather(*sending)
                handed = time.perf_counter() - started
                waits = [asyncio.ensure_future(reply.finished.wait()) for reply in replies]
                await asyncio.wait(waits, timeout=limit)
                wall = time.perf_counter() - started
                ended = lag.now()
            for wait in waits:
                wait.cancel()
            done = sum(reply.outcome is bench.Outcome.DONE for reply in replies)
            unfinished = sum(not reply.finished.is_set() for reply in replies)
            notes = sorted({reply.note for reply in replies if reply.note})
            if unfinished:
                notes.insert(0, f"{unfinished} unfinished after {limit:g} s")
        finally:
            await lag.stop()
            await kaiwa.close()
    lateness = lag.lateness([(begun, ended)])
    return burst_result(wall, handed, done, rss_ready, lateness, notes)


async def bare_burst(url: str, n: int, limit: float) -> dict[str, object]:
    client = bench.bare_client(url, n, timeout=CONNECT_TIMEOUT)
    lag = bench.LoopLag()
    try:
        await bench.bare_turn(client, "Hello there")
        rss_ready = bench.current_rss_mib()
        lag.start()
        begun, started = lag.now(), time.perf_counter()
        tasks = [asyncio.ensure_future(bench.bare_turn(client, "Hello there")) for _ in range(n)]
        handed = time.perf_counter() - started
        await asyncio.wait(tasks, timeout=limit)
        wall = time.perf_counter() - started
        ended = lag.now()
        for task in tasks:
            task.cancel()
        finished = [task for task in tasks if task.done() and not task.cancelled()]
        errors = sorted({repr(task.exception()) for task in finished if task.exception()})
        done = sum(1 for task in finished if task.exception() is None)
        if len(finished) < n:
            errors.insert(0, f"{n - len(finished)} unfinished after {limit:g} s")
    finally:
        await lag.stop()
        await client.close()
    lateness = lag.lateness([(begun, ended)])
    return burst_result(wall, handed, done, rss_ready, lateness, errors)


def burst_result(
    wall: float,
    handed: float,
    ok: int,
    rss_ready: float,
    lateness: list[float],
    errors: list[str],
) -> dict[str, object]:
    """What a child reports of its burst, either side."""
    return {
        "wall": wall,
        "handed": handed,
        "ok": ok,
        "rss_ready": rss_ready,
        "lag": bench.lag_summary(lateness),
        "errors": errors[:3],
    }


def child(args: argparse.Namespace) -> None:
    profiler = bench.Profile(args.profile)
    if args.child == "kaiwa":
        result = asyncio.run(kaiwa_burst(args.url, args.db_server, args.n, args.limit, profiler))
    else:
        result = asyncio.run(bare_burst(args.url, args.n, args.limit))
    result["rss_peak"] = bench.peak_rss_mib()
    print("RESULT " + json.dumps(result), flush=True)
    profiler.report(f"a burst of {args.n} conversations")


# -- the parent: alternate the sides, print the table -----------------------------------------


def run_child(
    side: str, url: str, server: str | None, n: int, args: argparse.Namespace
) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", side, "--url", url]
    command += ["--n", str(n), "--limit", str(args.limit)]
    if side == "kaiwa":
        if server is not None:
            command += ["--db-server", server]
        if args.profile:
            command.append("--profile")
    try:
        finished = subprocess.run(
            command, cwd=bench.ROOT, capture_output=True, text=True, timeout=args.limit + 120
        )
    except subprocess.TimeoutExpired:
        nan = float("nan")
        return {
            "wall": nan,
            "handed": nan,
            "ok": 0,
            "rss_peak": nan,
            "rss_ready": nan,
            "lag": bench.lag_summary([]),
            "errors": ["timed out"],
        }
    sys.stderr.write(finished.stderr)
    for line in finished.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line.removeprefix("RESULT "))
    raise RuntimeError(f"the {side} child (N={n}) printed no result:\n{finished.stdout}")


@dataclass
class SizeFigures:
    ratio: float  # median wall, kaiwa / bare
    not_ok: dict[str, int]  # per side: replies not ok, over all repeats
    rss_peak: dict[str, float]  # per side: the largest peak RSS of the repeats
    lag: dict[str, dict[str, float]]  # per side: the lag of the child with the largest p99


def measure(
    url: str, server: str | None, n: int, args: argparse.Namespace
) -> tuple[list[tuple[object, ...]], SizeFigures]:
    """Rows for the table at one N, and the figures the targets are checked on."""
    runs: dict[str, list[dict[str, Any]]] = {"kaiwa": [], "bare": []}
    for repeat in range(args.repeats):
        for side in ("kaiwa", "bare") if repeat % 2 == 0 else ("bare", "kaiwa"):
            runs[side].append(run_child(side, url, server, n, args))
    wall = {side: bench.median([r["wall"] for r in results]) for side, results in runs.items()}
    figures = SizeFigures(
        ratio=wall["kaiwa"] / wall["bare"],
        not_ok={side: sum(n - r["ok"] for r in results) for side, results in runs.items()},
        rss_peak={side: max(r["rss_peak"] for r in results) for side, results in runs.items()},
        lag={side: worst_lag(results) for side, results in runs.items()},
    )
    rows: list[tuple[object, ...]] = []
    for side, results in runs.items():
        handed = bench.median([r["handed"] for r in results])
        ready = max(r["rss_ready"] for r in results)
        errors = "; ".join(sorted({e for r in results for e in r["errors"]}))
        shown_ratio = f"{figures.ratio:.2f}x" if side == "kaiwa" else ""
        rows.append((
            n, side, f"{wall[side]:.3f} s", f"{handed:.3f} s",
            f"{figures.not_ok[side]}/{n * len(results)}",
            f"{figures.rss_peak[side]:.0f} MiB", f"{ready:.0f} MiB",
            bench.lag_cell(figures.lag[side]), shown_ratio, errors,
        ))  # fmt: skip
    return rows, figures


def worst_lag(results: list[dict[str, Any]]) -> dict[str, float]:
    """The lag figures of the child whose p99 was the largest (a child without samples, last)."""
    measured = [r["lag"] for r in results if r["lag"]["n"]]
    return max(measured, key=lambda lag: lag["p99"]) if measured else bench.lag_summary([])


def target_rows(figures: SizeFigures, targets: Targets) -> list[tuple[object, ...]]:
    """The verdicts at N = BIG_N: information only, nothing exits non-zero on a miss."""
    not_ok = figures.not_ok["kaiwa"]
    rows: list[tuple[object, ...]] = []
    if targets.ratio is None:
        rows.append(("wall, kaiwa / bare", f"{figures.ratio:.2f}x", "(info)", ""))
    else:
        passed = bench.verdict(figures.ratio, targets.ratio) == "PASS" and not_ok == 0
        rows.append((
            "wall, kaiwa / bare", f"{figures.ratio:.2f}x",
            f"<= {targets.ratio:g}x, every reply ok", "PASS" if passed else "MISS",
        ))  # fmt: skip
    rows.append(("kaiwa replies not ok", str(not_ok), "0", bench.verdict(not_ok, 0)))
    rss = figures.rss_peak["kaiwa"]
    if targets.rss_mib is None:
        rows.append(("kaiwa peak RSS", f"{rss:.0f} MiB", "(info)", ""))
    else:
        rows.append((
            "kaiwa peak RSS", f"{rss:.0f} MiB", f"<= {targets.rss_mib:g} MiB",
            bench.verdict(rss, targets.rss_mib),
        ))  # fmt: skip
    for side in ("kaiwa", "bare"):
        p99_ms = figures.lag[side]["p99"] * 1000
        label, value = f"{side} loop lag p99 (worst child)", f"{p99_ms:.2f} ms"
        if side == "kaiwa" and targets.lag_p99_ms is not None:
            rows.append((label, value, f"<= {targets.lag_p99_ms:g} ms",
                         bench.verdict(p99_ms, targets.lag_p99_ms)))  # fmt: skip
        else:
            rows.append((label, value, "(info)", ""))
    return rows


def describe(targets: Targets) -> str:
    """The targets that apply, for the verdict table's header."""
    parts = []
    if targets.ratio is not None:
        parts.append(f"wall <= {targets.ratio:g}x the bare client with every reply ok")
    if targets.rss_mib is not None:
        parts.append(f"Kaiwa peak RSS <= {targets.rss_mib:g} MiB")
    if targets.lag_p99_ms is not None:
        parts.append(f"Kaiwa loop lag p99 <= {targets.lag_p99_ms:g} ms")
    if not parts:
        return "no targets set for this database (figures for information)"
    anchor = f" ({targets.anchor})" if targets.anchor else ""
    return "targets: " + ", ".join(parts) + anchor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 100, BIG_N])
    parser.add_argument("--repeats", type=int, default=2, help="child runs per side and N")
    parser.add_argument("--limit", type=float, default=180.0, help="seconds a burst may take")
    parser.add_argument("--profile", action="store_true", help="cProfile Kaiwa's burst (stderr)")
    bench.add_database_arguments(parser)
    parser.add_argument("--child", choices=["kaiwa", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--db-server", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    bench.check_database_arguments(parser, args)
    label = bench.database_label(args.db, args.db_rtt_ms)
    targets = TARGETS.get((args.db, args.db_rtt_ms), NO_TARGETS)

    print(
        f"concurrency: one message in each of N places at once; stream of {CHUNKS} chunks "
        f"{DELAY_MS} ms apart; {args.repeats} fresh child process(es) per side and N"
    )
    print(f"store: {label}")
    if args.profile:
        print("profiling: Kaiwa's wall times are inflated by cProfile, so ignore the ratios")
    rows: list[tuple[object, ...]] = []
    big: SizeFigures | None = None
    with (
        bench.database_server(args.db, args.db_rtt_ms) as server,
        bench.fake_ollama(CHUNKS, DELAY_MS) as url,
    ):
        for n in args.sizes:
            size_rows, figures = measure(url, server, n, args)
            rows += size_rows
            if n == BIG_N:
                big = figures
    bench.print_table(
        "Burst of N conversations (wall, handed over: median of the repeats; not ok: over all "
        "repeats; RSS: the largest; loop lag: the child with the largest p99)",
        ("N", "side", "wall", "handed over", "replies not ok", "peak RSS", "RSS before burst",
         "loop lag p50 / p99 / max (ms)", "kaiwa/bare", "errors"),
        rows,
    )  # fmt: skip
    if big is None:
        print(f"\n(no verdicts: the targets are at N = {BIG_N}; {describe(targets)})")
        return
    bench.print_table(
        f"Targets at N = {BIG_N} on {label}; {describe(targets)}",
        ("figure", "value", "target", "verdict"),
        target_rows(big, targets),
    )


if __name__ == "__main__":
    main()
