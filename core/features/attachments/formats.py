"""What Kaiwa reads of the files people attach and within which caps (`[documents]` in config),
apart from the reader.

The dispatcher screens every attachment before anything is downloaded (a type Kaiwa cannot
read, a file past its cap), and the config is read at every start, while the reader
(`documents.py`) loads pypdf and python-docx (with lxml), some tens of MiB: kept here, the
screening and the caps cost a start and a plain message nothing of that.
"""

import html
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from core.text import size_in_words

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


READS = "PDF, DOCX and text files (plain text, Markdown, CSV, JSON, source code)"
PDF_TYPES = frozenset({"application/pdf", "application/x-pdf"})
DOCX_TYPE = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
NOT_DOCUMENTS = ("image/", "audio/", "video/")
"""Media types that are not documents whatever the name says (a .ts that is video/mp2t)."""
TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/ld+json",
        "application/x-ndjson",
        "application/xml",
        "application/xhtml+xml",
        "application/yaml",
        "application/x-yaml",
        "application/toml",
        "application/javascript",
        "application/x-javascript",
        "application/typescript",
        "application/x-sh",
        "application/x-python",
        "application/sql",
        "application/csv",
    }
)
TEXT_FILES = {
    "prose and markup": ".txt .text .md .markdown .rst .adoc .org .tex .bib .html .htm .xml "
    ".srt .vtt .log",
    "data and configuration": ".csv .tsv .json .jsonl .ndjson .geojson .ipynb .yaml .yml .toml "
    ".ini .cfg .conf .properties .diff .patch",
    "source code": ".py .pyi .js .mjs .cjs .ts .tsx .jsx .go .rs .java .kt .kts .c .h .cc .cpp "
    ".cxx .hpp .hh .cs .fs .rb .php .sh .bash .zsh .fish .ps1 .bat .sql .swift .scala .lua .r "
    ".pl .pm .m .mm .css .scss .sass .less .vue .svelte .dart .ex .exs .erl .hs .clj .elm .zig "
    ".nim .jl .proto .graphql .gql .tf .hcl .gradle .cmake .dockerfile",
}
"""The extensions read as text, by what they are."""
TEXT_EXTENSIONS = frozenset(suffix for group in TEXT_FILES.values() for suffix in group.split())
TEXT_NAMES = frozenset(
    {
        "makefile",
        "dockerfile",
        "containerfile",
        "gemfile",
        "rakefile",
        "procfile",
        "vagrantfile",
        "jenkinsfile",
        "readme",
        "license",
        "changelog",
        ".gitignore",
        ".dockerignore",
        ".editorconfig",
    }
)
"""Files known by their whole name, having no extension."""
SAVE_AS = {
    **dict.fromkeys((".xlsx", ".xls", ".ods", ".numbers"), "save it as CSV and send that"),
    **dict.fromkeys((".doc", ".odt", ".rtf", ".pages"), "save it as DOCX or PDF and send that"),
    **dict.fromkeys((".pptx", ".ppt", ".odp", ".key"), "save it as PDF and send that"),
}
"""The fix for a kind of file Kaiwa cannot read, where there is a usual one."""


@dataclass(frozen=True)
class Document:
    name: str
    kind: str
    """What it was read as: "pdf", "docx" or "text"."""
    text: str
    pages: int | None
    """A PDF's pages, all of them (not only those read); None for other kinds."""
    cut: str | None
    """What was left out, in plain words ("read 100 of 240 pages"), or None."""


DELIMITER = re.compile(r"<(?=\s*/?\s*document\b)", re.IGNORECASE)
"""A `<` opening what would read as the block's own tag, `<document` or `</document`."""


def document_block(document: Document) -> str:
    """The document as the model reads it: its text between `<document name=... kind=...>` and
    `</document>`, with what was cut said on its own line before the end. The text cannot end
    the block early: every `<` in it that begins `document` or `/document` (any case, spaces
    allowed) is followed by a backslash (`<\\/document>`), so the block's last line is the only
    tag that closes it and no line inside can open another. The name is escaped as an XML
    attribute."""
    attributes = f'name="{html.escape(document.name)}" kind="{document.kind}"'
    if document.pages is not None:
        attributes += f' pages="{document.pages}"'
    lines = [f"<document {attributes}>", DELIMITER.sub("<\\\\", document.text.rstrip("\n"))]
    if document.cut:
        lines.append(f"[cut: {document.cut}]")
    lines.append("</document>")
    return "\n".join(lines)


class Unreadable(Exception):
    """A document Kaiwa will not or cannot read; the message, for the person, names the file."""


def kind_of(name: str, media_type: str | None) -> str | None:
    """What `read_document` reads the file as, "pdf", "docx" or "text", or None for what it
    cannot read. The name's extension decides, and the media type where the name does not (no
    extension, or one not known here); images, audio and video are None whatever their name:
    they are not documents."""
    media = (media_type or "").split(";")[0].strip().lower()
    if media.startswith(NOT_DOCUMENTS):
        return None
    base = PurePosixPath(name.replace("\\", "/")).name.lower()
    suffix = PurePosixPath(base).suffix
    if suffix == ".pdf":
        return "pdf"
    if suffix == ".docx":
        return "docx"
    if suffix in TEXT_EXTENSIONS or base in TEXT_NAMES:
        return "text"
    if media in PDF_TYPES:
        return "pdf"
    if media == DOCX_TYPE:
        return "docx"
    if media.startswith("text/") or media in TEXT_TYPES or media.endswith(("+json", "+xml")):
        return "text"
    return None


def check_size(name: str, size: int, limits: DocumentLimits) -> None:
    """`Unreadable` when a file of `size` bytes is past `max_bytes`: for a caller that knows a
    file's size before downloading it, in the same words `read_document` uses."""
    if size > limits.max_bytes:
        raise Unreadable(
            f"{name} is {size_in_words(size)}; Kaiwa reads documents up to "
            f"{size_in_words(limits.max_bytes)} ([documents].max_bytes)"
        )


def cannot_read(name: str, media_type: str | None) -> str:
    suffix = PurePosixPath(name.replace("\\", "/")).suffix.lower()
    if suffix:
        what = f"{suffix} files"
    elif media_type:
        what = f"{name} ({media_type.split(';')[0].strip()})"
    else:
        what = f"{name}: it has no extension that says what it is"
    fix = SAVE_AS.get(suffix)
    return f"Kaiwa cannot read {what}; it reads {READS}" + (f". To send it, {fix}" if fix else "")
