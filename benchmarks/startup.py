"""Start-up: `kaiwa --help`, and process start → ready on the terminal channel.

(a) `kaiwa --help`: the installed console script next to this Python, to exit.
(b) `kaiwa --config <tmp>/config.toml` with stdin and stdout pipes, [ollama].url at a fake Ollama
    in its own process and [storage].data_dir in a temporary folder: from process start until
    the ready banner ("Kaiwa is ready ...") appears on stdout. That span covers the imports, the
    config check, the log set-up, the model check against the fake (GET /api/tags) and opening
    the store (migrations checked). Then stdin is closed (end of input shuts Kaiwa down) and the
    exit is awaited; the shutdown time is printed for information.
Baseline: `python -c pass` with the same interpreter, measured in the same run. The three commands
alternate run by run, after one unmeasured warm-up each (which also creates the database, so the
measured runs are restarts, the common case).

Targets: ≤ 0.3 s for --help, ≤ 1 s to ready (anchor: 1.2 s and 3.2 s).

Run from the repository root:
    .venv/bin/python benchmarks/startup.py [--runs 10]
or  .venv/bin/python -m benchmarks.startup
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import os
import subprocess
import tempfile
import time

from benchmarks import _common as bench  # clears the proxy variables

KAIWA = Path(sys.executable).parent / "kaiwa"
TARGET_HELP, TARGET_READY = 0.3, 1.0
READY_MARKER = b"Kaiwa is ready"
LIMIT = 60.0
CONFIG = """\
[ollama]
url = "{url}"

[storage]
data_dir = "{data_dir}"

[agents.assistant]
model = "test-model"
"""


def child_env() -> dict[str, str]:
    """The cleaned environment, without variables that would point Kaiwa elsewhere."""
    env = dict(os.environ)
    for name in ("KAIWA_CONFIG", "KAIWA_DATABASE_URL"):
        env.pop(name, None)
    return env


def time_to_exit(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, check=True, timeout=LIMIT, env=child_env())
    return time.perf_counter() - started


def time_to_ready(config: Path) -> tuple[float, float]:
    """Seconds from start to the ready banner, and from closing stdin to the exit."""
    started = time.perf_counter()
    process = subprocess.Popen(
        [str(KAIWA), "--config", str(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
    )
    try:
        bench.read_line_containing(process, READY_MARKER, LIMIT)
        ready = time.perf_counter() - started
        closing = time.perf_counter()
        _, errors = process.communicate(timeout=LIMIT)  # closes stdin: end of input
        stopped = time.perf_counter() - closing
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    if process.returncode != 0:
        raise RuntimeError(f"kaiwa exited {process.returncode}: {errors.decode()[-2000:]}")
    return ready, stopped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=10, help="measured runs of each command")
    args = parser.parse_args()
    print(f"start-up: {args.runs} runs of each command, alternating, after one warm-up each")
    print(f"kaiwa: {KAIWA}")
    baseline = [sys.executable, "-c", "pass"]
    times: dict[str, list[float]] = {"pass": [], "help": [], "ready": [], "shutdown": []}
    with tempfile.TemporaryDirectory(prefix="kaiwa-bench-") as tmp, bench.fake_ollama(1, 0) as url:
        config = Path(tmp) / "config.toml"
        config.write_text(CONFIG.format(url=url, data_dir=Path(tmp) / "data"))
        for run in range(args.runs + 1):
            python_pass = time_to_exit(baseline)
            kaiwa_help = time_to_exit([str(KAIWA), "--help"])
            ready, shutdown = time_to_ready(config)
            if run:  # run 0 is the warm-up
                times["pass"].append(python_pass)
                times["help"].append(kaiwa_help)
                times["ready"].append(ready)
                times["shutdown"].append(shutdown)

    base = bench.median(times["pass"])
    rows = []
    for label, key in (
        ("python -c pass (baseline)", "pass"),
        ("kaiwa --help", "help"),
        ("kaiwa start -> ready", "ready"),
        ("kaiwa stdin closed -> exit (info)", "shutdown"),
    ):
        values = times[key]
        ratio = f"{bench.median(values) / base:.1f}x" if key != "shutdown" else ""
        rows.append((label, len(values), bench.ms(bench.median(values)),
                     bench.ms(max(values)), ratio))  # fmt: skip
    bench.print_table("Wall time", ("command", "n", "median", "max", "/ baseline"), rows)
    help_time, ready_time = bench.median(times["help"]), bench.median(times["ready"])
    bench.print_table(
        "Targets (anchor: 1.2 s and 3.2 s)",
        ("figure", "value", "target", "verdict"),
        [
            ("kaiwa --help, median", f"{help_time:.3f} s", f"<= {TARGET_HELP} s",
             bench.verdict(help_time, TARGET_HELP)),
            ("start -> ready, median", f"{ready_time:.3f} s", f"<= {TARGET_READY} s",
             bench.verdict(ready_time, TARGET_READY)),
        ],
    )  # fmt: skip


if __name__ == "__main__":
    main()
