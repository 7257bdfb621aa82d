"""A rank's status line to its job's store: the publisher and the dump-request poller.

Both run on a store connection of their own, so a rank whose main thread is blocked on the
store (or in a gloo or NCCL call) still shows a fresh heartbeat and still dumps when the job
asks.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

from cclctl.config import RuntimeConfig
from cclctl.runtime.agent.dump_requests import DumpRequests, request_dump
from cclctl.store.backends import open_store
from cclctl.store.kv import KeyValueStore
from cclctl.store.scope import ScopedStore
from cclctl.telemetry.counters import StoreCounts
from cclctl.telemetry.hub import Telemetry


class StoreCounted(Protocol):
    """A store this rank hosts: what it turned away."""

    @property
    def rejected(self) -> dict[str, int]: ...
    @property
    def refused(self) -> int: ...


class Placement(Protocol):
    """This rank's place in the job, as a rendezvous
    (:class:`~cclctl.runtime.job.rendezvous.Rendezvous`) gives it."""

    rank: int
    local_rank: int
    job: str
    token: str
    store: KeyValueStore

    @property
    def server(self) -> StoreCounted | None: ...


class StatusLink:
    """Publishes ``telemetry``'s status under the job of ``rdzv`` and dumps on request."""

    def __init__(self, rdzv: Placement, cfg: RuntimeConfig, telemetry: Telemetry) -> None:
        self.rdzv = rdzv
        self.client = open_store(
            rdzv.store.address,
            timeout_s=cfg.timeout_s,
            connect_timeout_s=cfg.connect_timeout_s,
            token=rdzv.token or None,
        )
        self.signals = ScopedStore.for_job(self.client, rdzv.job)
        server = rdzv.server
        if server is not None:  # the rank that hosts the store shows what it turned away
            telemetry.add_store_source(lambda: StoreCounts(server.rejected, server.refused))
        try:
            telemetry.publish_to(ScopedStore.for_job(self.client, rdzv.job))
            self.requests = DumpRequests(self.signals, telemetry, rdzv.rank).start()
        except BaseException:
            with contextlib.suppress(Exception):
                self.client.close()
            raise

    @property
    def address(self) -> str:
        return self.rdzv.store.address

    def request_dump(self, why: str) -> None:
        """Ask every rank of the job to dump its flight recorder (after a hang)."""
        request_dump(self.signals, self.rdzv.rank, why)

    def close(self) -> None:
        """Stop polling and close the connection (the rendezvous stays its owner's)."""
        self.requests.stop()
        self.client.close()
