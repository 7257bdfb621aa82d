"""How fast the store answers: a ``set`` round trip and a 10,000-key ``list``.

Ranks talk to the store from other processes, so the client runs in a child process. The
floor is measured in the same run: a bare blocking-socket echo between two processes on
the same loopback, so a slow machine does not read as a slow store. Prints; asserts nothing.

    python benchmarks/store_roundtrip.py [--calls N]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys

from cclctl.store.client import StoreServer

CLIENT = r"""
import statistics, sys, time
from cclctl.store.client import StoreClient
port, calls = int(sys.argv[1]), int(sys.argv[2])
c = StoreClient("127.0.0.1", port)
def timed(op):
    samples = []
    for _ in range(calls):
        t = time.perf_counter(); op(); samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6
print(f"{'store set':<34} median {timed(lambda: c.set('k', b'v' * 64)):7.1f} us")
print(f"{'store get':<34} median {timed(lambda: c.get('k')):7.1f} us")
value = b"x" * 1024
for rank in range(10_000):
    c.set(f"status/{rank}", value)
t = time.perf_counter(); found = c.list("status/"); dt = time.perf_counter() - t
print(f"list 10,000 x 1 KiB: {dt * 1e3:.1f} ms ({len(found)} keys)")
"""

ECHO_CLIENT = r"""
import socket, statistics, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
s.settimeout(60)
samples = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    s.sendall(b"x" * 80)
    s.recv(100)
    samples.append(time.perf_counter() - t)
print(f"{sys.argv[3]:<34} median {statistics.median(samples) * 1e6:7.1f} us")
"""


def blocking_echo(calls: int) -> None:
    """The floor: two processes, blocking sockets, no event loop."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        child = _echo_client(port, calls, "echo, blocking sockets (floor)")
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            while data := conn.recv(100):
                conn.sendall(data)
        child.wait()


class _Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)


def asyncio_echo(calls: int) -> None:
    """The store's own architecture with no store in it: an asyncio Protocol echo."""

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(_Echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        child = _echo_client(port, calls, "echo, asyncio protocol (peer)")
        while child.poll() is None:
            await asyncio.sleep(0.05)
        server.close()

    asyncio.run(serve())


def _echo_client(port: int, calls: int, label: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", ECHO_CLIENT, str(port), str(calls), label])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    args = parser.parse_args()
    blocking_echo(args.calls)
    asyncio_echo(args.calls)
    with StoreServer() as server:
        cmd = [sys.executable, "-c", CLIENT, str(server.port), str(args.calls)]
        subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
