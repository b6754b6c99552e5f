"""Platform burst: N Telegram chats each send one message at the same moment to a real `kaiwa`
process, beside a bare bot doing the same on the same fakes, in one run.

Everything outside the bots is shared and fixed: the fake Bot API (`tests.fakes.telegram`, an
aiohttp server in this process, answering at once) and the fake Ollama (its own process, a short
stream of `--chunks` chunks `--delay-ms` apart), which both sides call with at most `--slots`
requests at once (Kaiwa's `[ollama].max_concurrent_requests`, 1 by default). Each side runs in
a process of its own, started fresh for every repeat: `kaiwa run` (Telegram polling, the terminal
off, a store of its own on `--db`), or the bare bot (`benchmarks/bare_telegram_bot.py`:
python-telegram-bot and the ollama client making the calls Kaiwa's reply makes). Each process
answers one warm-up message first.

Per side, then:
1. **Alone**: `--alone` messages one at a time, each in a chat of its own; the time from the
   update queued on the fake to the reply's first text shown (its `sendMessage`), median.
2. **Burst**: N updates queued at once, in N chats. Per chat, from the fake's records (its clock,
   `time.time()`): first text shown (the reply's `sendMessage`), and complete (the final text shown
   without its Stop button, as soon as the stream ends on both sides; a Kaiwa reply complete within
   `post_grace` is that one message). Printed: the first reply's first text, p50 and p99 of first
   texts, wall (the last complete), the side's CPU per message (user + system time of its process
   over the burst, from /proc, divided by N: work done per unit of time while it waits counts too),
   its peak RSS (VmHWM), the platform calls per message by method, and Kaiwa's store statements and
   COMMITs per message (counted by `benchmarks/counting/sitecustomize.py`, loaded into the kaiwa
   process through PYTHONPATH: nothing of Kaiwa is patched).

`--busy K` runs K busy loops (their own processes) beside both sides during the alone and burst
parts, as a shared server would. `--py-spy PATH` records the kaiwa process during each burst with
that py-spy binary (every thread; py-spy is no dependency of Kaiwa's: install it anywhere) and
prints where its samples went: by module, and the functions with the most samples of their own.
`--db postgres [--db-rtt-ms 1]` as in the other benchmarks. `--kaiwa-from DIR` runs the kaiwa
side from another checkout (same virtualenv), so two commits meet the same bare bot and fakes.

`--limits` turns on the fake's Bot API limits (`tests.fakes.telegram`: 30 calls in any second
for the bot, 3 in any 3 seconds per chat, answered past them with Telegram's 429 and its
`retry_after`), and runs the kaiwa side alone: the bare bot waits out no 429, so under the limits
most of its replies would be lost. Then also printed, per repeat, over the burst's calls that
count against the limits (refused ones too, as they came in, on the fake's clock): the share
answered 429, the most in any one second (bot-wide), calls per message, wall against the floor
the bot's limit sets (2 calls a message, 30 a second: N × 2 / 30 s) as a ratio, and complete p50.
Targets (SQLite, information only): CPU per message ≤ the bare bot's; first reply ≤ 0.5 s; wall ≤
1.1× the bare bot's; peak RSS ≤ 110 MiB; alone ≤ 15 ms. With `--busy`, compare each side with its
own quiet run: first reply and wall should grow no more for Kaiwa than for the bare bot.

Run from the repository root:
    .venv/bin/python benchmarks/platform_burst.py [--chats 300] [--repeats 2] [--alone 10]
                                                  [--busy 0] [--db sqlite|postgres] [--limits]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import itertools
import json
import os
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from benchmarks import _common as bench  # clears the proxy variables
from tests.fakes.ollama import BENCHMARK_REPLY
from tests.fakes.telegram import BOT_TOKEN, FakeTelegram

CHUNKS, DELAY_MS = 20, 0.0
EDIT_INTERVAL = 1.0
READY_SECONDS = 60.0
SIDES = ("kaiwa", "bare")
SHOWN = ("sendmessage", "editmessagetext")
FLOOR_CALLS, BOT_CALLS_A_SECOND = 2, 30  # a reply's post and final edit; Telegram's bot limit
COUNTING = bench.ROOT / "benchmarks" / "counting"
_CHATS = itertools.count(700_001)  # every message gets a chat of its own


@dataclass
class Burst:
    """One side's figures for one repeat."""

    alone: list[float] = field(default_factory=list)
    first_texts: list[float] = field(default_factory=list)
    complete: list[float] = field(default_factory=list)
    cpu: float = 0.0
    rss_mib: float = 0.0
    calls: Counter[str] = field(default_factory=Counter)
    store: dict[str, int] = field(default_factory=dict)
    incomplete: int = 0
    limited: list[float] = field(default_factory=list)
    """When each call counting against the fake's limits came in during the burst (--limits)."""
    refused: int = 0


