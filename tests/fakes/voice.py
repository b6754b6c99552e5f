"""Voice notes for tests and benchmarks: words spoken by espeak-ng, encoded as Telegram sends them.

A Telegram voice note (and a Discord voice message) is an OGG file holding one Opus stream,
mono, at 48 kHz. `spoken_note` makes one with Debian's tools, never with Kaiwa's code: espeak-ng
speaks the text into a WAV file and ffmpeg encodes it with libopus (its VoIP mode, 32 kb/s),
padded with silence to `seconds` when asked (or cut there, if the words take longer). Each note
is made once per (text, seconds) and kept in the temporary directory, since the tests and the
benchmark's rounds ask for the same few; it is written beside its final name and renamed, so
parallel test workers never read half of one.
"""

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

TOOLS = ("espeak-ng", "ffmpeg")
"""The commands a note needs; each comes in the Debian package of the same name."""
CACHE = Path(tempfile.gettempdir()) / "kaiwa-voice-notes"
RECIPE = "espeak-ng wav | ffmpeg libopus voip 32k mono 48k ogg, v1"
"""Part of every cached note's key: a change of how notes are made changes it."""


class MissingTool(RuntimeError):
    """espeak-ng or ffmpeg is not installed."""


def spoken_note(text: str, *, seconds: float | None = None) -> bytes:
    """`text` spoken as an OGG Opus voice note, `seconds` long if given."""
    key = hashlib.sha256(repr((RECIPE, text, seconds)).encode()).hexdigest()[:24]
    path = CACHE / f"{key}.ogg"
    if not path.exists():
        _make(text, seconds, path)
    return path.read_bytes()


def _make(text: str, seconds: float | None, path: Path) -> None:
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise MissingTool(
            f"voice notes are made with espeak-ng and ffmpeg; missing: {', '.join(missing)} "
            f"(Debian: apt-get install {' '.join(missing)})"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as work:
        speech, note = Path(work) / "speech.wav", Path(work) / "note.ogg"
        _run(["espeak-ng", "-w", str(speech), "--", text])
        length = [] if seconds is None else ["-af", "apad", "-t", f"{seconds:g}"]
        opus = ["-ac", "1", "-ar", "48000", "-c:a", "libopus", "-b:a", "32k", "-application"]
        source = ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-i", str(speech)]
        _run([*source, *length, *opus, "voip", "-f", "ogg", "-y", str(note)])
        os.replace(note, path)


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{command[0]} failed ({done.returncode}): {done.stderr.strip()}")
