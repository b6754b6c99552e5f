"""The attachments part: what a person's message came with, heard and read as its turn opens.

It takes part at two points, and downloads at one only:
- **Before the message is recorded as a turn** (`screen`, one of the dispatcher's screens),
  from what the channel said of each file, with nothing downloaded: transcription off, a note
  or a file past its cap, a type Kaiwa cannot read, a file the platform will not hand a bot
  (`Attachment.unavailable`). The message is then answered with that one reason, and no model
  is called. The dispatcher must return at once so its channel keeps reading (a `/stop` must
  get through), so nothing slow happens there.
- **As the turn opens** (`Part.read`, inside the turn, so it queues behind the conversation's
  running turn, shows on the reply's status line and stops with `/stop`): each file is
  downloaded through its channel (`core.channel.Files`), capped; a voice note or audio file is
  transcribed (transcription.py), a document read in a process of its own (apart.py). The
  person's message is then reworded as the model reads it and the store keeps it: their own
  words first, the question, then each attachment's block (a transcript marked as spoken, with
  its length; a document between its tags, with what was cut). So a restart, a compaction,
  `/usage` and `search_conversations` all see what the model saw. What was heard is shown,
  quoted, above the answer, and what was cut of a document is said there too.

Before anything is read the message is stored saying what it came with, "not read yet", so a
process killed mid-read leaves a truthful history, and the run again (`core.dispatch.recovery`)
reads the files anew from the inbox's description. A file that cannot be read fails the turn
with why and the fix (the server down, the platform's refusal, a scanned PDF), and the stored
message says which file was not read and why: nothing the person sent is answered as if read.

The documents' text is cut to fit the window beside the conversation (`Reading.room`), each
cut said with a mark, so no request goes over the window because of a document.
"""

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import cast

from core.channel import Attachment, AttachmentKind, ChannelMessage, Files
from core.errors import KaiwaError
from core.features.attachments.apart import read_apart
from core.features.attachments.formats import (
    Document,
    DocumentLimits,
    Unreadable,
    cannot_read,
    check_size,
    document_block,
    kind_of,
)
from core.features.attachments.transcription import (
    Transcriber,
    TranscriptionSettings,
    length_in_words,
    refusal_before,
)
from core.turns.parts import Part, Reading

logger = logging.getLogger(__name__)

QUOTE_CHARS = 1_500
"""Characters of a transcript quoted above the answer; the model reads all of it."""
LEAST_DOCUMENT_CHARS = 500
"""Fewer characters than this of a document is no reading of it: refused instead."""
BLOCK_CHARS = 200
"""What a block's tags and marks take besides its text, counted against the room."""


class NotRead(KaiwaError):
    """An attachment that could not be read; the message says why, for the person."""


@dataclass(frozen=True)
class _Read:
    """One attachment as read: a transcript, or a document."""

    attachment: Attachment
    transcript: str = ""
    seconds: float | None = None
    document: Document | None = None