# -- a bot process ----------------------------------------------------------------------------


def kaiwa_config(
    folder: Path, telegram: FakeTelegram, ollama_url: str, database: str, slots: int
) -> Path:
    path = folder / "kaiwa.toml"
    path.write_text(
        f'[ollama]\nurl = "{ollama_url}"\nmax_concurrent_requests = {slots}\n\n'
        f'[agents.assistant]\nmodel = "{bench.MODEL}"\nsystem_prompt = "{bench.SYSTEM_PROMPT}"\n'
        "tools = []\n\n"
        f'[storage]\ndata_dir = "{folder / "state"}"\ndatabase_url_env = "KAIWA_BENCH_DB"\n\n'
        "[channels.terminal]\nenabled = false\n\n"
        f'[channels.telegram]\nbase_url = "{telegram.base_url}"\n'
        f'base_file_url = "{telegram.base_file_url}"\nanyone = true\npoll_timeout = 1\n'
        f"edit_interval = {EDIT_INTERVAL}\n"
    )
    return path


@contextmanager
def bot_process(
    side: str,
    telegram: FakeTelegram,
    ollama_url: str,
    folder: Path,
    database: str,
    slots: int,
    kaiwa_from: Path | None,
) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "KAIWA_TELEGRAM_TOKEN": BOT_TOKEN, "KAIWA_CONFIG": ""}
    cwd = bench.ROOT
    if side == "kaiwa":
        config = kaiwa_config(folder, telegram, ollama_url, database, slots)
        cwd = kaiwa_from or bench.ROOT  # another checkout of Kaiwa, for an A/B of two commits
        env |= {
            "PYTHONPATH": f"{COUNTING}:{cwd}",
            "KAIWA_BENCH_COUNTS": str(folder / "counts.json"),
        }
        env |= {"KAIWA_BENCH_DB": database} if database else {}
        command = [sys.executable, "-m", "bot", "--config", str(config), "run"]
    else:
        command = [sys.executable, "-m", "benchmarks.bare_telegram_bot", "--token", BOT_TOKEN]
        command += ["--base-url", telegram.base_url, "--ollama", ollama_url]
        command += ["--edit-interval", str(EDIT_INTERVAL), "--slots", str(slots)]
    process = subprocess.Popen(
        command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )
    try:
        yield process
    finally:
        process.kill()
        process.wait(timeout=10)


def cpu_seconds(pid: int) -> float:
    """User + system time of the process so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def store_counts(process: subprocess.Popen[bytes], folder: Path) -> dict[str, int]:
    """Kaiwa's statement and COMMIT counts so far (the counting hook writes them on SIGUSR1)."""
    counts = folder / "counts.json"
    counts.unlink(missing_ok=True)
    process.send_signal(signal.SIGUSR1)
    for _ in range(200):
        if counts.exists() and counts.read_text():
            return dict(json.loads(counts.read_text()))
        await asyncio.sleep(0.01)
    return {}


# -- what the fake saw --------------------------------------------------------------------------


def first_text_at(telegram: FakeTelegram, chat: int) -> float | None:
    calls = (c for c in telegram.calls if c.method.lower() == "sendmessage" and c.error is None)
    return next((c.at for c in calls if str(c.params.get("chat_id")) == str(chat)), None)


def complete_at(telegram: FakeTelegram, chat: int) -> float | None:
    """When the chat's reply first read the whole answer with no button under it."""
    sent = telegram.sent(chat)
    if not sent or sent[-1].visible.strip() != BENCHMARK_REPLY or sent[-1].buttons:
        return None
    shown = [
        c.at
        for c in telegram.calls
        if c.method.lower() in SHOWN and str(c.params.get("chat_id")) == str(chat)
    ]
    return shown[-1] if shown else None


async def answered(telegram: FakeTelegram, chats: list[int], limit: float) -> None:
    await telegram.wait_until(
        lambda: all(complete_at(telegram, chat) is not None for chat in chats),
        timeout=limit,
        what=f"{len(chats)} replies complete",
    )


