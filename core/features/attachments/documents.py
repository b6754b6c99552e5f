"""Documents people attach, read as text: PDF (pypdf), DOCX (python-docx) and text-like files.

It is pure and synchronous, bytes in and a `Document` or an `Unreadable` out: pypdf and
python-docx are blocking pure Python, so the caller runs `read_document` in a thread, after a
download it capped at `DocumentLimits.max_bytes` (`check_size` says the same words before one).

Every cap is said, never silent: `Document.cut` tells, in words for the person and the model
alike, what was left out ("read 100 of 240 pages"). And every refusal is an `Unreadable` whose
message names the file, what is wrong and, where there is one, the fix.

The bytes are a stranger's, so nothing in them may grow past a limit:
- a PDF's streams inflate only as far as pypdf's own limits (75 MB a stream by default), and at
  most `max_pages` pages are read, stopping early once `max_chars` characters are in hand. pypdf
  keeps what it inflated until the read ends, so a hostile PDF can still hold up to that much for
  every page read: only the limits of the process reading it bound that;
- a DOCX is a zip, refused before anything is inflated when its directory declares more than
  `MAX_DOCX_PARTS` files or more than `max_unpacked` bytes. Declared sizes can lie, and
  python-docx's reading would inflate a lying file whole before cutting it to size, so the files
  are inflated here first, a chunk at a time and none past its declared size, and python-docx
  opens that copy (`_unpacked` says how). Its XML parser resolves no entities, so no entity can
  expand either;
- a text file is decoded as it is, its size already capped by `max_bytes`.

Text is decoded by its byte order mark (UTF-8, UTF-16, UTF-32) or, without one, as UTF-8. Bytes
with a NUL and no mark are binary posing as text (a UTF-16 file without its mark is refused too:
nothing tells its byte order). Invalid UTF-8 is shown as U+FFFD and said in `cut` ("12 characters
were not UTF-8 ..."): a person's Latin-1 CSV is still worth reading, and they learn how to fix it.
HTML and XML are read as the text they are: a person attaching markup asks about the markup.
"""

import codecs
import io
import re
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import docx
import pypdf
from docx.document import Document as WordDocument
from docx.table import Table, _Cell, _Row
from docx.text.paragraph import Paragraph

from core.features.attachments.formats import (
    Document,
    DocumentLimits,
    Unreadable,
    cannot_read,
    check_size,
    kind_of,
)
from core.text import size_in_words

MAX_DOCX_PARTS = 10_000
"""Files inside a DOCX at most: Word writes a few dozen, a few hundred with many pictures."""
DETAIL_CHARS = 200
"""Characters of a library's own error kept in a refusal."""
UNZIP_CHUNK = 1 << 20
"""Bytes of a DOCX's file inflated at a time."""
OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
"""How an old Word file (.doc) begins, and a password-protected DOCX too: both are OLE files."""

BOMS = (
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF32_LE, "utf-32"),  # before UTF-16's: it begins with the same two bytes
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
HEADING = re.compile(r"Heading ([1-9])")


def read_document(
    name: str, data: bytes, media_type: str | None, limits: DocumentLimits
) -> Document:
    """The text of the file `name` (its bytes `data`), within `limits`; `Unreadable` when there
    is none to read, with why."""
    kind = kind_of(name, media_type)
    if kind is None:
        raise Unreadable(cannot_read(name, media_type))
    check_size(name, len(data), limits)
    return READERS[kind](name, data, limits)


# -- PDF ----------------------------------------------------------------------------------------


