"""Tables and goal checks for ``benchmarks/peers.py``: busbw, ratios, met or missed.

The goals are those of the performance issue: all_reduce busbw at least 2x gloo's from
64 KiB up (2 and 4 ranks), at least Open MPI's from 4 MiB up (2 ranks), at least half the
numpy copy bandwidth from 64 MiB up, an 8-byte all_reduce in at most 30 us (2 ranks); the
other collectives within 20% of those ratios. They are checked twice, on cclctl over shared
memory with shared buffers from ``comm.empty()`` (``cclctl-zc``, zero-copy) and with plain
numpy buffers (``cclctl-shm``), since applications may use either.
"""

from __future__ import annotations

from typing import Any

from cclctl.bandwidth import bus_factor

RUNTIMES = ("cclctl-zc", "cclctl-shm", "cclctl-tcp", "gloo", "openmpi")
OURS = ("cclctl-zc", "cclctl-shm")  # goals and ratios for each
# (name, peer, target ratio for all_reduce, smallest size, rank counts)
RATIO_GOALS = (
    ("2x gloo", "gloo", 2.0, 64 << 10, (2, 4)),
    ("1x Open MPI", "openmpi", 1.0, 4 << 20, (2,)),
    ("50% of numpy copy", "copy", 0.5, 64 << 20, (2, 4)),
)
OTHER_OPS_SLACK = 0.8  # other collectives: within 20% of the all_reduce targets
LATENCY_GOAL_S = 30e-6


def best_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (runtime, ranks, op, size, latency): the fastest of the passes."""
    best: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        key = (row["runtime"], row["ranks"], row["op"], row["size"], bool(row.get("latency")))
        old = best.get(key)
        if old is None or ("seconds" in row and row["seconds"] < old.get("seconds", 1e30)):
            best[key] = row
    return list(best.values())


def busbw(row: dict[str, Any]) -> float:
    return row["size"] / row["seconds"] / 1e9 * bus_factor(row["op"], row["ranks"])


def index(doc: dict[str, Any]) -> dict[tuple[str, str, int, int], float]:
    """(runtime, op, ranks, size) -> busbw GB/s, with the limit as runtime 'copy'/'add'."""
    table: dict[tuple[str, str, int, int], float] = {}
    for row in doc["rows"]:
        if "seconds" in row and not row.get("latency"):
            table[(row["runtime"], row["op"], row["ranks"], row["size"])] = busbw(row)
    ranks = {row["ranks"] for row in doc["rows"]}
    ops = {row["op"] for row in doc["rows"]}
    for kind, per_size in doc["limit"].items():
        for size, gbps in per_size.items():
            for op in ops:
                for n in ranks:
                    table[(kind, op, n, int(size))] = gbps
    return table


def _near(table: dict[tuple[str, str, int, int], float], key: tuple[str, str, int, int]) -> float:
    """The limit was measured at the nominal sizes; gathers round them to the rank count."""
    if key in table:
        return table[key]
    runtime, op, n, size = key
    sizes = [s for (r, o, m, s) in table if (r, o, m) == (runtime, op, n)]
    if not sizes:
        return 0.0
    best = min(sizes, key=lambda s: abs(s - size))
    return table[(runtime, op, n, best)] if abs(best - size) <= size * 0.01 else 0.0


def goals(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every goal, checked for each of OURS that has numbers (``runtime`` names which)."""
    out: list[dict[str, Any]] = []
    for ours in OURS:
        if any(row["runtime"] == ours for row in doc["rows"]):
            out += [dict(g, runtime=ours) for g in _goals(doc, ours)]
    return out


