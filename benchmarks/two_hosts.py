"""cclctl and gloo between two hosts, against the link limit measured in the same run.

The hosts are network namespaces joined by a veth pair (``tests/support/netns_job.py``'s
``TwoHosts``), each rank started there under ``unshare --uts`` with its host's hostname, so
cclctl sees two hosts: TCP between them, shared memory (the hybrid transport) within one.
For 1 and 2 ranks per host, every round runs, in an order that rotates every round:
cclctl with its defaults (retry on), cclctl with ``CCLCTL_RETRY_BUDGET=0``, gloo
(``torch.distributed``, ``GLOO_SOCKET_IFNAME`` the veth) and the link measurement
(``two_hosts_link.py``: socket streams, one and two each way, and iperf3 if installed).
Every runtime is driven by ``peers_worker.py`` (best of ``--reps`` blocks of about 64 MiB).
It prints the median busbw over rounds, each runtime's fraction of the link (busbw over
the best stream measurement of the same round: both ways at once, or one way for a
broadcast), and the ratios to gloo and of retry on to off with 95% bootstrap intervals
over rounds. ``--variant NAME:KEY=VALUE,...`` adds cclctl run with those variables as one
more side of every round (``--variant slots:CCLCTL_SHM_CMA=never``), and a table of its
busbw and of cclctl's defaults against it. Everything (processes, namespaces, the veth)
is removed at exit, also on an error or Ctrl-C. Needs root, ``ip`` and ``unshare``.

    python benchmarks/two_hosts.py [--per-host 1,2] [--min 1M --max 256M] [--rounds 3]
        [--ops all_reduce,all_gather,broadcast] [--variant NAME:KEY=VALUE] [--json two-hosts.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests" / "support")]

from netns_job import ADDRS, TwoHosts  # noqa: E402
from paired import bootstrap_median  # noqa: E402
from peers import WORKER, _parse, parse_size, sizes_between  # noqa: E402
from two_hosts_link import link_limits  # noqa: E402

from cclctl.launch import streaming_copies  # noqa: E402

TOKEN = "two-hosts-bench-token-0123456789abcdefghij"
RUNTIMES = ("cclctl", "cclctl-noretry", "gloo")
BUSBW = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "broadcast": 1.0}


def start_ranks(
    hosts: TwoHosts, per_host: int, port: int, argv: list[str], env: dict[str, str]
) -> list[subprocess.Popen[str]]:
    """``2 * per_host`` ranks running ``argv`` (ranks 0.. on h1 first), each in its host's
    namespace under ``unshare --uts`` with its host's hostname, environment-launched
    (``RANK``, ``MASTER_ADDR`` on h1, ...) with ``env`` added."""
    n = 2 * per_host
    base = {k: v for k, v in os.environ.items() if not k.startswith("CCLCTL_")}
    procs = []
    for rank in range(n):
        host = "h1" if rank < per_host else "h2"
        rank_env = {
            **base,
            "RANK": str(rank),
            "WORLD_SIZE": str(n),
            "LOCAL_RANK": str(rank % per_host),
            "LOCAL_WORLD_SIZE": str(per_host),
            "MASTER_ADDR": ADDRS["h1"],
            "MASTER_PORT": str(port),
            "TMPDIR": f"/tmp/cclctl-two-hosts-{host}",
            "CCLCTL_JOB": f"twohosts{port}",
            "CCLCTL_TOKEN": TOKEN,
            "CCLCTL_STORE_LINGER": "1",
            "GLOO_SOCKET_IFNAME": hosts.devs[0 if host == "h1" else 1],
            **env,
        }
        os.makedirs(rank_env["TMPDIR"], exist_ok=True)
        cmd = hosts.exec(host, "unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$0" "$@"')
        procs.append(
            subprocess.Popen(
                [*cmd, *argv],
                env=streaming_copies.rank_environment(rank_env),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        )
    return procs


def rank0_output(hosts: TwoHosts, procs: list[subprocess.Popen[str]], what: str) -> list[str]:
    """Wait for the ranks (at most 15 minutes), end whatever is left in the namespaces,
    and return rank 0's stdout lines; RuntimeError naming ``what`` if a rank failed."""
    try:
        outs = [p.communicate(timeout=900) for p in procs]
    finally:
        hosts.kill_all()  # lingering stores, and any rank left by a failure
    if any(p.returncode for p in procs):
        err = next(e for (_, e), p in zip(outs, procs, strict=True) if p.returncode)
        raise RuntimeError(f"{what} with {len(procs)} ranks failed: {err.strip()[-400:]}")
    return outs[0][0].splitlines()


