"""Rank 1 of a 2-rank job, stuck outside any collective: it completed all_reduce seqs 1-3 of
comm 0:0-1, then sleeps in ``load_batch`` (the call the diagnosis must name).

``python stuck_rank.py TRACE_DIR``: dumps into TRACE_DIR on SIGUSR1 and on SIGTERM (then
dies of it), prints "ready" once the handlers are installed, and sleeps until killed (at
most two minutes).
"""

import sys
import time

from cclctl.config import RuntimeConfig
from cclctl.records import COMPLETED, CollectiveRecord
from cclctl.telemetry.hub import Telemetry

COMM = "0:0-1"


def load_batch() -> None:
    time.sleep(120)  # the line the verdict names: load_batch -> time.sleep


def main() -> None:
    tel = Telemetry(RuntimeConfig(job="stuck", trace_dir=sys.argv[1]), rank=1, world_size=2)
    tel.register_comm(COMM, [0, 1])
    for seq in (1, 2, 3):
        rec = CollectiveRecord(COMM, seq, "all_reduce", dtype="float32", count=8, nbytes=32)
        rec.start_ns = time.time_ns()
        tel.start(rec)
        rec.state = COMPLETED
        rec.end_ns = time.time_ns()
    tel.install_signal_dump()
    tel.install_termination_dump()
    print("ready", flush=True)
    load_batch()


if __name__ == "__main__":
    main()
