"""Document extraction: a 100-page PDF read as text, its time and peak memory, beside pypdf's own.

The PDF is made at the start by fpdf2 (a test dependency: run with the `.[test]` extras): 100
pages of about 2,700 characters of prose each, like a report's (`--pages`, `--seed`). Sides, on
the same bytes, in one run:
- `pypdf alone` (the baseline): `PdfReader` on the bytes and `extract_text` of every page,
  joined; the library's own work, what any reader of this PDF pays;
- `Kaiwa, every page`: `read_document` with `max_chars` raised past the PDF's length, so it
  reads all 100 pages as the baseline does; its ratio to the baseline is Kaiwa's own cost
  (page markers, caps, the checks), which should be close to 1;
- `Kaiwa, defaults`: `read_document` with `DocumentLimits()` as they are, which stops at
  `max_chars` (60,000 characters, about page 23): the reading Kaiwa does as shipped;
- `Kaiwa as shipped, apart`: the same read as a turn makes it, `read_apart`, in a process of
  its own (a Python start, the reader's imports, the read, its answer as JSON): what a person
  sending such a PDF waits for, and its cost over `Kaiwa, defaults` is the isolation's;
- `pypdf opening`: `PdfReader` and the page count, no text, for information: the floor.

Time: the sides alternate round by round (`--rounds`, after one warm-up each), and the table
gives each side's median and fastest round and its ratio to the baseline's median. Memory, in a
second pass: tracemalloc's peak during one read of each side (Python's allocations, where
pypdf, pure Python, does its work), and each side's peak RSS growth in a fresh child process of
its own (this script with `--child`: its resident size just before the read, against the peak
after it, so the imports are not counted), which is what the machine sees; for the side read
apart, also the reading process's own peak RSS (imports included: it is all that process), while
Kaiwa's process itself grows by almost nothing.

Run from the repository root:
    .venv/bin/python benchmarks/document_extraction.py [--rounds 7] [--pages 100]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import asyncio
import io
import json
import random
import resource
import subprocess
import tempfile
import time
import tracemalloc
from collections.abc import Callable

import pypdf
from fpdf import FPDF

from benchmarks import _common as bench
from core.features.attachments.apart import read_apart
from core.features.attachments.documents import read_document
from core.features.attachments.formats import MIB, DocumentLimits

VOCABULARY = (
    "the budget quarter revenue growth team project customer report section figure table risk "
    "plan market cost review update delivery schedule result analysis we our they will should "
    "increase decrease remain stable across region product service support contract partner "
    "in of to for with on by from and or but as at this that these those which"
)
"""What the pages say, in random order."""
LINES_PER_PAGE, WORDS_PER_LINE = 45, 10
BASELINE = "pypdf alone"
EVERY_PAGE = DocumentLimits(max_chars=10**9)
SIDES: dict[str, Callable[[bytes], object]] = {
    BASELINE: lambda data: "\n".join(
        page.extract_text() for page in pypdf.PdfReader(io.BytesIO(data)).pages
    ),
    "Kaiwa, every page": lambda data: read_document("report.pdf", data, None, EVERY_PAGE),
    "Kaiwa, defaults": lambda data: read_document("report.pdf", data, None, DocumentLimits()),
    "Kaiwa as shipped, apart": lambda data: asyncio.run(
        read_apart("report.pdf", data, None, DocumentLimits())
    ),
    "pypdf opening": lambda data: len(pypdf.PdfReader(io.BytesIO(data)).pages),
}


def report_pdf(pages: int, seed: int) -> bytes:
    """`pages` pages of prose-like text, the same for the same seed."""
    words, vocabulary = random.Random(seed), VOCABULARY.split()
    document = FPDF()
    document.set_font("helvetica", size=10)
    for number in range(1, pages + 1):
        document.add_page()
        document.cell(0, 8, f"Section {number}", new_x="LMARGIN", new_y="NEXT")
        lines = (
            " ".join(words.choices(vocabulary, k=WORDS_PER_LINE)) for _ in range(LINES_PER_PAGE)
        )
        document.multi_cell(0, 5, "\n".join(lines).capitalize())
    return bytes(document.output())


def timed_rounds(data: bytes, rounds: int) -> dict[str, list[float]]:
    """Seconds of each side's read, the sides alternating, their order turned every round."""
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    for read in SIDES.values():
        read(data)
    order = list(SIDES)
    for index in range(rounds):
        for side in reversed(order) if index % 2 else order:
            started = time.perf_counter()
            SIDES[side](data)
            times[side].append(time.perf_counter() - started)
    return times


