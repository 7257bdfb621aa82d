"""One rank's per-process services, shared by every front end of that rank.

The agent owns the telemetry (counters, flight recorder, dumps and their triggers, exporter),
the watchdog,
the status line to the job's store (publisher and dump requests, :mod:`.status_link`) and
the revoke end. A front end registers its communicators with :meth:`Agent.register`, with
the :class:`FailureHooks` the watchdog calls for their calls, and takes the services it
needs: the first that asks starts one, the others get the same. The last front end to
:meth:`~Agent.release` the agent ends them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from cclctl.config import RuntimeConfig
from cclctl.records import CollectiveRecord
from cclctl.runtime.agent.status_link import Placement, StatusLink
from cclctl.telemetry.hub import Telemetry
from cclctl.telemetry.watchdog import Watchdog

log = logging.getLogger("cclctl.agent")

Hook = Callable[[CollectiveRecord, str], None]
Undo = Callable[[], None]


@dataclass(frozen=True)
class FailureHooks:
    """What a front end does when the watchdog expires one of its calls (``expired``),
    and under the ``abort`` policy (``abort``)."""

    expired: Hook
    abort: Hook | None = None


class RevokeEnd(Protocol):
    """This rank's end of the job's revoke record (a listener thread on the store)."""

    def close(self) -> None: ...


class Agent:
    """The services of rank ``rank`` of a job of ``world_size`` in this process."""

    def __init__(
        self,
        cfg: RuntimeConfig,
        rank: int,
        world_size: int,
        local_rank: int = 0,
        backend: str = "cclctl",
    ) -> None:
        self.cfg = cfg
        self.rank = rank
        self.telemetry = Telemetry(
            cfg, rank=rank, world_size=world_size, local_rank=local_rank, backend=backend
        )
        self.status: StatusLink | None = None
        self.watchdog: Watchdog | None = None
        self.revoke: RevokeEnd | None = None
        self.metrics_url: str | None = None
        self._hooks: dict[str, FailureHooks] = {}
        self._default: FailureHooks | None = None
        self._lock = threading.RLock()
        self._users = 0
        self._dumps_installed = False
        self.closed = False

    # -- front ends -----------------------------------------------------------------------

    def acquire(self) -> Agent:
        """One more front end uses this agent (see :meth:`release`)."""
        with self._lock:
            self._users += 1
        return self

    def register(self, comm_id: str, ranks: Sequence[int], hooks: FailureHooks) -> None:
        """Count the calls of communicator ``comm_id`` (members ``ranks``) and send the
        watchdog's expiries of its calls to ``hooks`` (a front end's first registration
        also takes the calls of communicators nobody registered)."""
        self.telemetry.register_comm(comm_id, list(ranks))
        with self._lock:
            self._hooks[comm_id] = hooks
            if self._default is None:
                self._default = hooks

    def hooks_of(self, rec: CollectiveRecord) -> FailureHooks | None:
        """The hooks of the front end whose communicator ``rec`` belongs to."""
        with self._lock:
            return self._hooks.get(rec.comm, self._default)

    # -- services -------------------------------------------------------------------------

    def attach(self, rdzv: Placement) -> StatusLink:
        """The status line to the job's store of ``rdzv``: one publisher for
        ``status/<rank>``, one dump-request poller, however many front ends ask."""
        with self._lock:
            if self.status is None:
                self.status = StatusLink(rdzv, self.cfg, self.telemetry)
            return self.status

    def watch(self, outcome: str = "") -> Watchdog:
        """The process's watchdog, started by the first front end that asks; ``outcome``
        says in its log line what follows an expiry (see :class:`Watchdog`)."""
        with self._lock:
            if self.watchdog is None:
                self.watchdog = Watchdog(
                    self.telemetry,
                    self.cfg.timeout_s,
                    self.cfg.on_hang,
                    on_abort=self._abort,
                    on_expire=self._expired,
                    outcome=outcome,
                ).start()
            return self.watchdog

    def install_dumps(self, install: Callable[[], list[Undo]]) -> list[Undo]:
        """The process's dump triggers (signals, exit), installed by the first front end
        that asks (``install()``, which returns how to undo them); [] for the others."""
        with self._lock:
            if self._dumps_installed:
                return []
            self._dumps_installed = True
        return install()

    def serve_metrics(self) -> str | None:
        """Serve the exporter once (when a port is configured); its URL or None."""
        with self._lock:
            if self.metrics_url is None:
                self.metrics_url = self.telemetry.serve_metrics() or ""
            return self.metrics_url or None

    def revoke_end(self, make: Callable[[], RevokeEnd]) -> RevokeEnd:
        """The process's one revoke end: ``make()``'s, unless a front end made one first."""
        with self._lock:
            if self.revoke is None:
                self.revoke = make()
            return self.revoke

    def request_dump(self, why: str) -> None:
        """Ask every rank of the job to dump (nothing without a status line)."""
        if self.status is not None:
            self.status.request_dump(why)

    def _expired(self, rec: CollectiveRecord, why: str) -> None:
        hooks = self.hooks_of(rec)
        if hooks is not None:
            hooks.expired(rec, why)

    def _abort(self, rec: CollectiveRecord, why: str) -> None:
        hooks = self.hooks_of(rec)
        if hooks is not None and hooks.abort is not None:
            hooks.abort(rec, why)

    # -- end ------------------------------------------------------------------------------

    def release(self) -> bool:
        """A front end is done; the last one ends every service (final status first, so
        it says "finished" after a clean run). True when this call ended them."""
        with self._lock:
            self._users -= 1
            if self._users > 0 or self.closed:
                return False
            self.closed = True
        try:
            if self.watchdog is not None:
                self.watchdog.stop()
            self.telemetry.finish()
        finally:
            try:
                if self.revoke is not None:
                    self.revoke.close()  # the store may already be gone
            except Exception:
                log.exception("cclctl: closing the revoke end failed")
            finally:
                if self.status is not None:
                    self.status.close()
        return True
