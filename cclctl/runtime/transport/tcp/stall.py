"""Whether a TCP link has stalled: bytes in flight that nothing acknowledges.

A peer that does not read (stopped, or busy in its own code) closes its receive window,
and its kernel goes on answering the sender's window probes: nothing is in flight, so that
is a slow or stopped rank for the watchdog and the diagnosis, never a link fault. A link
that drops packets (a cut cable, a blackhole, an interface down) leaves the sent bytes
unacknowledged while the kernel retransmits them, or, where it cannot send at all, its
probes unanswered. ``TCP_USER_TIMEOUT`` cannot tell the
two apart (since Linux 5.11 a closed window counts as well), so the socket's ``TCP_INFO``
is read instead. A link with nothing in flight (a rank that only receives) is probed with
the kernel's keepalives, which a stopped peer's kernel answers and a cut link does not.
"""

from __future__ import annotations

import socket
import struct

#: ``struct tcp_info``: eight one-byte fields, then 32-bit ones from ``tcpi_rto`` on.
_LAYOUT = struct.Struct("8B13I")
_PROBES = 3  # tcpi_probes: probes sent since something last came back
_UNACKED = 8 + 4  # index of tcpi_unacked in the unpacked fields
_LAST_ACK_RECV = 8 + 12  # tcpi_last_ack_recv: ms since the last ACK arrived
#: Probes in a row without an answer that mean the link, not the peer, is silent.
UNANSWERED_PROBES = 2


def stalled(sock: socket.socket, after_ms: int) -> bool:
    """True if nothing has come back on ``sock`` for ``after_ms`` milliseconds while it has
    bytes in flight, or while the kernel's probes for sending go unanswered (it cannot send
    at all: its interface is down, its packets are dropped on the way out). A closed
    window's probes are answered, which resets their count. False where the kernel's table
    cannot be read."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _LAYOUT.size)
    except OSError:
        return False
    if len(raw) < _LAYOUT.size:
        return False
    fields = _LAYOUT.unpack_from(raw)
    if fields[_LAST_ACK_RECV] < after_ms:
        return False
    return fields[_UNACKED] > 0 or fields[_PROBES] >= UNANSWERED_PROBES


def keep_probing(sock: socket.socket, after_ms: int) -> None:
    """Keepalives on ``sock`` once it has been quiet about ``after_ms`` (whole seconds, at
    least 1): two unanswered probes a second apart break it with ``ETIMEDOUT``."""
    idle_s = max(1, round(after_ms / 1000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 2)