def _read_pdf(name: str, data: bytes, limits: DocumentLimits) -> Document:
    """Pages in order, each after a `--- page N ---` line, so "what does page 3 say" finds it.
    Pages stop at `max_pages`, and early once the text passes `max_chars`."""
    with _parsing(name, "a PDF"):
        reader = pypdf.PdfReader(io.BytesIO(data))
        _unlock(name, reader)
        total = len(reader.pages)
        pages: list[str] = []
        found_text, length = False, -2  # no separator before the first page
        for number in range(1, min(total, limits.max_pages) + 1):
            text = reader.pages[number - 1].extract_text().strip()
            found_text = found_text or bool(text)
            pages.append(f"--- page {number} ---\n{text}")
            length += len(pages[-1]) + 2
            if length > limits.max_chars:
                break
    if not found_text:
        raise Unreadable(_no_pdf_text(name, total))
    text = "\n\n".join(pages)
    cut = None
    if len(text) > limits.max_chars:
        text = text[: limits.max_chars]
        cut = (
            f"kept the first {limits.max_chars:,} characters, which stop in page {len(pages)} "
            f"of {total}"
        )
    elif len(pages) < total:
        cut = f"read {len(pages)} of {total} pages"
    return Document(name, "pdf", text, total, cut)


def _unlock(name: str, reader: pypdf.PdfReader) -> None:
    """Open an encrypted PDF with the empty password, which many carry (their encryption only
    restricts printing or copying); `Unreadable` when it needs a real one."""
    if reader.is_encrypted and reader.decrypt("") == pypdf.PasswordType.NOT_DECRYPTED:
        raise Unreadable(
            f"{name} is protected by a password, which Kaiwa does not have. Send a copy "
            "without the password (for example, printed to a new PDF)"
        )


def _no_pdf_text(name: str, pages: int) -> str:
    if pages == 0:
        return f"{name} has no pages to read"
    return (
        f"{name} has no text to read: its pages are scanned images. Send it as text, or run "
        "OCR on it first"
    )


# -- DOCX ---------------------------------------------------------------------------------------


def _read_docx(name: str, data: bytes, limits: DocumentLimits) -> Document:
    """Paragraphs and tables in order: a heading after `#`s by its level, a list item after
    `- `, a table a row a line, its cells between ` | `."""
    if data.startswith(OLE_MAGIC):
        raise Unreadable(
            f"{name} is not a DOCX inside: it is protected by a password, or it is an older "
            "Word file (.doc). Send a copy without the password, or save it again as DOCX"
        )
    with _parsing(name, "a Word document (DOCX)"):
        unpacked = _unpacked(name, data, limits)
        text = "\n\n".join(_blocks(docx.Document(io.BytesIO(unpacked))))
    if not text.strip():
        raise Unreadable(f"{name} has no text to read: it is empty, or holds only pictures")
    return _within_chars(name, "docx", text, limits)


