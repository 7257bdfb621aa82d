"""The schedule run by every participant, round by round, with rank 0 keeping the score.

After its meeting in a round each participant sends rank 0 what it measured (a small JSON
report) and waits for rank 0's go, which starts the next round together and says which ranks
have stopped taking part: one whose report did not come within the round's bound, or whose
link to rank 0 failed. Their partners skip them (the links are ``skipped``, naming why), so
the rest of the schedule runs and nobody waits on a rank that is gone. Rank 0 ends with
every directed link of the schedule in a :class:`~cclctl.probe.model.ProbeRun`.

After the schedule, rank 0 has the pairs with a direction under half its kind's median
measured again, up to three times while they stay under it, in rounds of disjoint pairs
announced in its go (the better figure stands): a link slow at every look is slow; one that
a moment's load slowed is not.
"""

from __future__ import annotations

import json
import struct
import sys
import time
from collections import Counter
from typing import Any

from cclctl.probe import schedule
from cclctl.probe.channel import FAILURES, Channel
from cclctl.probe.model import OK, SKIPPED, UNREACHABLE, Link, ProbeRun, link_kind
from cclctl.probe.options import ProbeOptions
from cclctl.probe.session import Buffers, Meeting, Outcome
from cclctl.probe.verdict import kind_stats

REPORT_BYTES = 1024
#: Barrier messages' seq: above any round's (a round's seq is its number from 1).
BARRIER_SEQ = 1 << 40
#: A pair with a direction under this share of its kind's median is measured again...
RECHECK_BELOW = 0.5
#: ...up to this many times while it stays under it.
RECHECKS = 3


class Place:
    """Where this rank stands: the job's hosts, the transport, and the participants."""

    def __init__(self, comm: Any, opts: ProbeOptions, hostname: str) -> None:
        self.comm = comm
        self.rank: int = comm.rank
        self.world: int = comm.world_size
        peers = list(getattr(comm.failure, "peers", ()) or ())
        self.hosts = [str(h).split("|")[0] for h, _ in peers] if peers else [hostname] * self.world
        first: dict[str, int] = {}
        for r, host in enumerate(self.hosts):
            first.setdefault(host, r)
        self.participants = sorted(first.values()) if opts.per_host else list(range(self.world))
        self.transport = str(getattr(comm.transport, "name", "?"))
        self._near = _shared_memory_peers(comm.transport, self.rank, self.hosts)

    def kind(self, peer: int) -> str:
        return link_kind(self.hosts[peer] == self.hosts[self.rank], peer in self._near)


def _shared_memory_peers(transport: Any, rank: int, hosts: list[str]) -> set[int]:
    if transport.name == "shm":
        return set(range(len(hosts)))
    hierarchy = getattr(transport, "hierarchy", None)
    if transport.name == "hybrid" and hierarchy is not None and hierarchy.group is not None:
        return set(hierarchy.group.ranks)
    if transport.name == "hybrid" and getattr(transport, "shm", None) is not None:
        return {r for r, h in enumerate(hosts) if h == hosts[rank]}
    return set()


def run(comm: Any, opts: ProbeOptions, hostname: str = "") -> ProbeRun | None:
    """Take part in the probe; rank 0 returns the run, the others None."""
    place = Place(comm, opts, hostname)
    rounds = schedule.build(place.participants, opts.pairs, opts.rounds, opts.seed)
    if place.rank not in place.participants:
        return None
    ch = Channel(comm.transport, place.rank, comm.id, comm.failure.epoch)
    scorer = Scorer(place, rounds) if place.rank == 0 else None
    bufs = Buffers(opts)
    excluded: dict[int, str] = {}
    bound_s = 6 * opts.timeout_s + 2 * opts.budget_s
    recheck: schedule.Round | None = None
    r = 0
    while r < len(rounds) or recheck is not None:
        round_ = rounds[r] if r < len(rounds) else recheck or []
        started = time.monotonic()
        peer = schedule.partner(round_, place.rank)
        if peer is None:
            outcome = None
        elif peer in excluded:
            outcome = Outcome(SKIPPED, why=excluded[peer])
        else:
            outcome = Meeting(ch, place.rank, peer, r + 1, opts, bufs).run()
        report = _report(r, peer, outcome, place)
        if scorer is not None:
            scorer.take(report, again=r >= len(rounds))
            recheck = scorer.next_recheck() if r + 1 >= len(rounds) else None
            excluded = scorer.collect(ch, r, started + bound_s, opts.timeout_s, recheck)
            scorer.times(r).append(time.monotonic() - started)
            _progress(r, len(rounds), scorer.times(r)[-1])
        else:
            try:
                excluded, recheck = _to_rank0(ch, place, r, report, bound_s + 2 * opts.timeout_s)
            except FAILURES as exc:
                print(f"cclctl probe: rank {place.rank}: rank 0 did not answer after round "
                      f"{r + 1}; stopping: {exc}", file=sys.stderr)  # fmt: skip
                return None
        r += 1
    return scorer.result(opts) if scorer is not None else None