def rank0_lines(
    argv: list[str], ranks: int, port: int, env: dict[str, str], what: str
) -> list[str]:
    """``argv`` as ``ranks`` ranks on two fresh network-namespace hosts, half on each
    (ranks 0.. on h1), with ``env`` added; rank 0's stdout lines. Everything is removed at
    the end. SystemExit naming ``what`` without root or with an odd number of ranks."""
    if os.geteuid() != 0:
        raise SystemExit(f"{what} on two hosts needs root (network namespaces)")
    if ranks < 2 or ranks % 2:
        raise SystemExit(f"{what} on two hosts: {ranks} ranks do not split over two hosts")
    hosts = TwoHosts()
    try:
        return rank0_output(hosts, start_ranks(hosts, ranks // 2, port, argv, env), what)
    finally:
        hosts.close()


def run_job(
    hosts: TwoHosts,
    name: str,
    per_host: int,
    worker_args: list[str],
    port: int,
    variants: dict[str, dict[str, str]],
) -> list[dict[str, Any]]:
    """One job of ``2 * per_host`` ranks (ranks 0.. on h1 first); rank 0's JSON lines."""
    runtime = "gloo" if name == "gloo" else "cclctl"
    env = {"CCLCTL_RETRY_BUDGET": "0"} if name == "cclctl-noretry" else variants.get(name, {})
    argv = [sys.executable, "-W", "ignore", WORKER, "--runtime", runtime, *worker_args]
    return _parse(rank0_output(hosts, start_ranks(hosts, per_host, port, argv, env), name))


def one_round(
    hosts: TwoHosts,
    round_no: int,
    per_host: int,
    worker_args: list[str],
    port: int,
    variants: dict[str, dict[str, str]],
) -> dict[str, Any]:
    sides = [*RUNTIMES, *variants, "link"]
    shift = round_no % len(sides)
    got: dict[str, Any] = {}
    for i, side in enumerate(sides[shift:] + sides[:shift]):
        print(f"#   {side}", file=sys.stderr, flush=True)
        if side == "link":
            got["link"] = link_limits(hosts.exec, ADDRS, port + 100)
        else:
            rows = run_job(hosts, side, per_host, worker_args, port + 7 * i, variants)
            got[side] = {(r["op"], r["size"]): r["seconds"] for r in rows if "seconds" in r}
    return got


def busbw(op: str, size: int, n: int, seconds: float) -> float:
    factor = BUSBW[op] * (n - 1) / n if op != "broadcast" else 1.0
    return size / seconds * factor / 1e9


def summarize(
    rounds: list[dict[str, Any]], n: int, variants: dict[str, dict[str, str]]
) -> list[dict[str, Any]]:
    rows = []
    for op, size in sorted(set.intersection(*(set(r[s]) for r in rounds for s in RUNTIMES))):
        row: dict[str, Any] = {"ranks": n, "op": op, "size": size}
        for v in variants:
            row[v] = statistics.median(busbw(op, size, n, r[v][(op, size)]) for r in rounds)
            ratios = [r[v][(op, size)] / r["cclctl"][(op, size)] for r in rounds]
            row[f"cclctl/{v}"] = (statistics.median(ratios), *bootstrap_median(ratios))
        for s in RUNTIMES:
            row[s] = statistics.median(busbw(op, size, n, r[s][(op, size)]) for r in rounds)
        limits = [link_of(r["link"], op) for r in rounds]
        for s in ("cclctl", "cclctl-noretry"):
            each = zip(rounds, limits, strict=True)
            fracs = [busbw(op, size, n, r[s][(op, size)]) / lim for r, lim in each]
            row[f"{s}/link"] = statistics.median(fracs)
            for a, b in ((s, "gloo"),) + ((("cclctl", "cclctl-noretry"),) if s == "cclctl" else ()):
                ratios = [r[b][(op, size)] / r[a][(op, size)] for r in rounds]
                low, high = bootstrap_median(ratios)
                row[f"{a}/{b}"] = (statistics.median(ratios), low, high)
        rows.append(row)
    return rows


def link_of(link: dict[str, float | None], op: str) -> float:
    """The per-direction limit ``op`` is judged by: the best one-way streams for a
    broadcast (data goes one way), the best both-ways streams for the others (every rank
    sends and receives at once)."""
    keys = ("one_way_1_stream", "one_way_2_streams")
    if op != "broadcast":
        keys = ("both_ways_1_stream_each", "both_ways_2_streams_each")
    return max(link[k] or 0.0 for k in keys)


def render(
    rows: list[dict[str, Any]],
    rounds: list[dict[str, Any]],
    n: int,
    variants: dict[str, dict[str, str]],
) -> str:
    out = [
        f"## two hosts, {n} ranks ({n // 2} per host): busbw GB/s (median of {len(rounds)} rounds)"
    ]
    for key in rounds[0]["link"]:
        vals = [r["link"][key] for r in rounds if r["link"][key] is not None]
        if vals:
            out.append(f"#   link {key}: {statistics.median(vals):.2f} GB/s per direction")
    out.append(
        f"{'op':>11} {'size':>6} {'retry-on':>9} {'retry-off':>9} {'gloo':>6} {'on/link':>8}"
        f" {'off/link':>8} {'on/gloo [95% CI]':>22} {'off/gloo [95% CI]':>22}"
        f" {'on/off [95% CI]':>22}"
    )
    for r in rows:

        def ci(v: tuple[float, float, float]) -> str:
            return f"{v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}]"

        out.append(
            f"{r['op']:>11} {r['size'] >> 20:>5}M {r['cclctl']:>9.2f} {r['cclctl-noretry']:>9.2f}"
            f" {r['gloo']:>6.2f} {r['cclctl/link']:>8.2f} {r['cclctl-noretry/link']:>8.2f}"
            f" {ci(r['cclctl/gloo']):>22} {ci(r['cclctl-noretry/gloo']):>22}"
            f" {ci(r['cclctl/cclctl-noretry']):>22}"
        )
    for v in variants:
        out.append(f"# cclctl's defaults against {v} ({variants[v]}), busbw GB/s")
        out.append(f"{'op':>11} {'size':>6} {'cclctl':>9} {v:>9} {'cclctl/' + v + ' [95% CI]':>26}")
        for r in rows:
            lo_hi = r[f"cclctl/{v}"]
            cell = f"{lo_hi[0]:.2f} [{lo_hi[1]:.2f}, {lo_hi[2]:.2f}]"
            out.append(
                f"{r['op']:>11} {r['size'] >> 20:>5}M {r['cclctl']:>9.2f} {r[v]:>9.2f} {cell:>26}"
            )
    return "\n".join(out)


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """``NAME:KEY=VALUE,...`` as (NAME, its variables); raises ValueError."""
    name, _, spec = text.partition(":")
    pairs = [item.partition("=") for item in spec.split(",") if item]
    if (
        not name
        or name in (*RUNTIMES, "link")
        or not pairs
        or any(not k or not eq for k, eq, _ in pairs)
    ):
        raise ValueError(f"{text!r}: expected NAME:KEY=VALUE[,KEY=VALUE] with a new name")
    return name, {k: v for k, _, v in pairs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-host", default="1,2")
    ap.add_argument("--min", default="1M")
    ap.add_argument("--max", default="256M")
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--ops", default="all_reduce,all_gather,broadcast")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--port", type=int, default=29700)
    ap.add_argument("--json", default="two-hosts.json")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME:KEY=VALUE[,KEY=VALUE]: cclctl with these variables, one more side",
    )
    args = ap.parse_args()
    try:
        variants = dict(parse_variant(v) for v in args.variant)
    except ValueError as exc:
        print(f"two_hosts.py: --variant: {exc}", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("two_hosts.py: needs root (network namespaces)", file=sys.stderr)
        return 2
    sizes = sizes_between(parse_size(args.min), parse_size(args.max), args.factor)
    worker_args = ["--ops", args.ops, "--sizes", ",".join(map(str, sizes))]
    worker_args += ["--reps", str(args.reps), "--latency-calls", "0"]
    doc: dict[str, Any] = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "results": {},
    }
    doc["loadavg_before"] = Path("/proc/loadavg").read_text().split()[:3]
    hosts = TwoHosts()
    try:
        for per_host in (int(p) for p in args.per_host.split(",")):
            n, rounds = 2 * per_host, []
            for round_no in range(args.rounds):
                print(
                    f"# {n} ranks, round {round_no + 1}/{args.rounds}", file=sys.stderr, flush=True
                )
                rounds.append(
                    one_round(
                        hosts,
                        round_no,
                        per_host,
                        worker_args,
                        args.port + 1000 * round_no + 200 * per_host,
                        variants,
                    )
                )
            rows = summarize(rounds, n, variants)
            print(render(rows, rounds, n, variants), flush=True)
            doc["results"][str(n)] = {"rows": rows, "links": [r["link"] for r in rounds]}
    finally:
        hosts.close()
    doc["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
    loads = f"{doc['loadavg_before']} {doc['loadavg_after']}"
    print(f"# load average before/after: {loads}; ended {time.strftime('%H:%M:%S %Z')}")
    Path(args.json).write_text(json.dumps(doc, indent=1, default=list) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
