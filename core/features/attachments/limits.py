"""The caps on documents people attach (`[documents]` in config), apart from the reader.

The config is read at every start, and the reader (`documents.py`) loads pypdf and
python-docx (with lxml), some tens of MiB: kept here, the caps cost a start nothing of that.
"""

from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True)
class DocumentLimits:
    max_bytes: int = 20 * MIB
    """Bytes of a file downloaded and read at most; a larger one is refused."""
    max_pages: int = 100
    """Pages of a PDF read at most; the rest are left out, and that is said."""
    max_chars: int = 60_000
    """Characters of a document's text kept at most; the rest is left out, and that is said."""
    max_unpacked: int = 50 * MIB
    """Bytes a DOCX (a zip) may unpack to; one declaring more is refused before unpacking."""
