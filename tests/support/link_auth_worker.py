"""A rank for the link-authentication tests: five all_reduces of ``rank + 1`` over TCP.

With ``LINK_TEST_HOLD=1`` every rank first waits for the key ``test/attacked`` in the job's
store, so an attacker can have its go at the ranks' ports before any rank links. Each rank
prints one JSON line: its results, how many link handshakes it refused, how many calls
were retried and its communicator's epoch.
"""

from __future__ import annotations

import json
import os

import numpy as np

import cclctl
from cclctl.store.client import StoreClient
from cclctl.telemetry.counters import summarize


def main() -> None:
    comm = cclctl.init()
    if os.environ.get("LINK_TEST_HOLD") == "1":
        store = StoreClient.from_address(
            os.environ["CCLCTL_STORE"], connect_timeout_s=10, token=os.environ["CCLCTL_TOKEN"]
        )
        store.wait(["test/attacked"], timeout_s=60)
        store.close()
    results = []
    for _ in range(5):
        x = np.full(4, comm.rank + 1, dtype=np.float32)
        comm.all_reduce(x)
        results.append(x.tolist())
    view = comm.tracer.metrics_view()  # the rank's Telemetry
    report = {
        "rank": comm.rank,
        "results": results,
        "refused": view.link_auth_failures,
        "retries": summarize(view)["retries"],
        "epoch": comm.failure.epoch,
    }
    print(json.dumps(report), flush=True)
    comm.close()


if __name__ == "__main__":
    main()
