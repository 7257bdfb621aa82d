"""An instrumented torch job's place in cclctl's store: live status and job-wide dumps.

``cclctl top --store`` and ``cclctl diagnose hang --store`` read ``cclctl/<job>/status/<rank>``
from a cclctl store, which lists keys by prefix; torch's own TCPStore cannot, so the job gets
a cclctl store beside it, found as :func:`cclctl.config.attach_from_env` says: the one
``cclctl launch`` runs (``CCLCTL_STORE``), else one that rank 0 hosts on ``MASTER_PORT + 1``.
Joining reuses the runtime's rendezvous (world-size agreement, rank claims), so a second job
or a duplicate rank on the same store is caught as it is for cclctl's own runtime.
"""

from __future__ import annotations

import contextlib
import sys

from cclctl.config import RuntimeConfig, attach_from_env
from cclctl.runtime.job.rendezvous import Rendezvous, join
from cclctl.runtime.job.signals import DumpRequests, request_dump
from cclctl.store.client import StoreClient
from cclctl.store.scope import ScopedStore
from cclctl.telemetry.counters import StoreCounts
from cclctl.telemetry.hub import Telemetry

#: torch's init_process_group has just lined the ranks up, so they reach cclctl's store
#: together; a store that does not answer by then is missing, and the job must not wait.
ATTACH_TIMEOUT_S = 15.0


class StoreAttachment:
    """The rendezvous, the publisher's own connection and the dump-request poller."""

    def __init__(
        self, rdzv: Rendezvous, client: StoreClient, requests: DumpRequests, local_rank: int
    ) -> None:
        self.rdzv = rdzv
        self.client = client
        self.requests = requests
        self.local_rank = local_rank
        self.signals = ScopedStore.for_job(client, rdzv.job)

    @property
    def address(self) -> str:
        return self.rdzv.store.address

    def request_dump(self, why: str) -> None:
        """Ask every rank of the job to dump its flight recorder (after a hang)."""
        request_dump(self.signals, self.rdzv.rank, why)

    def close(self) -> None:
        """Leave the store; the rank that hosts it waits for the others to leave first."""
        self.requests.stop()
        try:
            self.client.close()
        finally:
            self.rdzv.close()


def attach(
    telemetry: Telemetry, cfg: RuntimeConfig, rank: int, world_size: int
) -> StoreAttachment | None:
    """Join the job's store and start publishing; None when no store can be found.

    The publisher has a store connection of its own, as in the runtime, so a rank whose
    main thread is blocked (in a gloo or NCCL call) still shows a fresh heartbeat.
    """
    where = attach_from_env(rank, world_size)
    if where is None:
        return None
    rdzv = join(where, cfg.replace(connect_timeout_s=min(cfg.connect_timeout_s, ATTACH_TIMEOUT_S)))
    try:
        client = StoreClient(
            rdzv.store.host,
            rdzv.store.port,
            timeout_s=cfg.timeout_s,
            connect_timeout_s=cfg.connect_timeout_s,
            token=rdzv.token or None,
        )
    except BaseException:
        rdzv.close()
        raise
    server = rdzv.server
    if server is not None:  # rank 0 hosts the store: its exporter shows what it turned away
        telemetry.add_store_source(lambda: StoreCounts(server.rejected, server.refused))
    try:
        telemetry.publish_to(ScopedStore.for_job(client, rdzv.job))
        requests = DumpRequests(ScopedStore.for_job(client, rdzv.job), telemetry, rank).start()
    except BaseException:
        with contextlib.suppress(Exception):
            client.close()
        rdzv.close()
        raise
    attachment = StoreAttachment(rdzv, client, requests, where.local_rank)
    if rank == 0:
        print(
            f"cclctl: job {rdzv.job!r} publishes its status to {attachment.address}: "
            f"cclctl top --store {attachment.address} --job {rdzv.job}",
            file=sys.stderr,
            flush=True,
        )
    return attachment