def _goals(doc: dict[str, Any], ours: str) -> list[dict[str, Any]]:
    table = index(doc)
    out: list[dict[str, Any]] = []
    for op in sorted({row["op"] for row in doc["rows"]}):
        slack = 1.0 if op == "all_reduce" else OTHER_OPS_SLACK
        for name, peer, target, smallest, rank_counts in RATIO_GOALS:
            checks = []
            for runtime, o, n, size in sorted(table):
                if runtime != ours or o != op or n not in rank_counts or size < smallest:
                    continue
                theirs = _near(table, (peer, op, n, size))
                if theirs > 0:
                    ratio = table[(runtime, o, n, size)] / theirs
                    checks.append({"ranks": n, "size": size, "ratio": round(ratio, 3)})
            want = round(target * slack, 3)
            if checks:
                missed = [c for c in checks if c["ratio"] < want]
                worst = min(c["ratio"] for c in checks)
                out.append(
                    {
                        "op": op,
                        "goal": name,
                        "target": want,
                        "worst": worst,
                        "met": not missed,
                        "missed": missed,
                    }
                )
            else:
                out.append(
                    {
                        "op": op,
                        "goal": name,
                        "target": want,
                        "met": None,
                        "missed": [],
                        "note": f"no {peer} numbers",
                    }
                )
    for row in doc["rows"]:
        if row.get("latency") and row["runtime"] == ours and row["ranks"] == 2:
            out.append(
                {
                    "op": "all_reduce",
                    "goal": "8 B in <= 30 us (2 ranks)",
                    "target": LATENCY_GOAL_S * 1e6,
                    "worst": round(row["seconds"] * 1e6, 1),
                    "met": row["seconds"] <= LATENCY_GOAL_S,
                    "missed": [],
                }
            )
    return out


def _fmt(value: float) -> str:
    return f"{value:7.2f}" if value else "      -"


def render(doc: dict[str, Any]) -> str:
    table = index(doc)
    lines: list[str] = []
    combos = sorted({(row["op"], row["ranks"]) for row in doc["rows"] if not row.get("latency")})
    short = {"cclctl-zc": "zc", "cclctl-shm": "shm"}
    head = ["size", *RUNTIMES, "copy"]
    head += [f"{short[o]}/{p}" for o in OURS for p in ("gloo", "mpi", "copy")]
    for op, n in combos:
        lines.append(f"\n## {op}, {n} ranks: busbw GB/s (limit: numpy copy, one process)")
        lines.append("".join(f"{h:>11}" for h in head))
        sizes = sorted({s for (r, o, m, s) in table if (o, m) == (op, n) and r in RUNTIMES})
        for size in sizes:
            vals = {r: table.get((r, op, n, size), 0.0) for r in RUNTIMES}
            copy = _near(table, ("copy", op, n, size))
            ratios = [
                vals[o] / v if v and vals[o] else 0.0
                for o in OURS
                for v in (vals["gloo"], vals["openmpi"], copy)
            ]
            cells = [_size(size), *(_fmt(v) for v in vals.values()), _fmt(copy)]
            cells += [_fmt(r) for r in ratios]
            lines.append("".join(f"{c:>11}" for c in cells))
    lines.append("\n## 8-byte all_reduce, us per call")
    for row in doc["rows"]:
        if row.get("latency"):
            lines.append(f"{row['runtime']:>12} {row['ranks']} ranks {row['seconds'] * 1e6:9.1f}")
    for ours, what in (("cclctl-zc", "shared buffers"), ("cclctl-shm", "plain numpy buffers")):
        chosen = [g for g in doc["goals"] if g.get("runtime", "cclctl-shm") == ours]
        if not chosen:
            continue
        lines.append(f"\n## goals ({ours}: cclctl over shared memory, {what})")
        for g in chosen:
            state = {True: "met", False: "MISSED", None: "n/a"}[g["met"]]
            worst = g.get("worst", g.get("note", ""))
            lines.append(
                f"{g['op']:>15}  {g['goal']:<28} target {g['target']:<6} worst {worst}  {state}"
            )
    together = doc.get("copy_together") or {}
    if any(together.values()):
        lines.append("\n## numpy copy, one per rank at once: GB/s per process (vs one alone)")
        for n, per_size in together.items():
            for size, gbps in per_size.items():
                alone = _near(table, ("copy", "all_reduce", int(n), int(size)))
                share = f"{gbps / alone:.2f}" if alone else "-"
                lines.append(f"{_size(int(size)):>11} {n:>3} ranks {gbps:7.2f}  {share} of alone")
    cores = doc.get("machine", {}).get("effective_cores_before_after")
    if cores:
        lines.append(f"# cores two busy processes got, before and after the run: {cores}")
    for name, why in doc["skipped"].items():
        lines.append(f"# skipped {name}: {why}")
    return "\n".join(lines)


def _size(size: int) -> str:
    for unit, shift in (("M", 20), ("K", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return str(size)