def _progress(r: int, count: int, seconds: float) -> None:
    """Rank 0's line on stderr as each round ends: how far the schedule is."""
    what = f"round {r + 1}/{count}" if r < count else f"recheck round {r + 1 - count}"
    print(f"cclctl probe: {what} done in {seconds:.2f} s", file=sys.stderr, flush=True)


def _report(r: int, peer: int | None, outcome: Outcome | None, place: Place) -> dict[str, Any]:
    data: dict[str, Any] = {"round": r, "src": place.rank, "dst": peer}
    if outcome is not None and peer is not None:
        data.update(
            kind=place.kind(peer), status=outcome.status, bandwidth=outcome.bandwidth,
            latency=outcome.latency, repeats=outcome.repeats, why=outcome.why[:400],
        )  # fmt: skip
    return data


def _encode(report: dict[str, Any]) -> memoryview:
    raw = json.dumps(report, separators=(",", ":")).encode()
    return memoryview(bytearray(raw[:REPORT_BYTES].ljust(REPORT_BYTES)))


def _to_rank0(
    ch: Channel, place: Place, r: int, report: dict[str, Any], timeout_s: float
) -> tuple[dict[int, str], schedule.Round | None]:
    """Send rank 0 this round's report and wait for its go: the ranks that stopped, and the
    recheck round that follows, if one does."""
    ch.move(0, BARRIER_SEQ + r, 0, timeout_s, send=_encode(report))
    go = memoryview(bytearray(_go_bytes(place.world)))
    ch.move(0, BARRIER_SEQ + r, 1, timeout_s, recv=go)
    return _decode_go(go, place.world)


def _go_bytes(world: int) -> int:
    """A go: a stopped flag per rank, a byte saying a recheck round follows, and each
    rank's partner in it (int32, -1: none)."""
    return world + 1 + 4 * world


def _encode_go(world: int, stopped: dict[int, str], recheck: schedule.Round | None) -> bytes:
    flags = bytes(1 if k in stopped else 0 for k in range(world))
    partners = [-1] * world
    for a, b in recheck or []:
        partners[a], partners[b] = b, a
    return flags + bytes([recheck is not None]) + struct.pack(f"<{world}i", *partners)


def _decode_go(go: memoryview, world: int) -> tuple[dict[int, str], schedule.Round | None]:
    stopped = {
        k: f"rank {k} stopped taking part (no report to rank 0)" for k in range(world) if go[k]
    }
    if not go[world]:
        return stopped, None
    partners = struct.unpack_from(f"<{world}i", go, world + 1)
    return stopped, [(a, b) for a, b in enumerate(partners) if a < b]


