"""One rank of a launched job under ``CCLCTL_STAGE=always``: every collective relayed and
unstaged on the same input (bit for bit), then what the rank's own telemetry kept of the
relayed calls: the stage series its exporter serves and the relay records of a dump.
Prints one JSON line; exits 1 on any mismatch."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

import cclctl
from cclctl.records import snapshot_from_json
from cclctl.runtime.relay.copier import ThreadCopier
from cclctl.runtime.relay.relay import Relay, is_staged
from cclctl.telemetry.exporter import MetricsExporter

OPS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all")


def call(target: Any, op: str, x: np.ndarray, part: int, n: int) -> np.ndarray:
    """``op`` by a communicator or a relay on copies of ``x`` (``n`` parts of ``part``)."""
    if op == "all_reduce":
        return target.all_reduce(x[:part].copy())
    if op == "broadcast":
        return target.broadcast(x[:part].copy(), n - 1)
    if op == "reduce":
        return target.reduce(x[:part].copy(), "max", 0)
    if op == "all_gather":
        return target.all_gather(x[:part], np.empty(part * n, x.dtype))
    if op == "reduce_scatter":
        return target.reduce_scatter(x, np.empty(part, x.dtype))
    return target.all_to_all(x, np.empty_like(x))


def compare(comm: Any, relay: Relay) -> list[str]:
    """Each collective on integer-valued inputs, relayed and not; what differs."""
    n, rank, wrong = comm.world_size, comm.rank, []
    for dtype in (np.float32, np.int32):
        for part in (1, 1003, 40_000):
            x = ((np.arange(part * n) * (rank + 3)) % 97).astype(dtype)
            for op in OPS:
                if call(comm, op, x, part, n).tobytes() != call(relay, op, x, part, n).tobytes():
                    wrong.append(f"{op} {np.dtype(dtype).name} x{part}")
    return wrong


def main() -> int:
    comm = cclctl.init()
    assert is_staged(comm.cfg, True), "CCLCTL_STAGE=always stages CPU buffers"
    copier = ThreadCopier()
    try:
        failures = compare(comm, Relay(comm, copier))
        tel = comm.tracer
        text = MetricsExporter(tel.metrics_view).render().decode()
        series = [
            ln for ln in text.splitlines() if ln.startswith("cclctl_relay_stage_seconds_total")
        ]
        dump = snapshot_from_json(Path(tel.dump("relay")).read_text())
        relayed = [r for r in dump.records if r.comm.endswith("/relay")]
        print(json.dumps({
            "rank": comm.rank, "failures": failures, "stage_series": len(series),
            "relayed": len(relayed), "with_stages": sum(bool(r.stages) for r in relayed),
        }), flush=True)  # fmt: skip
    finally:
        copier.close()
        comm.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
