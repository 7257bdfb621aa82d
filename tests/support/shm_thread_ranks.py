"""Thread ranks over the shared-memory (and hybrid) transports, with no store.

Each thread maps the others' segments exactly as processes do; an in-memory exchange stands
in for the store. ``hosts`` gives a host name per rank, so a test can lay one machine out as
several hosts and drive the hybrid transport.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from thread_ranks import run_comms

from cclctl.config import RuntimeConfig
from cclctl.runtime.comm.communicator import Communicator, world_comm_id
from cclctl.runtime.transport.base import Transport
from cclctl.runtime.transport.shm.layout import Layout
from cclctl.runtime.transport.tcp.links import Links

CFG = RuntimeConfig(job="shm-threads", timeout_s=20.0, connect_timeout_s=10.0)


class MemoryExchange:
    """What the store's ``exchange`` does, for threads of one process."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._values: dict[tuple[str, int], bytes] = {}
        self._cond = threading.Condition()

    def for_rank(self, rank: int) -> Callable[[str, bytes], list[bytes]]:
        def exchange(key: str, value: bytes) -> list[bytes]:
            with self._cond:
                self._values[(key, rank)] = value
                self._cond.notify_all()
                ok = self._cond.wait_for(
                    lambda: all((key, r) in self._values for r in range(self.n)), 20.0
                )
                if not ok:
                    raise TimeoutError(f"exchange {key!r} timed out")
                return [self._values[(key, r)] for r in range(self.n)]

        return exchange


def make_transports(
    n: int,
    hosts: Sequence[str] | None = None,
    layout: Callable[[int], Layout] | None = None,
    one_copy: bool = True,
    choice: str = "auto",
    cross_memory: bool = True,
) -> list[Transport]:
    """Shared-memory transports for ``n`` thread ranks (hybrid where ``hosts`` differ);
    ``choice`` is each rank's ``CCLCTL_TRANSPORT``; ``cross_memory``: single-copy collectives
    where the kernel allows them (thread ranks share one process, which it always does),
    however many ranks share the cores."""
    from cclctl.runtime.transport.hybrid import build_transport

    hosts = list(hosts) if hosts is not None else ["h"] * n
    exchange = MemoryExchange(n)
    out: list[Transport | None] = [None] * n
    errors: list[BaseException] = []

    def open_one(r: int) -> None:
        try:
            local = [p for p in range(n) if hosts[p] == hosts[r]]
            links = Links(r, n, CFG.job, "127.0.0.1", CFG.connect_timeout_s, token="test-token")
            out[r] = build_transport(
                r,
                n,
                CFG.job,
                exchange.for_rank(r),
                links,
                choice=choice,
                host=hosts[r],
                layout=layout(len(local)) if layout else None,
                spin_s=0.0,
                one_copy=one_copy,
                cross_memory="always" if cross_memory else "never",
            )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]
    return [t for t in out if t is not None]


def run_on(
    transports: Sequence[Transport],
    fn: Callable[[Communicator], Any],
    cfg: RuntimeConfig | None = None,
    timeout_s: float = 60.0,
) -> list[Any]:
    """Run ``fn(comm)`` on one thread per transport; results by rank; re-raise the first error."""
    n = len(transports)
    cfg = cfg or CFG
    comms = [
        Communicator(rank=r, world_size=n, transport=t, cfg=cfg, comm_id=world_comm_id(n))
        for r, t in enumerate(transports)
    ]
    return run_comms(comms, fn, timeout_s)


def run_ranks(
    n: int,
    fn: Callable[[Communicator], Any],
    cfg: RuntimeConfig | None = None,
    hosts: Sequence[str] | None = None,
    one_copy: bool = True,
    cross_memory: bool = True,
) -> list[Any]:
    transports = make_transports(n, hosts, one_copy=one_copy, cross_memory=cross_memory)
    return run_on(transports, fn, cfg)
