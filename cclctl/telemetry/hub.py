"""The per-process telemetry facade the runtime (and the PyTorch integration) talks to.

:class:`Telemetry` is the hot-path :class:`~.recorder.Recorder` plus the process's identity
and the slow parts that run beside it: snapshots, dumps, the status publisher and the
Prometheus exporter. No thread starts until asked; :meth:`Telemetry.close` stops them.

Every dump goes to one folder, :attr:`Telemetry.dump_dir`: ``cfg.trace_dir`` when the
operator named one, else the job's own folder (:func:`cclctl.config.job_dir`), so a rank
always leaves its evidence somewhere ``cclctl diagnose hang`` finds it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from cclctl import __version__
from cclctl.config import RuntimeConfig, job_dir
from cclctl.errors import CclError, UsageError
from cclctl.probe_record import ProbeRecord
from cclctl.records import RankSnapshot
from cclctl.revocation import Revocation
from cclctl.telemetry import dump_files, dumps
from cclctl.telemetry.counter_sources import CounterSources, LinkSource
from cclctl.telemetry.counters import MetricsView, StoreCounts, summarize
from cclctl.telemetry.recorder import Recorder
from cclctl.telemetry.stack_capture import capture_stacks
from cclctl.telemetry.status import StatusPublisher, StatusStore
from cclctl.telemetry.windows import Windows

if TYPE_CHECKING:
    from cclctl.telemetry.exporter import MetricsExporter

log = logging.getLogger("cclctl.telemetry")

SNAPSHOT_KINDS = ("status", "dump")


class Telemetry:
    """Counters, flight recorder, dumps, status and metrics of one process (one per rank).

    It holds the process's :class:`~.recorder.Recorder` (:attr:`recorder`) and offers its
    methods as its own: they are the recorder's bound methods, set once here, so the hot path
    (:attr:`start`, a bare ``deque.append``) pays no extra call.
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
        #: the counters telemetry reads from the transports and the store when it looks
        self.sources = CounterSources()
        #: the slowness signals' windows, fed by every fold (see telemetry/windows.py)
        windows = self.windows = Windows(cfg.slow_window_s, self.sources.peer_totals)
        recorder = self.recorder = Recorder(cfg.trace_buffer, world_size, windows)
        self.start = recorder.start
        self.register_comm, self.queued, self.fold = (
            recorder.register_comm,
            recorder.queued,
            recorder.fold,
        )
        self.link_bytes, self.count_error = recorder.link_bytes, recorder.count_error
        self.count_retry, self.count_hang = recorder.count_retry, recorder.count_hang
        self.inflight, self.records = recorder.inflight, recorder.records
        self.last_finished, self.comm_infos = recorder.last_finished, recorder.comm_infos
        self.signals, self.failures = recorder.signals, recorder.failures
        self.recovered, self.copy_counters = recorder.recovered, recorder.copy_counters
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.backend = backend
        self.metrics_url = ""
        self.heartbeat_ns = 0
        #: where dumps and the final document go (see the module doc)
        self.dump_dir = cfg.trace_dir or job_dir(cfg.job)
        self._publisher: StatusPublisher | None = None
        self._exporter: MetricsExporter | None = None
        self._hooks: list[Callable[[], None]] = []
        self._dump_lock = threading.Lock()
        self._ended = False  # an ending dump was written (uncaught, terminated, exit)
        self._close_lock = threading.Lock()
        self._closed = False
        #: the job's failure as this rank adopted it (the runtime's), for statuses and dumps
        self.revoke_source: Callable[[], Revocation | None] | None = None
        self._finished = False
        #: why this process ends other than cleanly, once it knows ("uncaught RuntimeError:
        #: ...", "terminated by SIGTERM"): its statuses say so from then on, never "closed"
        self.exit_reason = ""
        #: where the runtime's transports add the time they block on each peer (a
        #: communicator reads it when its tracer is set)
        self.peer_waits = self.sources.peer_waits
        #: the last probe this rank published (see set_probe), for the exporter
        self._probe: ProbeRecord | None = None

    # -- reading -------------------------------------------------------------------------

    def metrics_view(self) -> MetricsView:
        """A consistent copy of every counter, for the exporter and status summaries."""
        ops, comms, links = self.copy_counters()
        sources = self.sources
        sources.add_link_bytes(links)
        publisher = self._publisher
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

    def publish_document(self, key: str, value: bytes) -> bool:
        """Write ``value`` under ``key`` in the job's store, on the status publisher's
        connection (the job's scope); False when not publishing or the store refused. A
        probe's document goes there, beside the statuses ``top`` reads."""
        publisher = self._publisher
        if publisher is None:
            return False
        try:
            publisher.store.set(key, value)
        except Exception as exc:  # never let a store problem reach the job
            log.debug("cclctl: publishing %s failed: %s", key, exc)
            return False
        return True

    def add_store_source(self, source: Callable[[], StoreCounts]) -> None:
        """On the rank that hosts the job's store: read what it turned away, at scrape time."""
        self.sources.store = source

    def add_link_source(self, source: LinkSource) -> None:
        """Read per-peer link bytes from a transport that already counts them.

        The transport's counters are read only when metrics or a status are built, so the
        hot path pays nothing for per-peer accounting.
        """
        self.sources.links.append(source)

    def add_vias(self, vias: dict[int, str]) -> None:
        """Say how each peer (a job rank) is reached, ``shm`` or ``tcp``, for the signals."""
        self.sources.vias.update(vias)

    def add_auth_failure_source(self, source: Callable[[], int]) -> None:
        """Read how many link handshakes the transport refused (a stranger, a wrong token)."""
        self.sources.auth_failures.append(source)

    def add_resume_source(self, source: Callable[[], Sequence[int]]) -> None:
        """Read how many links to each peer the transport made again after a reset."""
        self.sources.resumes.append(source)

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
            reason = reason or self.exit_reason or ("closed" if self._closed else "")
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
        )

    @property
    def revoke(self) -> Revocation | None:
        """The job's revoke record once this rank adopted it; its documents carry it."""
        return self.revoke_source() if self.revoke_source is not None else None

    @revoke.setter
    def revoke(self, record: Revocation | None) -> None:
        self.revoke_source = lambda: record

    # -- dumps ---------------------------------------------------------------------------

    def dump_path(self, path: str | None = None) -> str:
        """Where :meth:`dump` writes: ``path`` if it names a ``.json`` file, else the standard
        file name (``cclctl-<job>-rank<r>.json``) inside ``path`` or :attr:`dump_dir`.
        """
        target = path or self.dump_dir
        if target.endswith(".json") and not os.path.isdir(target):
            return target
        return os.path.join(target, dump_files.dump_filename(self.cfg.job, self.rank))

    def dump(self, reason: str, path: str | None = None) -> str:
        """Write the flight recorder as one JSON document (atomically); returns the path.

        Raises :class:`~cclctl.errors.CclError` if the file cannot be written.
        """
        target = self.dump_path(path)
        ending = dumps.ends_process(reason)
        with self._dump_lock:  # one at a time, each snapshot taken as its turn comes
            if self._ended and not ending:
                return target  # the process's last word stands (it holds more than this)
            dump_files.write_atomic(target, self.snapshot("dump", reason).to_json())
            self._ended = self._ended or ending
        return target

    def remove_stale_dumps(self) -> list[str]:
        """At a job's start: remove an earlier run's documents from :attr:`dump_dir` (this
        rank's own; rank 0 also those of ranks beyond this world size). Returns them."""
        return dump_files.remove_stale(self.dump_dir, self.cfg.job, self.rank, self.world_size)

    def install_signal_dump(
        self, directory: str | None = None, signum: int = signal.SIGUSR1
    ) -> None:
        """Dump on SIGUSR1 (or ``signum``) into ``directory`` or :attr:`dump_dir`. Main
        thread only; a previous handler keeps being called.
        """
        self._hooks.append(dumps.install_signal_dump(self, directory, signum))

    def install_termination_dump(self, directory: str | None = None) -> None:
        """Dump on SIGTERM (as a launcher stops ranks), then terminate. Main thread only."""
        self._hooks.append(dumps.install_termination_dump(self, directory))

    def install_exit_dump(self, directory: str | None = None) -> None:
        """Dump if the process dies of an uncaught exception or exits after errors/hangs.

        The hooks outlive :meth:`close` on purpose: a ``finally`` that closes telemetry runs
        before the exception reaches ``sys.excepthook``. An uncaught cclctl error prints
        as its one line unless ``cfg.debug`` (``CCLCTL_DEBUG=1``) asks for the traceback.
        """
        self._hooks.append(dumps.install_exit_dump(self, directory, not self.cfg.debug))

    def remove_hooks(self) -> None:
        """Undo :meth:`install_signal_dump` and :meth:`install_exit_dump`."""
        hooks, self._hooks = self._hooks, []
        for undo in reversed(hooks):
            undo()

    # -- background services -------------------------------------------------------------

    def _status_payload(self) -> bytes:
        return self.snapshot("status").to_json().encode()

    def publish_to(
        self, store: StatusStore, interval_s: float | None = None, prefix: str = "status/"
    ) -> None:
        """Start publishing ``<prefix><rank>`` every ``interval_s`` (``cfg.status_interval_s``)."""
        if self._closed:
            raise UsageError("telemetry is closed; it cannot publish any more")
        if self._publisher is not None:
            raise UsageError("this process already publishes its status")
        interval = self.cfg.status_interval_s if interval_s is None else interval_s
        if not interval > 0:
            raise UsageError(f"status interval must be positive, not {interval!r}")
        publisher = StatusPublisher(store, f"{prefix}{self.rank}", self._status_payload, interval)
        self._publisher = publisher
        publisher.start()

    def publish_now(self) -> bool:
        """Publish the status at once (the watchdog does after a hang); False if not
        publishing or the store refused.
        """
        publisher = self._publisher
        return publisher is not None and publisher.publish()

    def serve_metrics(self, port: int | None = None) -> str | None:
        """Serve Prometheus metrics on ``cfg.metrics_addr:(cfg.metrics_port + local_rank)``.

        ``port`` overrides that (0 picks a free port). Returns the URL, or None when
        ``cfg.metrics_port`` is 0 and no port is given. Raises ConfigError if it cannot bind.
        """
        if port is None:
            if not self.cfg.metrics_port:
                return None
            port = self.cfg.metrics_port + self.local_rank
        if self._closed:
            raise UsageError("telemetry is closed; it cannot serve metrics any more")
        if self._exporter is None:
            from cclctl.telemetry.exporter import MetricsExporter

            self._exporter = MetricsExporter(self.metrics_view)
        bound = self._exporter.start(self.cfg.metrics_addr, port)
        self.metrics_url = f"http://{self._url_host()}:{bound}/metrics"
        return self.metrics_url

    def _url_host(self) -> str:
        addr = self.cfg.metrics_addr
        if addr in ("", "0.0.0.0", "::"):
            return self.cfg.hostname  # listening everywhere: name the host others can reach
        return f"[{addr}]" if ":" in addr else addr

    def finish(self) -> str | None:
        """Close as a rank that is done, so readers see it finished, not missing.

        After a clean run (no failed or hung call, no revoke record, no exception on its way
        out, no :attr:`exit_reason`) the last status and a final document in :attr:`dump_dir`
        (counters and last records, no stacks) carry ``finished=True``; returns that
        document's path. Otherwise this is :meth:`close`, and the failure's own dump stays
        the evidence.
        """
        if self._closed:
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

    def close(self) -> None:
        """Publish a last status and stop the publisher and exporter. Safe to call twice;
        counters, the ring and dumps keep working afterwards.
        """
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        if self._publisher is not None:
            self._publisher.stop()
        if self._exporter is not None:
            self._exporter.stop()
            self.metrics_url = ""
