"""Counts what a benchmarked `kaiwa` process asks of its database, from outside Kaiwa's code.

`benchmarks/platform_burst.py` puts this folder on the child's PYTHONPATH, so Python imports it
at start-up; Kaiwa itself never does. It counts every statement SQLAlchemy sends (a batch of rows
in one `executemany` is one) and every COMMIT, and writes the counts as JSON to the file named
by `KAIWA_BENCH_COUNTS` whenever the process gets SIGUSR1 (the benchmark sends it before and
after a burst and reads the difference).
"""

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

COUNTS = {"statements": 0, "commits": 0}
LOCK = threading.Lock()  # the store's database threads count side by side


@event.listens_for(Engine, "before_cursor_execute")
def _statement(*_: Any) -> None:
    with LOCK:
        COUNTS["statements"] += 1


@event.listens_for(Engine, "commit")
def _commit(*_: Any) -> None:
    with LOCK:
        COUNTS["commits"] += 1


def _write(*_: Any) -> None:
    with LOCK:
        counted = dict(COUNTS)
    Path(os.environ["KAIWA_BENCH_COUNTS"]).write_text(json.dumps(counted))


if "KAIWA_BENCH_COUNTS" in os.environ:
    signal.signal(signal.SIGUSR1, _write)
