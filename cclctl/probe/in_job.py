"""A probe on a job's own communicator, its findings published where the job is watched.

Every rank calls :func:`probe` at the same point, as it would a collective: ``cclctl probe``
inside a launched job does (:mod:`~cclctl.probe.worker`), and so may a training script
between steps (``from cclctl.probe.in_job import probe; probe(comm)``). The transfers go
over the communicator's transport under the probe's own failure state
(:mod:`~cclctl.probe.channel`), so the communicator is left as it was.

Rank 0 judges the run and publishes it: the ``cclctl.probe`` document under the job's
``probe`` key (:mod:`cclctl.probe_record`), where ``cclctl top`` and ``cclctl diagnose slow
--store`` read it, and the same record to its telemetry, whose exporter serves the links as
probe metrics (docs/metrics.md: the last probe). Publishing never fails the probe.
"""

from __future__ import annotations

import dataclasses
import json
import socket
from typing import Any

from cclctl import probe_record
from cclctl.errors import BadInput, UsageError
from cclctl.probe import document, rounds
from cclctl.probe.model import ProbeRun
from cclctl.probe.options import ProbeOptions
from cclctl.probe.verdict import Bounds, Verdict, judge


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """Rank 0's: the run, its verdict, and whether the document reached the job's store."""

    run: ProbeRun
    verdict: Verdict
    published: bool


def probe(
    comm: Any, opts: ProbeOptions | None = None, bounds: Bounds | None = None
) -> ProbeResult | None:
    """Probe every directed link among ``comm``'s ranks (all of them call this); rank 0
    returns the result, the others None."""
    if not hasattr(comm, "transport") or not hasattr(comm, "failure"):
        raise UsageError(
            f"cclctl probe needs a communicator of cclctl.init(), not {type(comm).__name__}"
        )
    run = rounds.run(comm, opts or ProbeOptions(), socket.gethostname())
    if run is None:
        return None
    verdict = judge(run, bounds or Bounds())
    return ProbeResult(run, verdict, publish(comm.tracer, document.build(run, verdict)))


def publish(telemetry: Any, doc: dict[str, Any]) -> bool:
    """``doc`` to the job's store and ``telemetry``'s metrics (a
    :class:`~cclctl.telemetry.hub.Telemetry`; anything else publishes nothing)."""
    raw = json.dumps(probe_record.bounded(doc), separators=(",", ":")).encode()
    set_probe = getattr(telemetry, "set_probe", None)
    publish_document = getattr(telemetry, "publish_document", None)
    if set_probe is None or publish_document is None:
        return False
    try:
        record = probe_record.parse(raw)
    except BadInput:  # a document no reader would take: publish nothing, fail nothing
        return False
    set_probe(record)
    return bool(publish_document(probe_record.KEY, raw))
