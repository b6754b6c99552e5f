"""A TCP proxy on 127.0.0.1 that puts distance or an outage between Kaiwa and its database.

Not a fake of a service but of the network in front of one: PostgreSQL speaks through it
unchanged. `rtt` adds a round trip (half of it each way, bytes kept in order), as a database a
network hop away has; `cut()` drops every connection and refuses new ones until `restore()`, as
a database that restarts or a network that blinks does.

It runs on threads of its own, not on an event loop: the benchmarks measure Kaiwa's event loop,
and a proxy sharing it would be measured too; and threads sleep precisely enough (well under a
millisecond) for the delay to be what it says. Tests wait on its counters with
`wait_for_refusals` (a handshake, not a sleep).

    python -m tests.fakes.tcp_proxy --target 127.0.0.1:5432 --rtt-ms 1
prints `READY <port>` and forwards until killed.
"""

import argparse
import contextlib
import queue
import socket
import threading
import time

CHUNK = 65536


class TcpProxy:
    def __init__(self, target: tuple[str, int], *, rtt: float = 0.0, port: int = 0) -> None:
        self.target = target
        self.rtt = rtt
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Condition()
        self._open: set[socket.socket] = set()
        self._cut = False
        self._closed = False
        self.refused = 0
        """Connections refused while cut (each one is Kaiwa trying again)."""
        threading.Thread(target=self._accept, name="proxy accept", daemon=True).start()

    @property
    def url_host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Drop every open connection and refuse new ones, until `restore`."""
        with self._lock:
            self._cut = True
            for each in self._open:
                _shut(each)
            self._open.clear()

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def wait_for_refusals(self, count: int, timeout: float = 10.0) -> None:
        """Block until `count` connections in all were refused while cut."""
        with self._lock:
            if not self._lock.wait_for(lambda: self.refused >= count, timeout):
                raise TimeoutError(f"{self.refused} refused connections, wanted {count}")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for each in self._open:
                _shut(each)
            self._open.clear()
        _shut(self._listener)

    def __enter__(self) -> "TcpProxy":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                refuse = self._cut or self._closed
                if refuse:
                    self.refused += 1
                    self._lock.notify_all()
            if refuse:
                _shut(client)
                continue
            try:
                server = socket.create_connection(self.target)
            except OSError:
                _shut(client)
                continue
            for each in (client, server):
                each.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._open |= {client, server}
            self._pipe(client, server)
            self._pipe(server, client)

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        """Forward `source` to `sink`, each chunk `rtt / 2` after it was read, in order."""
        if self.rtt <= 0:
            threading.Thread(target=_forward, args=(source, sink), daemon=True).start()
            return
        held: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()
        threading.Thread(target=_read, args=(source, held, self.rtt / 2), daemon=True).start()
        threading.Thread(target=_write, args=(held, sink), daemon=True).start()


def _forward(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(CHUNK):
            sink.sendall(data)
    _shut(sink)
    _shut(source)


def _read(
    source: socket.socket, held: "queue.SimpleQueue[tuple[float, bytes]]", delay: float
) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(CHUNK):
            held.put((time.monotonic() + delay, data))
    held.put((0.0, b""))
    _shut(source)


def _write(held: "queue.SimpleQueue[tuple[float, bytes]]", sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while True:
            due, data = held.get()
            if not data:
                break
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            sink.sendall(data)
    _shut(sink)


def _shut(each: socket.socket) -> None:
    with contextlib.suppress(OSError):
        each.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        each.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="A TCP proxy that adds a round trip.")
    parser.add_argument("--target", default="127.0.0.1:5432", help="host:port to forward to")
    parser.add_argument("--rtt-ms", type=float, default=0.0, help="round trip to add, in ms")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: any free)")
    args = parser.parse_args()
    host, port = args.target.rsplit(":", 1)
    proxy = TcpProxy((host, int(port)), rtt=args.rtt_ms / 1000, port=args.port)
    print(f"READY {proxy.port}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
