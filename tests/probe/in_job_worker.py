"""A training script's rank that probes its job between steps, as a user would:
``cclctl.probe.in_job.probe(comm)`` on every rank, then training on. The baseline (argv 2,
bytes/s for shared memory) flags every link, so there is something to publish. Rank 0 prints
``probed published=... metrics=URL``; every rank then trains until the file argv 1 exists,
which the test makes once it has read what it needs (within 90 s)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

import cclctl
from cclctl.probe.in_job import probe
from cclctl.probe.options import ProbeOptions
from cclctl.probe.verdict import Bounds


def main(go: str, baseline: float) -> int:
    comm = cclctl.init()
    try:
        buf = np.ones(1024, dtype=np.float32)
        comm.all_reduce(buf)
        result = probe(comm, ProbeOptions(large=64 << 10), Bounds(baseline={"shm": baseline}))
        comm.all_reduce(buf)
        if result is not None:
            url = getattr(comm.tracer, "metrics_url", "")
            print(f"probed published={result.published} metrics={url}", flush=True)
        deadline = time.monotonic() + 90
        seen = np.zeros(1, dtype=np.float32)
        while not seen[0]:  # the job trains on while the test looks; all stop at one step
            seen[0] = Path(go).exists() or time.monotonic() > deadline
            comm.all_reduce(seen, op="max")
            time.sleep(0.05)
    finally:
        comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2])))
