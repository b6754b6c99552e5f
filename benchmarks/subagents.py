"""Sub-agents: what running five at once adds to their model time, and whether they slow a person.

(1) Overhead: one `delegate` call launches five sub-agents, each answering with one 50-chunk
stream ~100 ms long (`--chunks 50 --delay-ms 2`); the time from the call to the last run's end
is set against five concurrent streams of the same request from a bare `ollama.AsyncClient`,
alternating round by round. Each round is a new conversation; the follow-up turns that would
carry the reports are switched off, so only the runs are measured. Target: ≤ 1.05×.

(2) A person while five sub-agents work elsewhere: a message in another conversation, timed from
its arrival to its first visible text, once five sub-agents are receiving their streams in a
first conversation, against the same message with nothing else running, alternating. The bare
client's first chunk, idle and beside five bare streams, shows what the fake and the machine
add under the same load. The model client allows eight
requests at once (the fake serves any number). Target: ≤ 1.2× the idle time.

Run from the repository root:
    .venv/bin/python benchmarks/subagents.py [--rounds 20] [--warmup 3]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import itertools
import tempfile
import time
from typing import Any

from benchmarks import _common as bench  # clears the proxy variables

AGENTS = 5
SLOTS = 8
OVERHEAD_TARGET, PERSON_TARGET = 1.05, 1.2
PLACES = itertools.count(1)


def new_place() -> str:
    return f"{bench.PLATFORM}:round-{next(PLACES)}"


async def launch_five(kaiwa: bench.Kaiwa, subagents: Any, place: str) -> float:
    """Seconds from `delegate` in `place` to the end of the last of its five runs."""
    from core.store import TurnStart
    from core.turns.parts import OpenTurn
    from core.turns.turn import TurnRequest

    started = await kaiwa.store.start_turn(
        TurnStart(place, "assistant", bench.SYSTEM_PROMPT, "person", "go")
    )
    turn = OpenTurn(TurnRequest(bench.PLATFORM, place, "go"), kaiwa.runner.settings.agent)
    turn.row.set_result(started)
    tools = subagents.joined(turn).tools
    tasks = [{"profile": "worker", "instruction": f"Hello there {n}"} for n in range(AGENTS)]
    begun = time.perf_counter()
    await tools["delegate"].invoke({"tasks": tasks})
    await asyncio.gather(*(run.finished.wait() for run in subagents.live(place)))
    return time.perf_counter() - begun


def runs_alone(kaiwa: bench.Kaiwa) -> Any:
    """Sub-agents on Kaiwa's turn path whose finished reports start no turn of their own (a
    parts collection that carries nothing): the runs are measured alone."""
    from core.features.subagents.agents import Subagents
    from core.features.subagents.runs import SubagentSettings
    from core.turns.parts import TurnParts

    runner = kaiwa.runner
    return Subagents(
        kaiwa.store,
        kaiwa.model,
        runner.settings,
        SubagentSettings(),
        runner.conversations.windows.of,
        TurnParts(carry=lambda request: None),
        {kaiwa.channel.platform: kaiwa.channel},
    )


async def streaming(subagents: Any, place: str) -> None:
    """Until the five sub-agents of `place` are receiving their streams."""
    runs = subagents.live
    while sum(run.doing == "writing" for run in runs(place)) < AGENTS:  # noqa: ASYNC110
        await asyncio.sleep(0.001)  # a run has no event for its first chunk: look again


async def five_bare(client: object) -> float:
    begun = time.perf_counter()
    await asyncio.gather(*(bench.bare_turn(client, f"Hello there {n}") for n in range(AGENTS)))  # type: ignore[arg-type]
    return time.perf_counter() - begun


async def first_text(kaiwa: bench.Kaiwa) -> float:
    """Seconds from a person's message in a new conversation to its first visible text."""
    begun = time.perf_counter()
    reply = await kaiwa.send(f"{bench.PLATFORM}:person-{next(PLACES)}", "Hello there")
    await reply.has_text.wait()
    shown = time.perf_counter() - begun
    await reply.finished.wait()
    return shown