class Attachments(Part):
    def __init__(
        self,
        transcription: TranscriptionSettings,
        documents: DocumentLimits,
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        self._transcription = transcription
        self._limits = documents
        self._transcriber = Transcriber(transcription, environ) if transcription.enabled else None

    # -- before the message is recorded ----------------------------------------------------------

    def screen(self, message: ChannelMessage) -> str | None:
        """Why the message's attachments cannot be taken, from what its channel said of them
        (nothing downloaded), or None."""
        for attachment in message.attachments:
            if (why := self._refusal(attachment)) is not None:
                return why
        return None

    def _refusal(self, attachment: Attachment) -> str | None:
        if attachment.unavailable:
            return attachment.unavailable
        if attachment.heard:
            refused = refusal_before(self._transcription, attachment.size, attachment.seconds)
            return None if refused is None else str(refused)
        if kind_of(attachment.name, attachment.media_type) is None:
            return cannot_read(attachment.name, attachment.media_type)
        if attachment.size is not None:
            try:
                check_size(attachment.name, attachment.size, self._limits)
            except Unreadable as exc:
                return str(exc)
        return None

    # -- as the turn opens --------------------------------------------------------------------

    async def read(self, turn: Reading) -> None:
        attached = turn.request.attachments
        if not attached:
            return
        asked = turn.said
        turn.reword(_joined(asked, [_pending(each) for each in attached]))
        done: list[_Read] = []
        try:
            for attachment in attached:
                done.append(await self._read_one(turn, attachment))
            blocks = self._fitted(turn, asked, done)
        except KaiwaError as exc:
            left = [_not_read(each, str(exc)) for each in attached[len(done) :]]
            turn.reword(_joined(asked, [*(_block(each) for each in done), *left]))
            raise
        turn.reword(_joined(asked, blocks))
        if preface := _preface(done):
            turn.preface(preface)

    async def _read_one(self, turn: Reading, attachment: Attachment) -> _Read:
        if not hasattr(turn.channel, "download"):
            raise NotRead(f"{attachment.name} came from a channel that cannot fetch files")
        files = cast(Files, turn.channel)
        if attachment.heard:
            return await self._heard(turn, files, attachment)
        turn.status(f"reading {attachment.name}…")
        data = await files.download(attachment, self._limits.max_bytes)
        try:
            document = await read_apart(attachment.name, data, attachment.media_type, self._limits)
        except Unreadable as exc:
            logger.warning("document %s not read: %s", attachment.name, exc)
            raise NotRead(str(exc)) from None
        logger.info(
            "document %s read: %d bytes, %d characters%s",
            attachment.name,
            len(data),
            len(document.text),
            f" ({document.cut})" if document.cut else "",
        )
        return _Read(attachment, document=document)

    async def _heard(self, turn: Reading, files: Files, attachment: Attachment) -> _Read:
        what = "your voice note" if attachment.kind is AttachmentKind.VOICE else attachment.name
        turn.status(f"transcribing {what}…")
        refused = refusal_before(self._transcription, attachment.size, attachment.seconds)
        if refused is not None or self._transcriber is None:
            raise refused or NotRead("voice notes are off")
        data = await files.download(attachment, self._transcription.max_bytes)
        transcript = await self._transcriber.transcribe(
            attachment.name, data, attachment.media_type or None, attachment.seconds
        )
        if not transcript.text.strip():
            raise NotRead(
                f"I heard no words in {what}: it may be silent or too quiet. Say it again "
                "closer to the microphone, or type it"
            )
        return _Read(attachment, transcript=transcript.text, seconds=transcript.seconds)

    def _fitted(self, turn: Reading, asked: str, done: Sequence[_Read]) -> list[str]:
        """Every attachment's block, the documents' texts cut so that the message fits
        `turn.room()`: the room left beside the person's words and the transcripts is shared
        between the documents, none given more than it needs."""
        heard = sum(len(_block(each)) for each in done if each.document is None)
        room = turn.room() - len(asked) - heard
        sizes = [len(each.document.text) if each.document else 0 for each in done]
        shares = _shares(sizes, room - BLOCK_CHARS * len(done))
        return [
            _block(self._cut(turn, each, share) if each.document else each)
            for each, share in zip(done, shares, strict=True)
        ]

    def _cut(self, turn: Reading, read: _Read, chars: int) -> _Read:
        document = read.document
        assert document is not None
        if len(document.text) <= chars:
            return read
        if chars < LEAST_DOCUMENT_CHARS:
            raise NotRead(
                f"{document.name} does not fit in what {turn.agent.model} can read at once beside "
                "this conversation: start a new one (/new), send a shorter part of it, or give "
                f"the agent a larger window ([agents.{turn.agent.name}].context_window)"
            )
        fits = "all that fits the model's context window"
        cut = (
            f"{document.cut}; then kept the first {chars:,} characters, {fits}"
            if document.cut
            else f"kept the first {chars:,} of {len(document.text):,} characters, {fits}"
        )
        kept = replace(document, text=document.text[:chars], cut=cut)
        return replace(read, document=kept)

    async def shutdown(self) -> Mapping[int, str]:
        if self._transcriber is not None:
            await self._transcriber.aclose()
        return {}


def _shares(sizes: Sequence[int], room: int) -> list[int]:
    """Characters each of `sizes` may keep in `room`: the smallest whole, the room they leave
    shared evenly among the rest."""
    shares = [0] * len(sizes)
    left, waiting = room, len(sizes)
    for index in sorted(range(len(sizes)), key=sizes.__getitem__):
        shares[index] = min(sizes[index], max(0, left // waiting))
        left -= shares[index]
        waiting -= 1
    return shares


def _joined(asked: str, blocks: Sequence[str]) -> str:
    return "\n\n".join([asked, *blocks] if asked else blocks)


def _what(attachment: Attachment, seconds: float | None = None) -> str:
    """How a block names an attachment: "a voice note (12 s)", "notes.mp3 (audio, 3 min)"."""
    length = seconds if seconds is not None else attachment.seconds
    said = f", {length_in_words(length)}" if length is not None else ""
    if attachment.kind is AttachmentKind.VOICE:
        return f"a voice note{said}"
    return f"{attachment.name} (audio{said})" if attachment.heard else attachment.name


def _pending(attachment: Attachment) -> str:
    return f"[{_what(attachment)}: attached, not read yet]"


def _not_read(attachment: Attachment, why: str) -> str:
    return f"[{_what(attachment)}: attached, not read: {why}]"


def _block(read: _Read) -> str:
    """The attachment as the model reads it: a document between its tags, or a transcript
    marked as the person's spoken words."""
    if read.document is not None:
        return document_block(read.document)
    return (
        f"[{_what(read.attachment, read.seconds)}, transcribed: these are the person's own "
        f"words, spoken]\n{read.transcript.strip()}"
    )


def _preface(done: Sequence[_Read]) -> str:
    """What the person sees above the answer: what was heard, quoted, and what was cut of a
    document."""
    lines = []
    for read in done:
        if read.document is None:
            heard = " ".join(read.transcript.split())
            if len(heard) > QUOTE_CHARS:
                heard = heard[:QUOTE_CHARS].rsplit(" ", 1)[0] + " …"
            length = f" ({length_in_words(read.seconds)})" if read.seconds is not None else ""
            lines.append(f"> 🎙 Heard{length}: “{heard}”")
        elif read.document.cut:
            lines.append(f"> 📄 {read.document.name}: {read.document.cut}")
    return "\n>\n".join(lines)
