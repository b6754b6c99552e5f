"""What a person's message brings beside its words: pictures and files, what is taken of them,
how they are kept, and what the core is handed.

Both come inside the message's own POST, base64 in its JSON (`channels.web.api`), not by an
upload of their own: a message and its files are then one request, recorded once under the
page's id for it, so a page that sends it again (its answer was lost) sends the same message
with the same files, and no file is ever kept that no message holds (nothing to collect when a
page uploads and goes away). The caps bound what one request costs: at most `MAX_FILES` files,
`MAX_FILE_BYTES` each and `MAX_FILES_BYTES` together, beside `MAX_IMAGES` pictures of
`MAX_IMAGE_BYTES` (`MOST_ENCODED`, about 126 MB of base64, is what the body may carry for them).

Everything here is a stranger's until the dispatcher says otherwise, so:
- a picture is told by its bytes (PNG, JPEG, GIF, WebP), never by what the page says: it is
  served back inline, and an SVG can carry script;
- a file's name is cut to its last part and cleared of control and formatting characters (a
  right-to-left override makes `exe.pdf` read as `fdp.exe`); it never names a path, and the
  page shows it as text. Its media type is the page's when it has the shape of one, else
  guessed from the name;
- a file is only ever served back as a download (`application/octet-stream`,
  `Content-Disposition: attachment`), never as HTML or script in Kaiwa's origin.

They live in web.db beside the bubbles (`Uploads`, on the board's own connection, so a bubble
and what it came with are written in one transaction): a file's id is its `Attachment.source`,
and `Uploads.fetch` hands its bytes to the core, in this process or another after a restart.
"""

import base64
import binascii
import mimetypes
import re
import secrets
import sqlite3
import unicodedata
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from core.channel import Attachment, AttachmentKind
from core.errors import DownloadError
from core.text import size_in_words