def _unpacked(name: str, data: bytes, limits: DocumentLimits) -> bytes:
    """The DOCX's files, inflated, in a zip that stores them as they are, for python-docx to
    open. The zip is refused before anything is inflated when its directory declares too many
    files, or more than `max_unpacked` bytes in all. That sum binds what inflates only if it is
    read the right way: `zipfile` ends each file at its declared size (a lying one then fails
    its checksum, refused as damaged), but `ZipFile.read`, which python-docx calls, inflates
    all of a file before cutting it to that size, so a file declared at 1 KB would still
    inflate in memory as far as it goes (200 MB from 200 KB, 20 GB from 20 MB). Inflated here
    a chunk at a time instead, no file grows past its declared size nor any step past a chunk,
    and the copy stays within the sum checked."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        entries = [entry for entry in archive.infolist() if not entry.is_dir()]
        if len(entries) > MAX_DOCX_PARTS:
            raise Unreadable(
                f"{name} holds {len(entries):,} files inside, where a Word document holds a few "
                f"dozen; Kaiwa opens a DOCX of at most {MAX_DOCX_PARTS:,}"
            )
        declared = sum(entry.file_size for entry in entries)
        if declared > limits.max_unpacked:
            raise Unreadable(
                f"{name} unpacks to more than {size_in_words(limits.max_unpacked)} "
                f"({size_in_words(declared)} from {size_in_words(len(data))}), past what Kaiwa "
                "unpacks ([documents].max_unpacked)"
            )
        copied, names = io.BytesIO(), set()
        with zipfile.ZipFile(copied, "w", zipfile.ZIP_STORED) as stored:
            for entry in entries:
                if entry.filename in names:
                    continue  # a name twice: python-docx would read one; the first it is
                names.add(entry.filename)
                with archive.open(entry) as source, stored.open(entry.filename, "w") as target:
                    while chunk := source.read(UNZIP_CHUNK):
                        target.write(chunk)
    return copied.getvalue()


def _blocks(document: WordDocument) -> Iterator[str]:
    for block in document.iter_inner_content():
        if isinstance(block, Table):
            yield "\n".join(" | ".join(_cell_texts(row)) for row in block.rows)
        elif text := block.text.strip():
            yield _marked(block, text)


def _marked(paragraph: Paragraph, text: str) -> str:
    style = (paragraph.style.name if paragraph.style is not None else None) or ""
    if heading := HEADING.fullmatch(style):
        return f"{'#' * int(heading.group(1))} {text}"
    if style == "Title":
        return f"# {text}"
    if style.startswith("List"):
        return f"- {text}"
    return text


def _cell_texts(row: _Row) -> Iterator[str]:
    """Each cell's text on one line; a cell merged across columns once (python-docx gives the
    same cell for each column it spans)."""
    previous: _Cell | None = None
    for cell in row.cells:
        if cell is not previous:
            yield " ".join(cell.text.split())
        previous = cell


# -- text ---------------------------------------------------------------------------------------


def _read_text(name: str, data: bytes, limits: DocumentLimits) -> Document:
    text, encoding, replaced = _decoded(name, data)
    if not text.strip():
        raise Unreadable(f"{name} is empty: there is no text in it to read")
    note = None
    if replaced:
        were, show, them = ("was", "shows", "it") if replaced == 1 else ("were", "show", "them")
        note = (
            f"{replaced:,} character{'s' * (replaced != 1)} {were} not {encoding} and {show} as "
            f"\N{REPLACEMENT CHARACTER}; save the file as UTF-8 to keep {them}"
        )
    return _within_chars(name, "text", text, limits, note)


def _decoded(name: str, data: bytes) -> tuple[str, str, int]:
    """The text, the encoding it was read in ("UTF-16"), and how many places in it could not
    be decoded (shown as U+FFFD)."""
    for mark, encoding in BOMS:
        if data.startswith(mark):
            return _decoded_as(data, encoding)
    if b"\x00" in data:
        raise Unreadable(
            f"{name} is not text: it holds binary data, which no text file has. If it is a "
            "document, send it as a PDF, a DOCX or a text file"
        )
    return _decoded_as(data, "utf-8")


def _decoded_as(data: bytes, encoding: str) -> tuple[str, str, int]:
    label = encoding.upper().removesuffix("-SIG")
    try:
        return data.decode(encoding), label, 0
    except UnicodeDecodeError:
        text = data.decode(encoding, errors="replace")
        return text, label, text.count("\N{REPLACEMENT CHARACTER}")


# -- shared -------------------------------------------------------------------------------------


def _within_chars(
    name: str, kind: str, text: str, limits: DocumentLimits, note: str | None = None
) -> Document:
    """A document of `text` cut at `max_chars`, the cut said after `note`."""
    notes = [note] if note else []
    if len(text) > limits.max_chars:
        notes.append(f"kept the first {limits.max_chars:,} of {len(text):,} characters")
        text = text[: limits.max_chars]
    return Document(name, kind, text, None, "; ".join(notes) or None)


@contextmanager
def _parsing(name: str, what: str) -> Iterator[None]:
    """A library's failure on the file as `Unreadable`. pypdf and python-docx parse a stranger's
    bytes, and a damaged file can fail anywhere inside them with any exception, so any is
    caught here, around their calls alone."""
    try:
        yield
    except Unreadable:
        raise
    except Exception as exc:
        detail = (str(exc) or type(exc).__name__).splitlines()[0][:DETAIL_CHARS]
        raise Unreadable(f"{name} could not be read as {what}: {detail}") from exc


READERS: dict[str, Callable[[str, bytes, DocumentLimits], Document]] = {
    "pdf": _read_pdf,
    "docx": _read_docx,
    "text": _read_text,
}
