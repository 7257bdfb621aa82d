"""Free loopback ports for the tests' jobs, taken below the kernel's ephemeral range.

``bind(0)`` hands out a port from the ephemeral range, where every ``connect()`` also takes
its local ports (the even ones, on Linux): a job's own connections (gloo's mesh, torch's
store clients, a previous test's TIME_WAIT leftovers) can take such a port, or the one
after it, before the job binds it, and the job then runs without what it meant to serve
there. The kernel never hands out a port below the range, so a free one stays free until
a test binds it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 10000


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_block(count: int) -> int:
    """A base port with ``count`` consecutive ports free on 127.0.0.1, all below the
    ephemeral range (a random block, so two sessions on one machine rarely meet)."""
    top = max(LOWEST + 1, ephemeral_low() - count)
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(LOWEST, top)
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no block of {count} free ports below {top}")


def free_port() -> int:
    """One free port on 127.0.0.1 below the ephemeral range."""
    return free_port_block(1)
