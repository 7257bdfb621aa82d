"""The per-process telemetry facade the runtime (and the PyTorch integration) talks to.

:class:`Telemetry` is the hot-path :class:`~.recorder.Recorder` plus the process's identity
and the slow parts that run beside it: snapshots, dumps (:mod:`.rank_dumps`), the status
publisher and the Prometheus exporter (:mod:`.services`). No thread starts until asked;
:meth:`Telemetry.close` stops them.

Every dump goes to one folder, :attr:`Telemetry.dump_dir`: ``cfg.trace_dir`` when the
operator named one, else the job's own folder (:func:`cclctl.config.job_dir`), so a rank
always leaves its evidence somewhere ``cclctl diagnose hang`` finds it.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable

from cclctl import __version__
from cclctl.config import RuntimeConfig
from cclctl.endings import ending_of
from cclctl.errors import CclError, UsageError
from cclctl.probe_record import ProbeRecord
from cclctl.records import RankSnapshot
from cclctl.revocation import Revocation
from cclctl.telemetry import dump_files
from cclctl.telemetry.counter_sources import CounterSources
from cclctl.telemetry.counters import MetricsView, summarize
from cclctl.telemetry.rank_dumps import RankDumps
from cclctl.telemetry.recorder import Recorder
from cclctl.telemetry.services import Services
from cclctl.telemetry.stack_capture import capture_stacks
from cclctl.telemetry.windows import Windows

log = logging.getLogger("cclctl.telemetry")

SNAPSHOT_KINDS = ("status", "dump")


class Telemetry:
    """Counters, flight recorder, dumps, status and metrics of one process (one per rank).

    It holds the process's :class:`~.recorder.Recorder` (:attr:`recorder`), its counter
    sources, its dumps and its background services, and offers their methods as its own:
    they are the parts' bound methods, set once here, so the hot path (:attr:`start`, a bare
    ``deque.append``) pays no extra call.
    """

    def __init__(
        self,
        cfg: RuntimeConfig,
        *,
        rank: int,
        world_size: int,
        local_rank: int = 0,
        backend: str = "cclctl",
    ) -> None:
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.backend = backend
        self.heartbeat_ns = 0
        #: the job's failure as this rank adopted it (the runtime's), for statuses and dumps
        self.revoke_source: Callable[[], Revocation | None] | None = None
        self._finished = False
        #: why this process ends other than cleanly, once it knows ("uncaught RuntimeError:
        #: ...", "terminated by SIGTERM"): its statuses say so from then on, never "closed"
        self.exit_reason = ""
        #: the last probe this rank published (see set_probe), for the exporter
        self._probe: ProbeRecord | None = None
        #: the counters telemetry reads from the transports and the store when it looks
        self.sources = CounterSources()
        #: where the runtime's transports add the time they block on each peer (a
        #: communicator reads it when its tracer is set)
        self.peer_waits = self.sources.peer_waits
        #: the slowness signals' windows, fed by every fold (see telemetry/windows.py)
        self.windows = Windows(cfg.slow_window_s, self.sources.peer_totals)
        self.recorder = Recorder(cfg.trace_buffer, world_size, self.windows)
        #: this rank's dumps (see rank_dumps.py)
        self.rank_dumps = RankDumps(
            cfg, rank, world_size, self.snapshot, self.recorder.failures, self.recorder.recovered
        )
        #: where dumps and the final document go (see the module doc)
        self.dump_dir = self.rank_dumps.dump_dir
        #: the status publisher and the exporter (see services.py)
        self.services = Services(cfg, rank, local_rank, self._status_payload, self.metrics_view)
        self._offer(self.recorder, self.sources, self.rank_dumps, self.services)

    def _offer(
        self, recorder: Recorder, sources: CounterSources, dumps: RankDumps, services: Services
    ) -> None:
        """Offer the parts' methods as this object's own: their bound methods, set once, so
        a call pays nothing for going through here (the hot path: :attr:`start`)."""
        self.start = recorder.start
        self.register_comm, self.queued = recorder.register_comm, recorder.queued
        self.fold, self.link_bytes = recorder.fold, recorder.link_bytes
        self.count_error, self.count_retry = recorder.count_error, recorder.count_retry
        self.count_hang, self.inflight = recorder.count_hang, recorder.inflight
        self.records, self.last_finished = recorder.records, recorder.last_finished
        self.comm_infos, self.signals = recorder.comm_infos, recorder.signals
        self.failures, self.recovered = recorder.failures, recorder.recovered
        self.copy_counters = recorder.copy_counters
        self.add_store_source, self.add_link_source = (
            sources.add_store_source,
            sources.add_link_source,
        )
        self.add_vias, self.add_resume_source = sources.add_vias, sources.add_resume_source
        self.add_auth_failure_source = sources.add_auth_failure_source
        self.dump_path, self.dump = dumps.dump_path, dumps.dump
        self.remove_stale_dumps, self.remove_hooks = dumps.remove_stale_dumps, dumps.remove_hooks
        self.install_signal_dump = dumps.install_signal_dump
        self.install_termination_dump = dumps.install_termination_dump
        self.install_exit_dump = dumps.install_exit_dump
        self.publish_to, self.publish_now = services.publish_to, services.publish_now
        self.publish_document = services.publish_document
        self.serve_metrics, self.close = services.serve_metrics, services.close

    @property
    def metrics_url(self) -> str:
        """Where this rank serves its metrics while it does ("" otherwise)."""
        return self.services.metrics_url

    # -- reading -------------------------------------------------------------------------

    def metrics_view(self) -> MetricsView:
        """A consistent copy of every counter, for the exporter and status summaries."""
        ops, comms, links = self.copy_counters()
        sources = self.sources
        sources.add_link_bytes(links)
        publisher = self.services.publisher
        return MetricsView(
            job=self.cfg.job,
            rank=self.rank,
            host=self.cfg.hostname,
            backend=self.backend,
            version=__version__,
            ops=ops,
            comms=comms,
            links=links,
            heartbeat_ns=self.heartbeat_ns,
            publish_errors=publisher.errors if publisher else 0,
            store=sources.store_counts(),
            link_auth_failures=sources.auth_failure_count(),
            store_reconnects=publisher.reconnects if publisher else 0,
            store_gap_s=publisher.gap_s if publisher else 0.0,
            link_resumes=sources.link_resumes(),
            peer_waits=sources.peer_waits.copy(),
            probe=self._probe,
        )

    def set_probe(self, record: ProbeRecord) -> None:
        """The probe rank 0 just ran (see :mod:`cclctl.probe_record`): the exporter
        publishes its links from now on, in place of the last probe's."""
        self._probe = record

    def snapshot(self, kind: str = "status", reason: str = "") -> RankSnapshot:
        """This rank's state as a status record (the calls in flight and the last finished
        call of each communicator, and a heartbeat) or a dump (the whole ring and every
        thread's Python stack, taken by the calling thread). ``inflight``
        is the oldest call in flight. The last status of a closed process says "closed", so
        a reader can tell a rank that finished from one that died.
        """
        if kind not in SNAPSHOT_KINDS:
            raise UsageError(f"snapshot kind must be 'status' or 'dump', not {kind!r}")
        now = time.time_ns()
        if kind == "status":
            self.heartbeat_ns = now
        inflight = self.inflight()
        if kind == "status":
            records = sorted(
                self.last_finished() + inflight, key=lambda r: (r.start_ns, r.comm, r.seq)
            )
            reason = reason or self.exit_reason or ("closed" if self.services.closed else "")
        else:
            records = self.records()
        return RankSnapshot(
            kind=kind,
            job=self.cfg.job,
            rank=self.rank,
            world_size=self.world_size,
            host=self.cfg.hostname,
            pid=os.getpid(),
            time_ns=now,
            comms=self.comm_infos(),
            records=records,
            inflight=inflight[0] if inflight else None,
            reason=reason,
            counters=summarize(self.metrics_view()),
            metrics_url=self.metrics_url,
            stacks=capture_stacks() if kind == "dump" else [],
            revoke=self.revoke,
            finished=self._finished and kind == "status",
            signals=self.signals(),
            ending=ending_of(reason),
        )

    def _status_payload(self) -> bytes:
        return self.snapshot("status").to_json().encode()

    @property
    def revoke(self) -> Revocation | None:
        """The job's revoke record once this rank adopted it; its documents carry it."""
        return self.revoke_source() if self.revoke_source is not None else None

    @revoke.setter
    def revoke(self, record: Revocation | None) -> None:
        self.revoke_source = lambda: record

    # -- ending -------------------------------------------------------------------------

    def finish(self) -> str | None:
        """Close as a rank that is done, so readers see it finished, not missing.

        After a clean run (no failed or hung call, no revoke record, no exception on its way
        out, no :attr:`exit_reason`) the last status and a final document in :attr:`dump_dir`
        (counters and last records, no stacks) carry ``finished=True``; returns that
        document's path. Otherwise this is :meth:`close`, and the failure's own dump stays
        the evidence.
        """
        if self.services.closed:
            return None
        clean = (
            self.failures() == 0
            and self.revoke is None
            and sys.exc_info()[1] is None
            and not self.exit_reason
        )
        self._finished = clean  # before close: the publisher's last status carries it
        self.close()
        if not clean:
            return None
        path = self.dump_path()
        try:
            dump_files.write_atomic(path, self.snapshot("status", "finished").to_json())
        except CclError as exc:  # a clean exit must stay clean
            log.warning("cclctl: final status not written: %s", exc)
            return None
        return path
