"""Kaiwa's own exceptions, so callers never catch a client library's types.

Third-party exceptions are mapped to these at exactly one boundary each (the model client maps
ollama and httpx errors in `core.agent.model`; the store maps SQLAlchemy's where it opens, in
`core.store.engine`, and where its calls run, in `core.store.dbthread`), with
`raise ... from exc`. Every message is written for the person reading the conversation: what went
wrong, then how to fix it.

    KaiwaError
    ├── ConfigError            a setting is wrong; names the key and the expected type
    ├── StoreError             the database cannot be opened or migrated, or refused a write
    │   ├── StoreUnavailable   the database did not answer within [storage].write_retry_seconds
    │   └── WriteRefused       the database answers but refuses writes (a full disk, read-only)
    ├── ChannelError           a platform refused to start a channel (a wrong token, ...)
    │   └── DownloadError      an attached file could not be fetched (too large, gone, refused)
    ├── ModelError             a model request did not produce a reply
    │   ├── ModelUnreachable   Ollama is not listening at the configured URL
    │   ├── ModelNotFound      the model is not pulled
    │   ├── ModelHTTPError     Ollama answered with a 4xx/5xx status
    │   ├── ModelStreamError   an error line, a cut stream, or a stream that ended early
    │   └── ModelTimeout       no first chunk, or silence between chunks, past the limit
    └── DegenerateTurn         the model ended a turn with nothing to say
"""


class KaiwaError(Exception):
    """Base of every error Kaiwa raises on purpose."""


class ConfigError(KaiwaError):
    """A configuration value is missing, unknown or of the wrong type."""


class StoreError(KaiwaError):
    """The database cannot be opened or migrated, or refused a write; the message says why.
    `plainly` says it for a person in a chat, who is not the operator (the log has the rest)."""

    plainly = "Kaiwa's database refused to save it (the log says why)"


class StoreUnavailable(StoreError):
    """The database was unreachable for longer than a call could wait (an outage)."""

    plainly = "Kaiwa's database is not answering"


class WriteRefused(StoreError):
    """The database refused a write for a cause that lasts until an operator acts (a full disk,
    a read-only database, a used-up quota): `cause` names it (`core.store.outage.Cause`)."""

    def __init__(self, message: str, *, cause: str, plainly: str) -> None:
        super().__init__(message)
        self.cause = cause
        self.plainly = plainly


class ChannelError(KaiwaError):
    """A platform refused to start a channel; the message names the setting to fix."""


class DownloadError(ChannelError):
    """An attachment its channel could not fetch; the message, for the person who sent it, says
    why (past a size limit, expired, refused by the platform) and what to do."""


class ModelError(KaiwaError):
    """A model request failed; the message says why and what to do. `transient`: it may well
    succeed if tried again (a connection refused or reset, an overloaded server)."""

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class ModelUnreachable(ModelError):
    def __init__(self, message: str) -> None:
        super().__init__(message, transient=True)


class ModelNotFound(ModelError):
    pass


class ModelHTTPError(ModelError):
    TRANSIENT = (502, 503, 504)

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message, transient=status in self.TRANSIENT)
        self.status = status


class ModelStreamError(ModelError):
    pass


class ModelTimeout(ModelError):
    pass


class DegenerateTurn(KaiwaError):
    """The model produced no text and no tool call even after a nudge or a forced wrap-up."""