async def bare_first_chunk(client: object) -> float:
    """The bare client's time to its first chunk, for the same request."""
    messages = [
        {"role": "system", "content": bench.SYSTEM_PROMPT},
        {"role": "user", "content": "Hello there"},
    ]
    begun = time.perf_counter()
    stream = await client.chat(model=bench.MODEL, messages=messages, stream=True)  # type: ignore[attr-defined]
    first = 0.0
    async for _ in stream:
        first = first or time.perf_counter() - begun
    return first


async def measure(url: str, rounds: int, warmup: int) -> dict[str, list[float]]:
    from core.agent.profile import AgentProfile

    worker = AgentProfile(name="worker", model=bench.MODEL, system_prompt="You work.", tools={})
    names = ("kaiwa", "bare", "busy", "idle", "bare busy", "bare idle")
    times: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="kaiwa-bench-") as tmp:
        kaiwa = await bench.build_kaiwa(url, Path(tmp), SLOTS, agents={"worker": worker})
        runs = runs_alone(kaiwa)
        client = bench.bare_client(url, connections=SLOTS)
        try:
            for index in range(warmup + rounds):
                measured = index >= warmup
                sides = [
                    ("kaiwa", launch_five(kaiwa, runs, new_place())),
                    ("bare", five_bare(client)),
                ]
                for name, side in sides if index % 2 else reversed(sides):
                    seconds = await side
                    if measured:
                        times[name].append(seconds)
                idle = await first_text(kaiwa)
                place = new_place()
                background = asyncio.create_task(launch_five(kaiwa, runs, place))
                await streaming(runs, place)
                busy = await first_text(kaiwa)
                await background
                bare_idle = await bare_first_chunk(client)
                streams = asyncio.create_task(five_bare(client))
                await asyncio.sleep(0.02)  # the five bare streams are under way
                bare_busy = await bare_first_chunk(client)
                await streams
                if measured:
                    times["idle"].append(idle)
                    times["busy"].append(busy)
                    times["bare idle"].append(bare_idle)
                    times["bare busy"].append(bare_busy)
        finally:
            await client.close()
            await kaiwa.close()
    return times


def report(times: dict[str, list[float]]) -> None:
    rows = [
        (name, len(values), bench.ms(bench.median(values)), bench.ms(bench.percentile(values, 99)))
        for name, values in (
            ("five sub-agents, delegate to last end", times["kaiwa"]),
            ("five bare streams at once", times["bare"]),
            ("a person's first text, 5 sub-agents busy", times["busy"]),
            ("a person's first text, idle", times["idle"]),
            ("bare client's first chunk, 5 streams busy", times["bare busy"]),
            ("bare client's first chunk, idle", times["bare idle"]),
        )
    ]
    bench.print_table("Sub-agents (100 ms streams)", ("what", "n", "median", "p99"), rows)
    overhead = bench.median(times["kaiwa"]) / bench.median(times["bare"])
    person = bench.median(times["busy"]) / bench.median(times["idle"])
    print(f"\npeak memory: {bench.peak_rss_mib():.0f} MiB")
    print(
        f"five sub-agents / five bare streams: {overhead:.3f}x "
        f"(target ≤ {OVERHEAD_TARGET}x): {bench.verdict(overhead, OVERHEAD_TARGET)}"
    )
    bare = bench.median(times["bare busy"]) / bench.median(times["bare idle"])
    print(
        f"a person's first text, busy / idle: {person:.3f}x "
        f"(target ≤ {PERSON_TARGET}x): {bench.verdict(person, PERSON_TARGET)}; "
        f"the bare client's, the same way: {bare:.3f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=20, help="measured rounds per side")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured rounds first")
    args = parser.parse_args()
    print(f"sub-agents: {args.rounds} rounds after {args.warmup} warm-ups, interleaved")
    with bench.fake_ollama(50, 2) as url:
        times = asyncio.run(measure(url, args.rounds, args.warmup))
    report(times)


if __name__ == "__main__":
    main()
