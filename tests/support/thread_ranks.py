"""Thread ranks: a whole job inside the test process, over real loopback TCP, no store.

Fast enough to run hundreds of collectives per test; process ranks (``cclctl launch``) are
used where a real job's behaviour matters (rendezvous, crashes, signals).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from cclctl.config import RuntimeConfig
from cclctl.runtime.comm.communicator import Communicator, world_comm_id
from cclctl.runtime.transport.tcp.links import Links
from cclctl.runtime.transport.tcp.transport import TcpTransport


def make_comms(
    n: int, cfg: RuntimeConfig | None = None, watchdog: bool = False
) -> list[Communicator]:
    """``n`` communicators over loopback TCP; ``watchdog``: as when a watchdog is in charge
    (calls have no deadline of their own)."""
    cfg = cfg or RuntimeConfig(job="threads", timeout_s=20.0, connect_timeout_s=10.0)
    transports = [
        TcpTransport(
            Links(
                r, n, cfg.job, "127.0.0.1", cfg.connect_timeout_s, token=cfg.token or "thread-ranks"
            )
        )
        for r in range(n)
    ]
    for t in transports:
        t.set_peers([p.address for p in transports])
    return [
        Communicator(
            rank=r, world_size=n, transport=t, cfg=cfg, comm_id=world_comm_id(n), watchdog=watchdog
        )
        for r, t in enumerate(transports)
    ]


def run_ranks(
    n: int,
    fn: Callable[[Communicator], Any],
    cfg: RuntimeConfig | None = None,
    timeout_s: float = 60.0,
) -> list[Any]:
    """Run ``fn(comm)`` on ``n`` thread ranks; results by rank; re-raise the first error."""
    return run_comms(make_comms(n, cfg), fn, timeout_s)


def run_comms(
    comms: list[Communicator], fn: Callable[[Communicator], Any], timeout_s: float = 60.0
) -> list[Any]:
    """Run ``fn(comm)`` on one thread per communicator, then close them all."""
    n = len(comms)
    results: list[Any] = [None] * n
    errors: list[BaseException | None] = [None] * n

    def body(r: int) -> None:
        try:
            results[r] = fn(comms[r])
        except BaseException as exc:
            errors[r] = exc

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    try:
        if any(t.is_alive() for t in threads):
            raise TimeoutError("thread ranks did not finish")
        for exc in errors:
            if exc is not None:
                raise exc
        return results
    finally:
        for c in comms:
            c.close()