MIB = 1024 * 1024
MAX_IMAGES = 4
MAX_IMAGE_BYTES = 10 * MIB
MAX_FILES = 10
MAX_FILE_BYTES = 25 * MIB
MAX_FILES_BYTES = 50 * MIB
"""A message's files together at most."""
MAX_NAME_CHARS = 200
ENTRY_OVERHEAD = 4096
"""JSON around one picture or file in a body: its name, its type, quotes and escapes."""
MOST_ENCODED = (
    MAX_IMAGES * (MAX_IMAGE_BYTES * 4 // 3 + ENTRY_OVERHEAD)
    + MAX_FILES_BYTES * 4 // 3
    + MAX_FILES * ENTRY_OVERHEAD
)
"""What a message's body may carry of pictures and files, base64 in JSON."""
IMAGE_TYPES = {
    b"\x89PNG\r\n\x1a\n": "image/png",
    b"\xff\xd8\xff": "image/jpeg",
    b"GIF87a": "image/gif",
    b"GIF89a": "image/gif",
}
"""What a picture's first bytes say it is (WebP, a RIFF file, is read apart); nothing else is
taken: an SVG can carry script."""
UNKNOWN_TYPE = "application/octet-stream"
MEDIA_TYPE = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]{0,62}/[a-z0-9][a-z0-9!#$&^_.+-]{0,62}")
FOLDERS = re.compile(r"[/\\]")

TABLE = """
CREATE TABLE files (
    id TEXT PRIMARY KEY, bubble TEXT NOT NULL REFERENCES bubbles(id), name TEXT NOT NULL,
    type TEXT NOT NULL, kind TEXT NOT NULL, size INTEGER NOT NULL, data BLOB NOT NULL
);
CREATE INDEX files_by_bubble ON files (bubble);
"""
"""The files' table, which a board of the version before files gains (`board.MIGRATIONS`)."""


@dataclass(frozen=True)
class Picture:
    """A picture a person sent: its media type (`image/png`, ...) and its bytes."""

    type: str
    data: bytes


@dataclass(frozen=True)
class FileUpload:
    """A file a message brings, checked, before it is kept."""

    name: str
    type: str
    data: bytes

    @property
    def kind(self) -> AttachmentKind:
        return AttachmentKind.AUDIO if self.type.startswith("audio/") else AttachmentKind.FILE


@dataclass(frozen=True)
class KeptFile:
    """A file kept with a person's bubble, as the bubble lists it (its bytes apart)."""

    id: str
    name: str
    type: str
    size: int
    kind: AttachmentKind

    def attachment(self) -> Attachment:
        return Attachment(self.name, self.type, self.id, self.kind, self.size)


class Uploads:
    """The pictures and files of people's bubbles, in web.db, on the board's connection: `keep`
    runs inside the transaction that writes their bubble."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def keep(
        self, bubble: str, pictures: tuple[Picture, ...], files: tuple[FileUpload, ...]
    ) -> tuple[tuple[str, ...], tuple[KeptFile, ...]]:
        """Keep what `bubble` came with; the pictures' ids and the files as kept."""
        images = tuple(secrets.token_hex(8) for _ in pictures)
        self._db.executemany(
            "INSERT INTO images VALUES (?, ?, ?, ?)",
            [
                (image, bubble, each.type, each.data)
                for image, each in zip(images, pictures, strict=True)
            ],
        )
        kept = tuple(
            KeptFile(secrets.token_hex(8), each.name, each.type, len(each.data), each.kind)
            for each in files
        )
        self._db.executemany(
            "INSERT INTO files VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (one.id, bubble, one.name, one.type, one.kind.value, one.size, each.data)
                for one, each in zip(kept, files, strict=True)
            ],
        )
        return images, kept

    def of(self, bubble: str) -> tuple[tuple[str, ...], tuple[KeptFile, ...]]:
        """The ids of `bubble`'s pictures and its files, in the order they came."""
        images = self._db.execute(
            "SELECT id FROM images WHERE bubble = ? ORDER BY rowid", (bubble,)
        )
        files = self._db.execute(
            "SELECT id, name, type, size, kind FROM files WHERE bubble = ? ORDER BY rowid",
            (bubble,),
        )
        return tuple(image for (image,) in images), tuple(_kept(*row) for row in files)

    def image(self, image_id: str) -> tuple[str, Picture] | None:
        """A picture and the conversation its message is in; None if there is no such one."""
        found = self._db.execute(
            "SELECT conversation, type, data FROM images JOIN bubbles ON bubbles.id = bubble "
            "WHERE images.id = ?",
            (image_id,),
        ).fetchone()
        return (found[0], Picture(found[1], bytes(found[2]))) if found else None

    def file(self, file_id: str) -> tuple[str, KeptFile] | None:
        """A file and the conversation its message is in; None if there is no such one."""
        found = self._db.execute(
            "SELECT conversation, files.id, name, type, size, kind FROM files "
            "JOIN bubbles ON bubbles.id = bubble WHERE files.id = ?",
            (file_id,),
        ).fetchone()
        return (found[0], _kept(*found[1:])) if found else None

    def data(self, file_id: str) -> bytes | None:
        found = self._db.execute("SELECT data FROM files WHERE id = ?", (file_id,)).fetchone()
        return bytes(found[0]) if found else None

    def fetch(self, attachment: Attachment, limit: int) -> bytes:
        """The bytes of the file `attachment` names, for the core: refused before a byte is
        read when it is larger than `limit`; a `DownloadError` in words for its sender when
        it is, when it is no longer kept, or when web.db cannot be read (the one place the
        database's errors become Kaiwa's)."""
        name = attachment.name
        try:
            found = self.file(attachment.source)
            if found is not None and found[1].size > limit:
                raise DownloadError(
                    f"{name} is {size_in_words(found[1].size)}, larger than the "
                    f"{size_in_words(limit)} Kaiwa downloads"
                )
            data = self.data(attachment.source) if found else None
        except sqlite3.Error as exc:
            raise DownloadError(
                f"the web chat could not read {name} from its file (web.db: {exc}); send it "
                "again, and if this goes on, tell the operator"
            ) from exc
        if data is None:
            raise DownloadError(f"{name} is no longer kept by the web chat: attach it again")
        return data


def _kept(file_id: str, name: str, media_type: str, size: int, kind: str) -> KeptFile:
    return KeptFile(file_id, name, media_type, size, AttachmentKind(kind))


# -- what a message's body brings ------------------------------------------------------------