class Scorer:
    """Rank 0: the reports of every round, the ranks that stopped, and the rounds' times."""

    def __init__(self, place: Place, rounds: list[schedule.Round]) -> None:
        self.place = place
        self.rounds = rounds
        self.links: dict[tuple[int, int], Link] = {}
        self.stopped: dict[int, str] = {}
        self.round_s: list[float] = []
        self.recheck_s: list[float] = []
        self._looks: Counter[tuple[int, int]] = Counter()  # recheck rounds of each pair

    def times(self, r: int) -> list[float]:
        return self.round_s if r < len(self.rounds) else self.recheck_s

    def take(self, report: dict[str, Any], again: bool = False) -> None:
        """A participant's report; ``again``: of a recheck, whose better figure stands."""
        if report.get("dst") is None or "status" not in report:
            return
        link = Link.from_dict(report)
        old = self.links.get((link.src, link.dst))
        worse = not link.measured or (link.bandwidth or 0) <= (old.bandwidth or 0 if old else 0)
        if again and old is not None and old.measured and worse:
            return
        self.links[(link.src, link.dst)] = link

    def next_recheck(self) -> schedule.Round | None:
        """The next round of pairs measured again: those with a direction still under
        :data:`RECHECK_BELOW` of its kind's median, each up to :data:`RECHECKS` times (fewest
        looks first, the better figure standing), so a link slowed by a moment's load on this
        machine is not flagged: only one slow at every look is. None once none is left."""
        stats = kind_stats(list(self.links.values()))
        pending = sorted(
            {
                (min(x.src, x.dst), max(x.src, x.dst)) for x in self.links.values()
                if x.measured and x.kind in stats
                and (x.bandwidth or 0) < RECHECK_BELOW * stats[x.kind].median
            } - {p for p, n in self._looks.items() if n >= RECHECKS},
            key=lambda p: (self._looks[p], p),
        )  # fmt: skip
        round_: schedule.Round = []
        busy: set[int] = set(self.stopped)
        for a, b in pending:
            if a not in busy and b not in busy:
                round_.append((a, b))
                busy.update((a, b))
        self._looks.update(round_)
        return round_ or None

    def collect(
        self, ch: Channel, r: int, until: float, timeout_s: float, recheck: schedule.Round | None
    ) -> dict[int, str]:
        """Every participant's report of round ``r``, then the go: who stopped, and the
        recheck round that follows, if one does."""
        for k in self.place.participants[1:]:
            if k in self.stopped:
                continue
            buf = memoryview(bytearray(REPORT_BYTES))
            try:
                ch.move(k, BARRIER_SEQ + r, 0, max(until - time.monotonic(), timeout_s),
                        recv=buf)  # fmt: skip
                self.take(json.loads(bytes(buf).decode().strip()))
            except (*FAILURES, ValueError) as exc:
                self.stopped[k] = f"rank {k} sent rank 0 no report of round {r + 1}: {exc}"
        go = _encode_go(self.place.world, self.stopped, recheck)
        for k in self.place.participants[1:]:
            if k in self.stopped:
                continue
            try:
                ch.move(k, BARRIER_SEQ + r, 1, timeout_s, send=memoryview(go))
            except FAILURES as exc:
                self.stopped[k] = f"rank 0 could not reach rank {k} after round {r + 1}: {exc}"
        return dict(self.stopped)

    def result(self, opts: ProbeOptions) -> ProbeRun:
        """The run, every directed link of the schedule in it (unreported ones skipped)."""
        place = self.place
        links = []
        for round_ in self.rounds:
            for a, b in round_:
                for src, dst in ((a, b), (b, a)):
                    link = self.links.get((src, dst))
                    if link is None:
                        why = self.stopped.get(src) or self.stopped.get(dst) or "not reported"
                        status = UNREACHABLE if (dst, src) in self.links else SKIPPED
                        back = self.links.get((dst, src))
                        if back is not None and back.status != OK:
                            why = back.why
                        link = Link(src, dst, _kind(place, src, dst), status, why=why)
                    links.append(link)
        return ProbeRun(
            world_size=place.world,
            hosts=tuple(place.hosts),
            participants=tuple(place.participants),
            transport=place.transport,
            pairs=opts.pairs,
            direction=opts.direction,
            rounds=len(self.rounds),
            round_s=tuple(self.round_s),
            recheck_s=tuple(self.recheck_s),
            links=tuple(sorted(links, key=lambda x: (x.src, x.dst))),
            options=opts.to_dict(),
            time_ns=time.time_ns(),
        )


def _kind(place: Place, src: int, dst: int) -> str:
    """A link's kind as rank 0 sees it (for a link nobody reported)."""
    if place.transport == "shm":
        return link_kind(True, True)
    same = place.hosts[src] == place.hosts[dst]
    return link_kind(same, same and place.transport == "hybrid")
