"""The threads that run beside a rank's hot path: the status publisher and the Prometheus
exporter, each started when asked, both stopped once by :meth:`Services.close`.

:class:`~.hub.Telemetry` holds one (:attr:`~.hub.Telemetry.services`) and offers its
methods, bound once, as its own. The exporter's module is imported only when metrics are
served, so a process that serves none never imports prometheus_client.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from cclctl.config import RuntimeConfig
from cclctl.errors import UsageError
from cclctl.telemetry.counters import MetricsView
from cclctl.telemetry.status import StatusPublisher, StatusStore

if TYPE_CHECKING:
    from cclctl.telemetry.exporter import MetricsExporter

log = logging.getLogger("cclctl.telemetry")


class Services:
    """The status publisher and the metrics exporter of one rank: ``status`` makes the
    payload each publish writes, ``metrics_view`` is what each scrape reads."""

    def __init__(
        self,
        cfg: RuntimeConfig,
        rank: int,
        local_rank: int,
        status: Callable[[], bytes],
        metrics_view: Callable[[], MetricsView],
    ) -> None:
        self.cfg = cfg
        self.rank = rank
        self.local_rank = local_rank
        self._status = status
        self._metrics_view = metrics_view
        #: where metrics are served while they are ("" otherwise)
        self.metrics_url = ""
        #: the status publisher once :meth:`publish_to` started it (its counts feed metrics)
        self.publisher: StatusPublisher | None = None
        #: the exporter once :meth:`serve_metrics` made it
        self.exporter: MetricsExporter | None = None
        self._close_lock = threading.Lock()
        #: :meth:`close` ran: nothing starts any more, and statuses say "closed"
        self.closed = False

    def publish_to(
        self, store: StatusStore, interval_s: float | None = None, prefix: str = "status/"
    ) -> None:
        """Start publishing ``<prefix><rank>`` every ``interval_s`` (``cfg.status_interval_s``)."""
        if self.closed:
            raise UsageError("telemetry is closed; it cannot publish any more")
        if self.publisher is not None:
            raise UsageError("this process already publishes its status")
        interval = self.cfg.status_interval_s if interval_s is None else interval_s
        if not interval > 0:
            raise UsageError(f"status interval must be positive, not {interval!r}")
        publisher = StatusPublisher(store, f"{prefix}{self.rank}", self._status, interval)
        self.publisher = publisher
        publisher.start()

    def publish_now(self) -> bool:
        """Publish the status at once (the watchdog does after a hang); False if not
        publishing or the store refused.
        """
        publisher = self.publisher
        return publisher is not None and publisher.publish()

    def publish_document(self, key: str, value: bytes) -> bool:
        """Write ``value`` under ``key`` in the job's store, on the status publisher's
        connection (the job's scope); False when not publishing or the store refused. A
        probe's document goes there, beside the statuses ``top`` reads."""
        publisher = self.publisher
        if publisher is None:
            return False
        try:
            publisher.store.set(key, value)
        except Exception as exc:  # never let a store problem reach the job
            log.debug("cclctl: publishing %s failed: %s", key, exc)
            return False
        return True

    def serve_metrics(self, port: int | None = None) -> str | None:
        """Serve Prometheus metrics on ``cfg.metrics_addr:(cfg.metrics_port + local_rank)``.

        ``port`` overrides that (0 picks a free port). Returns the URL, or None when
        ``cfg.metrics_port`` is 0 and no port is given. Raises ConfigError if it cannot bind.
        """
        if port is None:
            if not self.cfg.metrics_port:
                return None
            port = self.cfg.metrics_port + self.local_rank
        if self.closed:
            raise UsageError("telemetry is closed; it cannot serve metrics any more")
        if self.exporter is None:
            from cclctl.telemetry.exporter import MetricsExporter

            self.exporter = MetricsExporter(self._metrics_view)
        bound = self.exporter.start(self.cfg.metrics_addr, port)
        self.metrics_url = f"http://{self._url_host()}:{bound}/metrics"
        return self.metrics_url

    def _url_host(self) -> str:
        addr = self.cfg.metrics_addr
        if addr in ("", "0.0.0.0", "::"):
            return self.cfg.hostname  # listening everywhere: name the host others can reach
        return f"[{addr}]" if ":" in addr else addr

    def close(self) -> None:
        """Publish a last status and stop the publisher and exporter. Safe to call twice;
        counters, the ring and dumps keep working afterwards.
        """
        with self._close_lock:
            if self.closed:
                return
            self.closed = True
        if self.publisher is not None:
            self.publisher.stop()
        if self.exporter is not None:
            self.exporter.stop()
            self.metrics_url = ""