def calls_per_method(telegram: FakeTelegram, chats: list[int]) -> Counter[str]:
    wanted = {str(chat) for chat in chats}
    return Counter(
        call.method for call in telegram.calls if str(call.params.get("chat_id")) in wanted
    )


def limited_calls(telegram: FakeTelegram, since: float) -> tuple[list[float], int]:
    """The arrival times of the calls counted against the limits since `since` (those refused
    too), and how many were refused."""
    limits = telegram.rate_limits
    refused = [refusal.at for refusal in limits.refused if refusal.at >= since]
    return sorted([at for at in limits.admitted if at >= since] + refused), len(refused)


def most_in_a_second(times: list[float]) -> int:
    """The most of `times` (sorted) in any one second."""
    first, most = 0, 0
    for last, at in enumerate(times):
        while times[first] <= at - 1.0:
            first += 1
        most = max(most, last - first + 1)
    return most


# -- one side, one repeat -------------------------------------------------------------------------


async def measure(
    side: str, telegram: FakeTelegram, ollama_url: str, args: argparse.Namespace
) -> Burst:
    figures = Burst()
    with (
        tempfile.TemporaryDirectory(prefix="kaiwa-burst-") as tmp,
        bench.kaiwa_database(args.db, args.db_rtt_ms, Path(tmp)) as database,
    ):
        folder = Path(tmp)
        url = database if side == "kaiwa" and args.db == "postgres" else ""
        running = bot_process(side, telegram, ollama_url, folder, url, args.slots, args.kaiwa_from)
        with running as process:
            warm = next(_CHATS)
            telegram.user_message(warm, "Hello there")
            await answered(telegram, [warm], READY_SECONDS)
            with busy_loops(args.busy):
                for _ in range(args.alone):
                    chat = next(_CHATS)
                    queued = time.time()
                    telegram.user_message(chat, "Hello there")
                    await telegram.wait_until(lambda c=chat: first_text_at(telegram, c), 30)
                    figures.alone.append((first_text_at(telegram, chat) or queued) - queued)
                    await answered(telegram, [chat], 30)
                await burst(side, telegram, process, folder, figures, args)
    return figures


async def burst(
    side: str,
    telegram: FakeTelegram,
    process: subprocess.Popen[bytes],
    folder: Path,
    figures: Burst,
    args: argparse.Namespace,
) -> None:
    chats = [next(_CHATS) for _ in range(args.chats)]
    before = await store_counts(process, folder) if side == "kaiwa" else {}
    recording = side == "kaiwa" and args.py_spy
    with py_spy(args.py_spy if recording else None, process.pid, folder / "samples.txt"):
        cpu = cpu_seconds(process.pid)
        limits_from = telegram.rate_limits.clock()
        queued = time.time()
        for chat in chats:
            telegram.user_message(chat, "Hello there")
        try:
            await answered(telegram, chats, args.limit)
        except AssertionError:
            figures.incomplete = sum(complete_at(telegram, chat) is None for chat in chats)
        figures.cpu = cpu_seconds(process.pid) - cpu
    if recording:
        print_profile(folder / "samples.txt")
    figures.rss_mib = peak_rss_mib(process.pid)
    if side == "kaiwa":
        after = await store_counts(process, folder)
        figures.store = {key: after.get(key, 0) - before.get(key, 0) for key in after}
    firsts = [first_text_at(telegram, chat) for chat in chats]
    figures.first_texts = [at - queued for at in firsts if at is not None]
    ends = [complete_at(telegram, chat) for chat in chats]
    figures.complete = [at - queued for at in ends if at is not None]
    figures.calls = calls_per_method(telegram, chats)
    figures.limited, figures.refused = limited_calls(telegram, limits_from)


@contextmanager
def py_spy(binary: str | None, pid: int, output: Path) -> Iterator[None]:
    """Record `pid` with py-spy (collapsed stacks, every thread) while the block runs."""
    if binary is None:
        yield
        return
    command = [binary, "record", "--pid", str(pid), "--format", "raw", "--threads"]
    command += ["--rate", "250", "--nonblocking", "--output", str(output)]
    recorder = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)  # py-spy attaches before the burst starts
    try:
        yield
    finally:
        recorder.send_signal(signal.SIGINT)
        recorder.wait(timeout=30)


