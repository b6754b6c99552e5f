"""The `platform` fixture: every platform adapter, for the conformance suite."""

from tests.channels.platforms import platform  # noqa: F401