def traced_peak(data: bytes, side: str) -> int:
    """Bytes tracemalloc saw held at most during one read, above what was held before."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        SIDES[side](data)
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def rss_growth(path: Path, side: str) -> tuple[float, float]:
    """MiB a fresh process's peak RSS grew by during one read of `side`, and the peak RSS of
    the process it read in, if it started one (0 if not)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--child", side, str(path)]
    finished = subprocess.run(command, capture_output=True, check=True, timeout=600)
    grown = json.loads(finished.stdout)
    return grown["grew_mib"], grown["reader_mib"]


def child(side: str, path: Path) -> None:
    data = path.read_bytes()
    before = bench.current_rss_mib()
    SIDES[side](data)
    reader = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"grew_mib": bench.peak_rss_mib() - before, "reader_mib": reader}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=7, help="measured reads per side")
    parser.add_argument("--pages", type=int, default=100, help="pages of the PDF")
    parser.add_argument("--seed", type=int, default=35, help="what the pages say")
    parser.add_argument("--child", nargs=2, metavar=("SIDE", "PDF"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]))
        return
    data = report_pdf(args.pages, args.seed)
    every = read_document("report.pdf", data, None, EVERY_PAGE)
    defaults = read_document("report.pdf", data, None, DocumentLimits())
    print(
        f"a {args.pages}-page PDF of {len(data) / 1024:.0f} KB: {len(every.text):,} characters "
        f"in all; with the defaults, {len(defaults.text):,} kept ({defaults.cut})"
    )
    times = timed_rounds(data, args.rounds)
    with tempfile.TemporaryDirectory(prefix="kaiwa-bench-") as folder:
        path = Path(folder) / "report.pdf"
        path.write_bytes(data)
        grown = {side: rss_growth(path, side) for side in SIDES}
    traced = {side: traced_peak(data, side) for side in SIDES}
    base = bench.median(times[BASELINE])
    rows = [
        [
            side,
            bench.ms(bench.median(times[side])),
            bench.ms(min(times[side])),
            f"{bench.median(times[side]) / base:.3f}x",
            f"{traced[side] / MIB:.1f} MiB",
            f"{grown[side][0]:.1f} MiB",
            f"{grown[side][1]:.1f} MiB" if grown[side][1] else "-",
        ]
        for side in SIDES
    ]
    bench.print_table(
        f"document extraction: {args.rounds} reads per side, alternating (after one warm-up)",
        [
            "side",
            "median",
            "fastest",
            "vs pypdf alone",
            "tracemalloc peak",
            "peak RSS growth",
            "reader's peak RSS",
        ],
        rows,
    )
    kaiwa = bench.median(times["Kaiwa, every page"])
    print(
        f"  Kaiwa's own cost over pypdf, every page read   {(kaiwa - base) * 1e3:+8.2f} ms  "
        f"{kaiwa / base - 1:+8.2%}   (info)"
    )
    shipped, apart = (
        bench.median(times["Kaiwa, defaults"]),
        bench.median(times["Kaiwa as shipped, apart"]),
    )
    print(
        f"  reading apart, over reading in process         {(apart - shipped) * 1e3:+8.2f} ms  "
        f"{apart / shipped - 1:+8.2%}   (info: the isolation's cost)"
    )


if __name__ == "__main__":
    main()
