"""`[cluster]` in config, and this worker's name: what a single process needs to know of the
cluster, without loading the PostgreSQL client that `core.cluster.leases` is built on (the
composition root imports that only when `[cluster].enabled`)."""

import os
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class ClusterSettings:
    enabled: bool = False
    name: str = "kaiwa"
    """Leases and notifications are this cluster's: workers of one bot share it."""
    worker_id: str = ""
    """How this worker is named in logs and `kaiwa status`; empty: `<host>:<pid>`."""
    failover_seconds: float = 15.0
    """A dead worker's platform connections and conversations are taken over within this."""
    idle_seconds: float = 60.0
    """A worker lets go of a conversation quiet this long, so ownership can move."""


def worker_name(settings: ClusterSettings) -> str:
    return settings.worker_id or f"{socket.gethostname()}:{os.getpid()}"
