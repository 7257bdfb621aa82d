"""TCP connections between ranks: listen, connect, accept and identify peers.

Links are made on first use, so a 64-rank ring opens 2 links per rank rather than 63. The
lower rank of a pair always connects and the higher one accepts; the kernel's listen
backlog completes a connect before the acceptor looks, so two ranks that need each other
never wait on one another to set up a link.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
import zlib

from cclctl.errors import CommError, PeerError
from cclctl.runtime.transport.base import Wait
from cclctl.runtime.transport.wire import Call

_HELLO = struct.Struct("<4sIII")  # magic, job tag, rank, world size
_HELLO_MAGIC = b"CCL1"
_SOCKET_BUFFER = 4 << 20


def local_address_towards(host: str) -> str:
    """The local IP address that routes to ``host`` (the store), to advertise to peers."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_DGRAM)
        target = str(infos[0][4][0])
    except OSError:
        return "127.0.0.1"
    if target.startswith("127."):
        return "127.0.0.1"
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((target, 9))  # no packet is sent for a UDP connect
        return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):  # a capped limit is fine, just slower
            sock.setsockopt(socket.SOL_SOCKET, opt, _SOCKET_BUFFER)


class Links:
    """This rank's listening socket and its established links, keyed by peer rank."""

    def __init__(
        self, rank: int, world_size: int, job: str, host: str, connect_timeout_s: float
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self._job_tag = zlib.crc32(job.encode())
        self._connect_timeout_s = connect_timeout_s
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind((host, 0))
        except OSError as exc:
            self._listener.close()
            raise CommError(f"rank {rank}: cannot listen on {host}: {exc}", rank=rank) from None
        self._listener.listen(max(128, world_size + 16))
        self.address = "{}:{}".format(*self._listener.getsockname())
        self.peers: list[str] = []
        self.socks: dict[int, socket.socket] = {}

    def get(self, peer: int, call: Call, wait: Wait) -> socket.socket:
        sock = self.socks.get(peer)
        if sock is None:
            sock = (
                self._connect(peer, call, wait)
                if self.rank < peer
                else self._accept(peer, call, wait)
            )
        return sock

    def _connect(self, peer: int, call: Call, wait: Wait) -> socket.socket:
        host, _, port = self.peers[peer].rpartition(":")
        deadline = time.monotonic() + self._connect_timeout_s
        while True:
            try:
                sock = socket.create_connection((host, int(port)), timeout=5.0)
                break
            except OSError as exc:
                wait.blocked_on(peer, "send")
                wait.check(call, peer, "send")
                if time.monotonic() > deadline:
                    raise PeerError(
                        f"rank {self.rank}: cannot connect to rank {peer} at "
                        f"{self.peers[peer]}: {exc}",
                        rank=self.rank,
                        peer=peer,
                        seq=call.seq,
                        op=call.op,
                    ) from None
                time.sleep(0.05)
        _tune(sock)
        sock.sendall(_HELLO.pack(_HELLO_MAGIC, self._job_tag, self.rank, self.world_size))
        sock.setblocking(False)
        self.socks[peer] = sock
        return sock

    def _accept(self, peer: int, call: Call, wait: Wait) -> socket.socket:
        wait.blocked_on(peer, "recv")
        while peer not in self.socks:
            left = wait.check(call, peer, "recv")
            self._listener.settimeout(min(left, 0.5))
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            self._identify(sock)
        return self.socks[peer]

    def _identify(self, sock: socket.socket) -> None:
        """Read a newcomer's hello; keep it under its rank, drop strangers."""
        try:
            sock.settimeout(5.0)
            hello = b""
            while len(hello) < _HELLO.size:
                chunk = sock.recv(_HELLO.size - len(hello))
                if not chunk:
                    raise OSError("closed before saying hello")
                hello += chunk
            magic, job_tag, rank, world = _HELLO.unpack(hello)
        except (OSError, struct.error):
            sock.close()
            return
        if (
            magic != _HELLO_MAGIC
            or job_tag != self._job_tag
            or world != self.world_size
            or not 0 <= rank < self.rank
            or rank in self.socks
        ):
            sock.close()
            return
        _tune(sock)
        sock.setblocking(False)
        self.socks[rank] = sock

    def drop(self, peer: int) -> None:
        sock = self.socks.pop(peer, None)
        if sock is not None:
            sock.close()

    def close(self) -> None:
        for sock in self.socks.values():
            sock.close()
        self.socks.clear()
        self._listener.close()
