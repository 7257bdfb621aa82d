"""Detection latency: from the moment a stall begins to cclctl's verdict (asserts nothing).

A 4-rank job (tests/fault_job.py) where rank 2 never enters all_reduce seq 3, with
CCLCTL_TIMEOUT=2; the clock starts when the first rank enters seq 3 (its record's start)
and stops when `cclctl diagnose hang --store` names rank 2. The goal: timeout + 2 s.

    python benchmarks/detection_latency.py
"""

import json
import pathlib
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "support"))
from fault_job import FaultJob

from cclctl.live.snapshot import fetch
from cclctl.store.client import StoreClient

for trial in range(3):
    tmp = pathlib.Path(tempfile.mkdtemp())
    job = FaultJob(tmp, 4, fault="skip:rank=2:seq=3", timeout_s=2.0)
    try:
        client = StoreClient.from_address(job.store)
        stall_ns = None
        while True:
            st = fetch(client, job.job)
            starts = [
                r.start_ns
                for s in st.statuses.values()
                for r in s.records
                if r.seq == 3 and r.state in ("started", "timed_out")
            ]
            if starts:
                stall_ns = min(starts)
                break
            time.sleep(0.05)
        while True:
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "cclctl",
                    "diagnose",
                    "hang",
                    "--store",
                    job.store,
                    "--json",
                    "--stuck-after",
                    "2",
                ],
                capture_output=True,
                text=True,
            )
            if out.returncode == 3:
                v = json.loads(out.stdout)["verdicts"][0]
                if v["kind"] == "not_entered":
                    break
        print(
            f"trial {trial}: {v['summary']!r} "
            f"{(time.time_ns() - stall_ns) / 1e9:.2f} s after the stall began (timeout 2 s)"
        )
    finally:
        job.kill_now()