def print_profile(samples: Path, shown: int = 25) -> None:
    """Where the samples went: by top-level module (any frame of it on the stack), and the
    functions with the most samples of their own (the innermost frame)."""
    own: Counter[str] = Counter()
    modules: Counter[str] = Counter()
    total = 0
    for line in samples.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [frame for frame in stack.split(";") if not frame.startswith("thread ")]
        if not frames:
            continue
        weight = int(count)
        total += weight
        own[frames[-1]] += weight
        for module in {_module(frame) for frame in frames}:
            modules[module] += weight
    print(f"\n  py-spy: {total} samples in the burst")
    for module, count in modules.most_common(shown):
        print(f"    {100 * count / total:5.1f} %  {module}")
    print("  functions with the most samples of their own:")
    for frame, count in own.most_common(shown):
        print(f"    {100 * count / total:5.1f} %  {frame}")


def _module(frame: str) -> str:
    """`core.turns` from `run (core/turns/runner.py:12)`; a library's top folder otherwise."""
    path = frame.rpartition("(")[2].split(":")[0]
    parts = Path(path).parts
    for top in ("core", "channels", "bot", "workflows"):
        if top in parts:
            index = parts.index(top)
            return ".".join(parts[index : index + 2]).removesuffix(".py")
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1]
    return Path(path).name or frame