def pictures(given: Any) -> tuple[Picture, ...] | str:
    """The pictures of a message body (base64 strings), or why they are refused."""
    if given is None:
        return ()
    if not isinstance(given, list) or len(given) > MAX_IMAGES:
        return f"a message takes at most {MAX_IMAGES} pictures"
    taken = []
    for each in given:
        try:
            data = base64.b64decode(each if isinstance(each, str) else "", validate=True)
        except binascii.Error:
            return "a picture must be base64"
        if len(data) > MAX_IMAGE_BYTES:
            return f"a picture may be at most {MAX_IMAGE_BYTES // MIB} MB"
        kind = _image_type(data)
        if kind is None:
            return "only PNG, JPEG, GIF and WebP pictures are taken"
        taken.append(Picture(kind, data))
    return tuple(taken)


def files(given: Any) -> tuple[FileUpload, ...] | str:
    """The files of a message body (`[{name, type, data}]`, data in base64), or why they are
    refused, in words for the person."""
    if given is None:
        return ()
    if not isinstance(given, list):
        return "files must be a list of {name, type, data}"
    if len(given) > MAX_FILES:
        return (
            f"a message takes at most {MAX_FILES} files, and this one has {len(given)}: send "
            "the others with the next message"
        )
    taken = []
    for number, each in enumerate(given, start=1):
        one = _file(each, number)
        if isinstance(one, str):
            return one
        taken.append(one)
    together = sum(len(each.data) for each in taken)
    if together > MAX_FILES_BYTES:
        return (
            f"these files are {size_in_words(together)} together; the web chat takes up to "
            f"{size_in_words(MAX_FILES_BYTES)} in one message: send some with the next message"
        )
    return tuple(taken)


def _file(given: Any, number: int) -> FileUpload | str:
    if not isinstance(given, dict) or not isinstance(given.get("data"), str):
        return "each file must be {name, type, data}, its data in base64"
    name = safe_name(given.get("name"), number)
    try:
        data = base64.b64decode(given["data"], validate=True)
    except binascii.Error:
        return f"{name} did not come as base64: attach it again"
    if len(data) > MAX_FILE_BYTES:
        return (
            f"{name} is {size_in_words(len(data))}; the web chat takes files up to "
            f"{size_in_words(MAX_FILE_BYTES)}"
        )
    return FileUpload(name, media_type(given.get("type"), name), data)


def safe_name(given: Any, number: int) -> str:
    """What a file is called on the board: the last part of the name the page gave, without
    control or formatting characters, at most `MAX_NAME_CHARS` (its extension kept); "file N"
    when nothing is left of it."""
    last = FOLDERS.split(given if isinstance(given, str) else "")[-1]
    name = "".join(_shown(each) for each in last).strip()
    if name in ("", ".", ".."):
        return f"file {number}"
    if len(name) <= MAX_NAME_CHARS:
        return name
    stem, dot, extension = name.rpartition(".")
    if not dot or len(extension) > 16:
        return name[:MAX_NAME_CHARS]
    return stem[: MAX_NAME_CHARS - len(extension) - 1] + "." + extension


def _shown(character: str) -> str:
    """A character of a name as it is kept: a space for any space, nothing for a control or
    formatting character, or a line or paragraph break."""
    kind = unicodedata.category(character)
    if kind == "Zs":
        return " "
    return "" if kind[0] == "C" or kind in ("Zl", "Zp") else character


def media_type(given: Any, name: str) -> str:
    """The page's media type for a file when it has the shape of one (without parameters),
    else what its name says, else `application/octet-stream`."""
    stated = (given if isinstance(given, str) else "").partition(";")[0].strip().lower()
    if MEDIA_TYPE.fullmatch(stated) and stated != UNKNOWN_TYPE:
        return stated
    return mimetypes.guess_type(name, strict=False)[0] or UNKNOWN_TYPE


def disposition(name: str) -> str:
    """A `Content-Disposition` that downloads the file as `name` (RFC 6266: a plain ASCII
    name for old clients, the whole one encoded in `filename*`)."""
    plain = "".join(each if " " <= each <= "~" and each not in '"\\' else "_" for each in name)
    return f"attachment; filename=\"{plain}\"; filename*=UTF-8''{quote(name, safe='')}"


def _image_type(data: bytes) -> str | None:
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return next((kind for magic, kind in IMAGE_TYPES.items() if data.startswith(magic)), None)
