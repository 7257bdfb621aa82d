"""A rank's status line to its job's store: the publisher and the dump-request poller.

Both run on a store connection of their own, so a rank whose main thread is blocked on the
store (or in a gloo or NCCL call) still shows a fresh heartbeat and still dumps when the job
asks. With ``CCLCTL_HOST_AGENT`` on (a job's default) the status goes through the host's
agent (:mod:`cclctl.runtime.hostagent`), which the host's first local rank starts here, and
that connection is opened only when a request needs it (no agent answers, the last status).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Protocol

from cclctl.config import RuntimeConfig, job_dir
from cclctl.runtime.agent.dump_requests import DumpRequests, SignalStore, request_dump
from cclctl.runtime.hostagent.address import socket_name
from cclctl.runtime.hostagent.spawn import start_agent
from cclctl.store.backends import open_store
from cclctl.store.kv import KeyValueStore
from cclctl.store.lazy import LazyStore
from cclctl.store.scope import ScopedStore
from cclctl.telemetry.counters import StoreCounts
from cclctl.telemetry.hub import Telemetry

if TYPE_CHECKING:  # the route reads the dump keys of this package: imported when used
    from cclctl.runtime.hostagent.route import AgentRoute


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
    hosts: list[str]  # every rank's host, by rank
    pids: list[int]  # every rank's pid, by rank

    @property
    def server(self) -> StoreCounted | None: ...


class StatusLink:
    """Publishes ``telemetry``'s status under the job of ``rdzv`` and dumps on request."""

    def __init__(self, rdzv: Placement, cfg: RuntimeConfig, telemetry: Telemetry) -> None:
        self.rdzv = rdzv
        address = rdzv.store.address

        def opened() -> KeyValueStore:
            return open_store(
                address,
                timeout_s=cfg.timeout_s,
                connect_timeout_s=cfg.connect_timeout_s,
                token=rdzv.token or None,
            )

        # Through the host's agent the status and the dump requests need no store
        # connection of the rank's own: it is opened when a request needs it (no agent).
        self.client: KeyValueStore = (
            LazyStore(address, opened, cfg.timeout_s) if cfg.host_agent else opened()
        )
        self.signals = ScopedStore.for_job(self.client, rdzv.job)
        server = rdzv.server
        if server is not None:  # the rank that hosts the store shows what it turned away
            telemetry.add_store_source(lambda: StoreCounts(server.rejected, server.refused))
        self.route: AgentRoute | None = None
        try:
            scoped = ScopedStore.for_job(self.client, rdzv.job)
            if cfg.host_agent:
                self.route = self._route(scoped, cfg)
            telemetry.publish_to(self.route or scoped)
            polled: SignalStore = self.signals
            if self.route is not None:
                from cclctl.runtime.hostagent.route import AgentSignals

                polled = AgentSignals(self.route, self.signals)
            self.requests = DumpRequests(polled, telemetry, rdzv.rank).start()
        except BaseException:
            with contextlib.suppress(Exception):
                self.client.close()
            raise

    def _route(self, scoped: ScopedStore, cfg: RuntimeConfig) -> AgentRoute:
        """The way through the host's agent (started here by the host's first local rank)."""
        from cclctl.runtime.hostagent.route import AgentRoute

        rdzv = self.rdzv
        if rdzv.local_rank == 0:
            start_agent(job=rdzv.job, store=self.address, token=rdzv.token, host=cfg.hostname,
                        interval_s=cfg.status_interval_s,
                        folder=cfg.trace_dir or job_dir(rdzv.job),
                        metrics=(cfg.metrics_addr, cfg.host_metrics_port))  # fmt: skip
        name = socket_name(rdzv.job, cfg.hostname, self.address, rdzv.token)
        return AgentRoute(scoped, name, rdzv.rank, f"status/{rdzv.rank}")

    @property
    def address(self) -> str:
        return self.rdzv.store.address

    def request_dump(self, why: str) -> None:
        """Ask every rank of the job to dump its flight recorder (after a hang)."""
        request_dump(self.signals, self.rdzv.rank, why)

    def close(self) -> None:
        """Stop polling and close the connection (the rendezvous stays its owner's)."""
        self.requests.stop()
        if self.route is not None:
            self.route.close()
        self.client.close()
