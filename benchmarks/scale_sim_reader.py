"""Where ``diagnose slow --store`` spends its time at N simulated ranks, off-line and per phase.

Builds the host documents ``scale_sim.py`` has its agents write for a planted straggler
(:mod:`scale_sim_docs`), then runs what the CLI runs on the listing, phase by phase, in
CPU seconds of this process (a shared machine's load does not add to them) with the cyclic
GC off, as the command has it: the hosts' documents (``host_status.parse``), their ranks'
statuses (``json.loads``, ``snapshot_from_dict``), the whole of ``live.snapshot.parse``,
the analysis (``slow_live``) and the ``--json`` document. With ``--store``, first the
LIST: the documents are set in a real store (``StoreServer``, no token, in a process of
its own) and listed once through the client the CLI uses (its CPU and wall seconds; the
store's own work is in the wall time only). ``--profile`` prints cProfile's top
functions of the analysis.

    cd benchmarks && PYTHONPATH=.. ../.venv/bin/python scale_sim_reader.py --ranks 100000
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import multiprocessing as mp
import os
import pstats
import time

import scale_sim_docs as docs
from scale_sim_procs import end_store, store_main

from cclctl import host_status
from cclctl.diagnose.slow_model import SlowOptions
from cclctl.diagnose_io.slow_inputs import slow_live
from cclctl.live.snapshot import job_prefix, parse
from cclctl.records import snapshot_from_dict
from cclctl.store.backends import open_store

JOB = "simslow"


def listing(n: int, per_host: int) -> dict[str, bytes]:
    """The job's keys as the store lists them: one host document per host, rank
    ``n // 3 + 1`` the straggler (as ``scale_sim.py --plant slow`` plants it)."""
    now = time.time_ns()
    planted = n // 3 + 1
    tmpl = docs.slow_templates(JOB, n, now, per_host)
    out = {}
    for h in range(-(-n // per_host)):
        statuses = {}
        for rank in range(h * per_host, min(n, (h + 1) * per_host)):
            kind = f"normal{rank % per_host}"
            kind = "slow" if rank == planted else "after" if rank == planted + 1 else kind
            statuses[rank] = tmpl[kind] % docs.values(rank, n, per_host, 1000, now)
        name = docs.host_name(h)
        doc = host_status.HostDocument(name, 100_000 + h, now, 1.0, statuses)
        out[job_prefix(JOB) + host_status.KEY + name] = doc.to_bytes()
    return out


def listed(keys: dict[str, bytes], figures: dict[str, object]) -> None:
    """Set ``keys`` in a store of its own process, then LIST them as the CLI does."""
    parent, child = mp.get_context("fork").Pipe()
    store = mp.get_context("fork").Process(target=store_main, args=(None, child), daemon=True)
    store.start()
    try:
        client = open_store(f"127.0.0.1:{parent.recv()}", timeout_s=600.0)
        for key, value in keys.items():
            client.set(key, value)
        cpu, wall = time.process_time(), time.perf_counter()
        got = client.list(job_prefix(JOB))
        figures["list_cpu_s"] = time.process_time() - cpu
        figures["list_wall_s"] = time.perf_counter() - wall
        figures["listed_keys"] = len(got)
        client.close()
    finally:
        end_store(parent, store)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=10_000)
    parser.add_argument("--per-host", type=int, default=8)
    parser.add_argument("--profile", type=int, default=0, help="top functions to print")
    parser.add_argument("--store", action="store_true", help="measure the LIST too")
    args = parser.parse_args()
    keys = listing(args.ranks, args.per_host)
    figures: dict[str, object] = {
        "ranks": args.ranks,
        "mib_listed": round(sum(map(len, keys.values())) / 2**20, 1),
        "load_avg_at_start": os.getloadavg(),
    }
    if args.store:
        listed(keys, figures)
    gc.disable()
    clock = time.process_time
    began = clock()
    hosts = [host_status.parse(value, key) for key, value in keys.items()]
    figures["host_documents_s"] = clock() - began
    began = clock()
    decoded = [(r, json.loads(text)) for d in hosts for r, text in d.statuses.items()]
    figures["statuses_json_s"] = clock() - began
    began = clock()
    for _, data in decoded:
        snapshot_from_dict(data, "status")
    figures["snapshot_from_dict_s"] = clock() - began
    del hosts, decoded
    began = clock()
    statuses = parse(JOB, "offline", keys)
    figures["whole_parse_s"] = clock() - began
    opts = SlowOptions(ongoing=True)
    profile = cProfile.Profile() if args.profile else None
    began = clock()
    report = profile.runcall(slow_live, statuses, opts) if profile else slow_live(statuses, opts)
    figures["analysis_s"] = clock() - began
    began = clock()
    out = json.dumps(report.to_dict(), indent=2)
    figures["json_out_s"] = clock() - began
    figures["json_out_mb"] = round(len(out) / 1e6, 1)
    figures["verdict"] = [(f.kind, f.ranks, round(f.slowdown, 2)) for f in report.findings]
    for key, value in figures.items():
        print(f"{key:24} {round(value, 3) if isinstance(value, float) else value}")
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)


if __name__ == "__main__":
    main()