@contextmanager
def busy_loops(count: int) -> Iterator[None]:
    """`count` processes spinning on the CPU for as long as the block runs."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


# -- the report ------------------------------------------------------------------------------


def report(results: dict[str, list[Burst]], args: argparse.Namespace) -> None:
    n = args.chats
    rows, summary = [], {}
    for side in results:
        runs = results[side]
        firsts = [min(run.first_texts, default=float("nan")) for run in runs]
        walls = [max(run.complete, default=float("nan")) for run in runs]
        every_first = [value for run in runs for value in run.first_texts]
        cpu = [run.cpu / n for run in runs]
        alone = [value for run in runs for value in run.alone]
        store = runs[-1].store
        summary[side] = {
            "first": bench.median(firsts),
            "wall": bench.median(walls),
            "cpu": bench.median(cpu),
            "rss": max(run.rss_mib for run in runs),
            "alone": bench.median(alone) if alone else float("nan"),
        }
        calls = Counter[str]()
        for run in runs:
            calls.update(run.calls)
        per_message = ", ".join(
            f"{method} {count / (n * len(runs)):.2f}" for method, count in sorted(calls.items())
        )
        rows.append(
            [
                side,
                " / ".join(f"{value:.2f} s" for value in firsts),
                f"{bench.percentile(every_first, 50):.2f} s",
                f"{bench.percentile(every_first, 99):.2f} s",
                " / ".join(f"{value:.2f} s" for value in walls),
                " / ".join(f"{value * 1000:.1f} ms" for value in cpu),
                f"{summary[side]['rss']:.0f} MiB",
                bench.ms(summary[side]["alone"]),
                sum(run.incomplete for run in runs),
                ", ".join(f"{k} {v / n:.1f}" for k, v in sorted(store.items())) or "-",
            ]
        )
        print(f"  {side} platform calls per message: {per_message}")
    busy = f", {args.busy} busy loops beside it" if args.busy else ""
    bench.print_table(
        f"{n} chats at once on {bench.database_label(args.db, args.db_rtt_ms)}{busy} "
        f"(each repeat: a fresh process; first/wall/CPU listed per repeat)",
        [
            "side",
            "first reply",
            "first p50",
            "first p99",
            "wall",
            "CPU / message",
            "peak RSS",
            "alone",
            "not complete",
            "store / message",
        ],
        rows,
    )
    if args.limits:
        report_limits(results, n)
        return
    kaiwa, bare = summary["kaiwa"], summary["bare"]
    bench.print_table(
        "Kaiwa against the bare bot (medians of the repeats; information only)",
        ["figure", "kaiwa", "bare", "ratio", "target", "verdict"],
        [
            figure_row("CPU per message", kaiwa["cpu"], bare["cpu"], "<= bare", 1.0, ms=True),
            [
                "first reply",
                f"{kaiwa['first']:.2f} s",
                f"{bare['first']:.2f} s",
                f"{kaiwa['first'] / bare['first']:.2f}x",
                "<= 0.5 s",
                bench.verdict(kaiwa["first"], 0.5),
            ],
            figure_row("wall", kaiwa["wall"], bare["wall"], "<= 1.1x bare", 1.1),
            [
                "peak RSS",
                f"{kaiwa['rss']:.0f} MiB",
                f"{bare['rss']:.0f} MiB",
                f"{kaiwa['rss'] / bare['rss']:.2f}x",
                "<= 110 MiB",
                bench.verdict(kaiwa["rss"], 110),
            ],
            [
                "alone, message -> first text",
                bench.ms(kaiwa["alone"]),
                bench.ms(bare["alone"]),
                f"{kaiwa['alone'] / bare['alone']:.2f}x",
                "<= 15 ms",
                bench.verdict(kaiwa["alone"], 0.015),
            ],
        ],
    )


def report_limits(results: dict[str, list[Burst]], n: int) -> None:
    floor = n * FLOOR_CALLS / BOT_CALLS_A_SECOND
    rows = []
    for side, runs in results.items():
        walls = [max(run.complete, default=float("nan")) for run in runs]
        rows.append(
            [
                side,
                " / ".join(f"{100 * run.refused / max(1, len(run.limited)):.2f} %" for run in runs),
                " / ".join(str(most_in_a_second(run.limited)) for run in runs),
                " / ".join(f"{len(run.limited) / n:.2f}" for run in runs),
                " / ".join(f"{wall / floor:.2f}x" for wall in walls),
                " / ".join(f"{bench.percentile(run.complete, 50):.2f} s" for run in runs),
            ]
        )
    bench.print_table(
        f"Against the fake's Bot API limits (floor {floor:.1f} s: {FLOOR_CALLS} calls a message, "
        f"{BOT_CALLS_A_SECOND} a second; listed per repeat)",
        ["side", "answered 429", "most in 1 s", "calls / message", "wall / floor", "complete p50"],
        rows,
    )


def figure_row(
    name: str, kaiwa: float, bare: float, target: str, ratio: float, *, ms: bool = False
) -> list[str]:
    shown = (lambda v: bench.ms(v)) if ms else (lambda v: f"{v:.2f} s")
    return [
        name,
        shown(kaiwa),
        shown(bare),
        f"{kaiwa / bare:.2f}x",
        target,
        bench.verdict(kaiwa / bare, ratio),
    ]


async def main(args: argparse.Namespace) -> None:
    sides = ("kaiwa",) if args.limits else SIDES  # the bare bot waits out no 429
    results: dict[str, list[Burst]] = {side: [] for side in sides}
    limits = ", the fake keeping the Bot API's limits" if args.limits else ""
    print(
        f"platform burst: {args.chats} Telegram chats at once, {args.repeats} repeat(s) per "
        f"side, alternating; stream of {args.chunks} chunks {args.delay_ms:g} ms apart{limits}"
    )
    with bench.fake_ollama(args.chunks, args.delay_ms) as ollama_url:
        async with FakeTelegram(limits=args.limits) as telegram:
            for repeat in range(args.repeats):
                order = sides if repeat % 2 == 0 else tuple(reversed(sides))
                for side in order:
                    results[side].append(await measure(side, telegram, ollama_url, args))
    report(results, args)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chats", type=int, default=300, help="chats in the burst")
    parser.add_argument("--repeats", type=int, default=2, help="fresh processes per side")
    parser.add_argument("--alone", type=int, default=10, help="lone messages before the burst")
    parser.add_argument("--busy", type=int, default=0, help="busy loops beside each side")
    parser.add_argument(
        "--slots", type=int, default=1, help="model requests at once, both sides (Kaiwa's default)"
    )
    parser.add_argument("--chunks", type=int, default=CHUNKS)
    parser.add_argument("--delay-ms", type=float, default=DELAY_MS)
    parser.add_argument("--limit", type=float, default=180.0, help="seconds a burst may take")
    parser.add_argument("--py-spy", default=None, help="a py-spy binary: record kaiwa's bursts")
    parser.add_argument(
        "--limits", action="store_true", help="the fake keeps the Bot API's limits (kaiwa alone)"
    )
    parser.add_argument(
        "--kaiwa-from",
        type=Path,
        default=None,
        help="run the kaiwa side from this checkout (an A/B of two commits with one bare bot)",
    )
    bench.add_database_arguments(parser)
    args = parser.parse_args()
    bench.check_database_arguments(parser, args)
    return args


if __name__ == "__main__":
    asyncio.run(main(parse()))
