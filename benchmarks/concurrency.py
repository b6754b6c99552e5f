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

Targets at N = 1,000: wall time ≤ 1.5× the bare client, Kaiwa peak RSS ≤ 400 MiB
(anchor: 51× and 1.2 GiB).

Run from the repository root:
    .venv/bin/python benchmarks/concurrency.py [--sizes 1 100 1000] [--repeats 1]
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
from typing import Any

from benchmarks import _common as bench  # clears the proxy variables

CHUNKS, DELAY_MS = 20, 2
TARGET_RATIO = 1.5
TARGET_RSS_MIB = 400
BIG_N = 1000
CONNECT_TIMEOUT = 60.0


# -- the child: one side, one N ----------------------------------------------------------------


async def kaiwa_burst(url: str, n: int, limit: float, profile: bench.Profile) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="kaiwa-bench-") as tmp:
        kaiwa = bench.build_kaiwa(url, Path(tmp), n, connect_timeout=CONNECT_TIMEOUT)
        try:
            warm = await kaiwa.send("bench:warm-up", "Hello there")
            await warm.finished.wait()
            rss_ready = bench.current_rss_mib()
            with profile.running():
                started = time.perf_counter()
                replies = [await kaiwa.send(f"bench:conv-{i}", "Hello there") for i in range(n)]
                waits = [asyncio.ensure_future(reply.finished.wait()) for reply in replies]
                await asyncio.wait(waits, timeout=limit)
                wall = time.perf_counter() - started
            done = sum(reply.outcome is bench.Outcome.DONE for reply in replies)
            notes = sorted({reply.note for reply in replies if reply.note})
        finally:
            await kaiwa.close()
    return {"wall": wall, "ok": done, "rss_ready": rss_ready, "errors": notes[:3]}


async def bare_burst(url: str, n: int, limit: float) -> dict[str, object]:
    client = bench.bare_client(url, n, timeout=CONNECT_TIMEOUT)
    try:
        await bench.bare_turn(client, "Hello there")
        rss_ready = bench.current_rss_mib()
        started = time.perf_counter()
        tasks = [asyncio.ensure_future(bench.bare_turn(client, "Hello there")) for _ in range(n)]
        await asyncio.wait(tasks, timeout=limit)
        wall = time.perf_counter() - started
        for task in tasks:
            task.cancel()
        finished = [task for task in tasks if task.done() and not task.cancelled()]
        errors = sorted({repr(task.exception()) for task in finished if task.exception()})
        done = sum(1 for task in finished if task.exception() is None)
    finally:
        await client.close()
    return {"wall": wall, "ok": done, "rss_ready": rss_ready, "errors": errors[:3]}


def child(side: str, url: str, n: int, limit: float, profile: bool) -> None:
    profiler = bench.Profile(profile)
    if side == "kaiwa":
        result = asyncio.run(kaiwa_burst(url, n, limit, profiler))
    else:
        result = asyncio.run(bare_burst(url, n, limit))
    result["rss_peak"] = bench.peak_rss_mib()
    print("RESULT " + json.dumps(result), flush=True)
    profiler.report(f"a burst of {n} conversations")


# -- the parent: alternate the sides, print the table -----------------------------------------


def run_child(side: str, url: str, n: int, limit: float, profile: bool) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", side, "--url", url]
    command += ["--n", str(n), "--limit", str(limit)]
    if profile and side == "kaiwa":
        command.append("--profile")
    try:
        finished = subprocess.run(
            command, cwd=bench.ROOT, capture_output=True, text=True, timeout=limit + 120
        )
    except subprocess.TimeoutExpired:
        nan = float("nan")
        return {"wall": nan, "ok": 0, "rss_peak": nan, "rss_ready": nan, "errors": ["timed out"]}
    sys.stderr.write(finished.stderr)
    for line in finished.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line.removeprefix("RESULT "))
    raise RuntimeError(f"the {side} child (N={n}) printed no result:\n{finished.stdout}")


def measure(
    url: str, n: int, args: argparse.Namespace
) -> tuple[list[tuple[object, ...]], float, float]:
    """Rows for the table at one N, the kaiwa/bare wall ratio and Kaiwa's peak RSS."""
    runs: dict[str, list[dict[str, Any]]] = {"kaiwa": [], "bare": []}
    for repeat in range(args.repeats):
        for side in ("kaiwa", "bare") if repeat % 2 == 0 else ("bare", "kaiwa"):
            runs[side].append(run_child(side, url, n, args.limit, args.profile))
    wall = {side: bench.median([r["wall"] for r in results]) for side, results in runs.items()}
    rss = {side: max(r["rss_peak"] for r in results) for side, results in runs.items()}
    ratio = wall["kaiwa"] / wall["bare"]
    rows: list[tuple[object, ...]] = []
    for side, results in runs.items():
        ok = min(r["ok"] for r in results)
        ready = max(r["rss_ready"] for r in results)
        errors = "; ".join(sorted({e for r in results for e in r["errors"]}))
        shown_ratio = f"{ratio:.2f}x" if side == "kaiwa" else ""
        figures = (f"{wall[side]:.3f} s", f"{ok}/{n}", f"{rss[side]:.0f} MiB", f"{ready:.0f} MiB")
        rows.append((n, side, *figures, shown_ratio, errors))
    return rows, ratio, rss["kaiwa"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 100, BIG_N])
    parser.add_argument("--repeats", type=int, default=2, help="child runs per side and N")
    parser.add_argument("--limit", type=float, default=180.0, help="seconds a burst may take")
    parser.add_argument("--profile", action="store_true", help="cProfile Kaiwa's burst (stderr)")
    parser.add_argument("--child", choices=["kaiwa", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.url, args.n, args.limit, args.profile)
        return

    print(
        f"concurrency: one message in each of N places at once; stream of {CHUNKS} chunks "
        f"{DELAY_MS} ms apart; {args.repeats} fresh child process(es) per side and N"
    )
    if args.profile:
        print("profiling: Kaiwa's wall times are inflated by cProfile, so ignore the ratios")
    rows: list[tuple[object, ...]] = []
    targets = []
    with bench.fake_ollama(CHUNKS, DELAY_MS) as url:
        for n in args.sizes:
            size_rows, ratio, rss_kaiwa = measure(url, n, args)
            rows += size_rows
            if n == BIG_N:
                targets = [
                    ("wall, kaiwa / bare", f"{ratio:.2f}x", f"<= {TARGET_RATIO}x",
                     bench.verdict(ratio, TARGET_RATIO)),
                    ("kaiwa peak RSS", f"{rss_kaiwa:.0f} MiB", f"<= {TARGET_RSS_MIB} MiB",
                     bench.verdict(rss_kaiwa, TARGET_RSS_MIB)),
                ]  # fmt: skip
    bench.print_table(
        "Burst of N conversations (wall: median of the repeats; RSS: the largest)",
        ("N", "side", "wall", "replies ok", "peak RSS", "RSS before burst", "kaiwa/bare", "errors"),
        rows,
    )
    if targets:
        bench.print_table(
            f"Targets at N = {BIG_N} (anchor: 51x and 1.2 GiB)",
            ("figure", "value", "target", "verdict"),
            targets,
        )


if __name__ == "__main__":
    main()
