"""A port free on 127.0.0.1 now, for a test that must name the port before anything listens (a
process's config, two listeners meant to share one address). Port 0 is better wherever the
listener can report what it got."""

import socket


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
