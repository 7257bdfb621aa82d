"""Prometheus exporter: serves a custom collector that reads the counters only when scraped.

The metric families are in :mod:`.exporter_families` (the counters) and
:mod:`.exporter_probe` (the last probe). Each process has
its own ``CollectorRegistry``, so nothing is global and tests can run several exporters
side by side. See docs/metrics.md for what every metric means.

Scrapes are served by :class:`~cclctl.telemetry.http_serve.MetricsHTTPServer`: one thread,
a bounded number of connections and a deadline on each request, so slow or half-sent
requests cannot pile threads or sockets into the rank.

A process forked from a rank (a DataLoader worker) drops its copy of the listening socket at
once: it has no thread serving it, and a copy left open would keep the rank's port bound
after the rank is gone, so a restarted rank could not serve its metrics there.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from cclctl.errors import ConfigError
from cclctl.telemetry.counters import MetricsView
from cclctl.telemetry.exporter_families import counter_families
from cclctl.telemetry.exporter_probe import probe_metrics
from cclctl.telemetry.http_serve import MetricsHTTPServer


class TelemetryCollector:
    """A prometheus_client collector over a ``MetricsView`` source, read at scrape time."""

    def __init__(self, view: Callable[[], MetricsView]) -> None:
        self._view = view

    def collect(self) -> Iterator[Metric]:
        view = self._view()
        base = [view.job, str(view.rank)]
        yield from counter_families(view, base)
        yield from probe_metrics(view, base)


class MetricsExporter:
    """Serves ``/metrics`` for one process from its own registry on a daemon thread."""

    def __init__(self, view: Callable[[], MetricsView]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(TelemetryCollector(view))
        self._server: MetricsHTTPServer | None = None
        self._lock = threading.Lock()
        _serving.add(self)

    def render(self) -> bytes:
        """The text exposition, as a scrape would get it."""
        return generate_latest(self.registry)

    def start(self, addr: str, port: int) -> int:
        """Listen on ``addr:port`` (port 0: any free one); returns the port bound."""
        with self._lock:
            if self._server is not None:
                return self._server.port
            server = MetricsHTTPServer(self.render, CONTENT_TYPE_LATEST)
            try:
                bound = server.start(addr, port)
            except OSError as exc:
                raise ConfigError(
                    f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}",
                    variable="CCLCTL_METRICS_PORT",
                ) from None
            self._server = server
            return bound

    @property
    def server(self) -> MetricsHTTPServer | None:
        """The HTTP server while serving (its ``rejected`` counts dropped scrapes)."""
        return self._server

    def stop(self) -> None:
        """Stop serving and free the port; safe to call more than once."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()

    def _forget_in_child(self) -> None:
        """In a forked child: close this process's copy of the socket, serve nothing. Not
        ``stop``: it would wait for a serving thread the child does not have.
        """
        server, self._server = self._server, None
        if server is not None:
            server.close_socket()


_serving: weakref.WeakSet[MetricsExporter] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for exporter in list(_serving):
        exporter._forget_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
