"""Documents read in a process of their own, with a memory cap and a deadline.

A document is a stranger's bytes, and pypdf keeps what it inflates until a read ends
(documents.py): a hostile PDF can hold hundreds of MiB, or a pathological one minutes of CPU,
and in Kaiwa's own process that would be every conversation's memory and event loop. So each
read runs in a child (`python -m core.features.attachments.apart`), which may take
`READ_MEMORY` of address space more than it starts with and `READ_SECONDS` in all: past either
it is gone, and the person hears that the file was too heavy to read, never a Kaiwa that
stalls or dies. Kaiwa's own process never imports pypdf or python-docx.

One child per read, started fresh: nothing a hostile file left in memory outlives it, reads run
side by side, and a `/stop` kills the one it stops. A start costs a Python start and the
reader's imports (about 0.4 s, measured in benchmarks/document_extraction.py), which a person
sending a document waits once beside the model's answer; a plain message never meets any of it.
The child's environment names nothing of Kaiwa's (no secret reaches it), and what it sends back
is JSON, not pickle: a parser a hostile file took over can say wrong words, never run code here.

The wire: the parent writes one JSON line (name, media type, limits) and then the file's bytes,
and closes; the child writes one JSON line, `{"document": {...}}` or `{"unreadable": "..."}`.
"""

import asyncio
import json
import os
import resource
import sys
from dataclasses import asdict
from typing import Any

from core.features.attachments.formats import MIB, Document, DocumentLimits, Unreadable

READ_MEMORY = 768 * MIB
"""Address space a read may take beyond what its process has once the reader is imported."""
READ_SECONDS = 60.0
"""Seconds a read may take, the child's start included."""
ANSWER_BYTES = 64 * MIB
"""The most a child's answer may be: a document's text is capped far below (`max_chars`)."""


async def read_apart(
    name: str, data: bytes, media_type: str | None, limits: DocumentLimits
) -> Document:
    """`read_document` in a child process: the same `Document`, or an `Unreadable` with why,
    also for a file that needs more than `READ_MEMORY` or `READ_SECONDS`. A cancellation (a
    `/stop`) kills the child."""
    header = json.dumps({"name": name, "media_type": media_type, "limits": asdict(limits)})
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        __name__,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env=_child_environment(),
        limit=ANSWER_BYTES,
    )
    try:
        async with asyncio.timeout(READ_SECONDS):
            out, _ = await child.communicate(header.encode() + b"\n" + data)
    except TimeoutError:
        raise Unreadable(
            f"{name} took longer than {READ_SECONDS:.0f} s to read, so Kaiwa stopped reading it: "
            "send a smaller or simpler file, or paste the part that matters as text"
        ) from None
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    answer = _answer_of(out)
    if answer is None:
        raise Unreadable(_too_heavy(name))
    if "unreadable" in answer:
        raise Unreadable(str(answer["unreadable"]))
    return Document(**answer["document"])


def _child_environment() -> dict[str, str]:
    """What the child needs to find Python and Kaiwa's code, and nothing else of Kaiwa's
    environment (where its secrets are)."""
    return {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": os.pathsep.join(path for path in sys.path if path),
        "PYTHONIOENCODING": "utf-8",
    }


def _answer_of(out: bytes) -> dict[str, Any] | None:
    """The child's answer, or None for a child that died first (out of memory: the kernel, or
    an allocation that failed inside a C library)."""
    try:
        answer = json.loads(out)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def _too_heavy(name: str) -> str:
    return (
        f"{name} needs more than the {READ_MEMORY // MIB} MB of memory Kaiwa gives a document, "
        "so it was not read: send a smaller or simpler file, or paste the part that matters"
    )


def _serve() -> None:
    """The child: read one request from stdin, answer one line on stdout."""
    from core.features.attachments.documents import read_document

    _cap_memory(READ_MEMORY)
    header, _, data = sys.stdin.buffer.read().partition(b"\n")
    request = json.loads(header)
    name = request["name"]
    try:
        document = read_document(
            name, data, request["media_type"], DocumentLimits(**request["limits"])
        )
        answer: dict[str, Any] = {"document": asdict(document)}
    except Unreadable as exc:
        answer = {"unreadable": str(exc)}
    except MemoryError:
        answer = {"unreadable": _too_heavy(name)}
    sys.stdout.write(json.dumps(answer))
    sys.stdout.flush()


def _cap_memory(allowance: int) -> None:
    """Limit this process's address space to what it has now plus `allowance` (Linux; where
    /proc is missing, the deadline alone holds)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[0])
    except (OSError, ValueError, IndexError):
        return
    limit = pages * os.sysconf("SC_PAGE_SIZE") + allowance
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


if __name__ == "__main__":
    _serve()
