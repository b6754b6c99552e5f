"""Kaiwa's composition root: the `kaiwa` command and the wiring of everything it starts."""

from importlib.metadata import PackageNotFoundError, version


def kaiwa_version() -> str:
    """Kaiwa's version, as installed."""
    try:
        return version("kaiwa")
    except PackageNotFoundError:
        return "(not installed)"
