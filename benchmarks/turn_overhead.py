"""Turn overhead: what one Kaiwa turn costs on top of the bare Ollama client doing the same stream.

Kaiwa side: message in (`Dispatcher.handle`) → reply stored (the reply's `finish`, which the turn
calls only after its records are written). Baseline: one shared `ollama.AsyncClient` streaming the
same request and consuming every chunk. Both talk to a fake Ollama in its own process.

Shape: the two sides alternate round by round (and swap which goes first every round), so drift
in this noisy machine's speed hits both equally; only the ratio and the difference mean anything.
Each Kaiwa round is the first message of a new conversation (a new place), so every round sends
the same two-message request as the baseline; that is also the costliest path through the store
(look up, create, load history). Two streams:
- 50 chunks over ~100 ms (`--chunks 50 --delay-ms 2`): the relative overhead, target ≤ 1.02×;
- the same 50 chunks with no delay: the absolute time added, target ≤ 2 ms median.

Run from the repository root:
    .venv/bin/python benchmarks/turn_overhead.py [--rounds 100] [--warmup 5] [--profile]
or  .venv/bin/python -m benchmarks.turn_overhead
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable

from benchmarks import _common as bench  # clears the proxy variables

TARGET_RATIO = 1.02
TARGET_ADDED_MS = 2.0
CHUNKS = 50


async def measure(
    url: str, rounds: int, warmup: int, profile: bench.Profile
) -> tuple[list[float], list[float]]:
    """Seconds per round for Kaiwa and for the bare client, interleaved."""
    with tempfile.TemporaryDirectory(prefix="kaiwa-bench-") as tmp:
        kaiwa = bench.build_kaiwa(url, Path(tmp), max_concurrent=1)
        client = bench.bare_client(url, connections=1)
        counter = iter(range(1_000_000))

        async def kaiwa_round() -> None:
            with profile.running():
                reply = await kaiwa.send(f"bench:turn-{next(counter)}", "Hello there")
                await reply.finished.wait()
            if reply.outcome is not bench.Outcome.DONE:
                raise RuntimeError(f"turn ended {reply.outcome}: {reply.note}")

        async def bare_round() -> None:
            await bench.bare_turn(client, "Hello there")

        async def timed(side: Callable[[], Awaitable[None]]) -> float:
            started = time.perf_counter()
            await side()
            return time.perf_counter() - started

        try:
            for _ in range(warmup):
                await kaiwa_round()
                await bare_round()
            kaiwa_times: list[float] = []
            bare_times: list[float] = []
            for index in range(rounds):
                if index % 2:
                    bare_times.append(await timed(bare_round))
                    kaiwa_times.append(await timed(kaiwa_round))
                else:
                    kaiwa_times.append(await timed(kaiwa_round))
                    bare_times.append(await timed(bare_round))
        finally:
            await client.close()
            await kaiwa.close()
    return kaiwa_times, bare_times


def report(slow: tuple[list[float], list[float]], fast: tuple[list[float], list[float]]) -> None:
    rows = []
    for label, (kaiwa, bare) in (("50 chunks / 100 ms", slow), ("50 chunks / 0 ms", fast)):
        for side, times in (("kaiwa", kaiwa), ("bare client", bare)):
            p50, p99 = bench.median(times), bench.percentile(times, 99)
            rows.append((label, side, len(times), bench.ms(p50), bench.ms(p99)))
    bench.print_table("Per round", ("stream", "side", "n", "median", "p99"), rows)

    kaiwa, bare = slow
    ratio = bench.median(kaiwa) / bench.median(bare)
    ratio_p99 = bench.percentile(kaiwa, 99) / bench.percentile(bare, 99)
    added = (bench.median(fast[0]) - bench.median(fast[1])) * 1000
    added_slow = (bench.median(kaiwa) - bench.median(bare)) * 1000
    pass_ratio = bench.verdict(ratio, TARGET_RATIO)
    pass_added = bench.verdict(added, TARGET_ADDED_MS)
    rows = [
        ("median ratio, 100 ms stream", f"{ratio:.3f}x", f"<= {TARGET_RATIO}x", pass_ratio),
        ("p99 ratio, 100 ms stream", f"{ratio_p99:.3f}x", "(info)", ""),
        ("median added, 100 ms stream", f"{added_slow:+.2f} ms", "(info)", ""),
        ("median added, 0 ms stream", f"{added:+.2f} ms", f"<= {TARGET_ADDED_MS:g} ms", pass_added),
    ]
    bench.print_table(
        "Kaiwa against the bare client (anchor: 1.05x and +5 ms)",
        ("figure", "value", "target", "verdict"),
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=100, help="measured rounds per side")
    parser.add_argument("--warmup", type=int, default=5, help="unmeasured rounds per side first")
    parser.add_argument(
        "--profile", action="store_true", help="cProfile Kaiwa's zero-delay rounds (to stderr)"
    )
    args = parser.parse_args()
    print(f"turn overhead: {args.rounds} rounds per side after {args.warmup} warm-ups, interleaved")
    with bench.fake_ollama(CHUNKS, 2) as slow_url:
        slow = asyncio.run(measure(slow_url, args.rounds, args.warmup, bench.Profile(False)))
    profile = bench.Profile(args.profile)  # the zero-delay stream, where overhead is all there is
    with bench.fake_ollama(CHUNKS, 0) as fast_url:
        fast = asyncio.run(measure(fast_url, args.rounds, args.warmup, profile))
    report(slow, fast)
    profile.report("turns on the zero-delay stream")


if __name__ == "__main__":
    main()
