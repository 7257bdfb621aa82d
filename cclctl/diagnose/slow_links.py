"""A slow directed link, or a slow host's egress or ingress, in one window.

A directed link ``src -> dst`` moves the bytes ``src`` sent to ``dst``; its throughput is
those bytes over the time charged to it, a clock-free measure:

- over TCP, the time ``src``'s messages took to reach ``dst`` from their first byte to
  their last (``recv_transfer_ns``). Nothing upstream of ``src`` lengthens it: neither a
  straggler whose lateness every rank of a ring passes on to the next, nor a slow link
  elsewhere that holds a whole ring back, so every receiver waits alike;
- over shared memory, which times no transfer, what both ends spent blocked on each other
  in the data phase (``src`` sending to ``dst``, ``dst`` receiving from ``src``, after
  the other had arrived in the call), the receiver's wait counted only beyond what the
  sender itself blocked on its other peers, before they arrived or after: a rank that
  waits on a sender which waits on someone else (a hierarchical all_reduce's locals on
  their leader) is not held up by the link between them. While a straggler is found in
  the window these links are not judged: its lateness travels along chains of waits that
  no per-window subtraction undoes exactly.

Links are compared with links of the same kind only (shared memory, TCP within a host,
TCP across hosts), in log space: a link is slow when its throughput lies below the median
of the others of its kind by ``link_ratio`` and by more than ``mad_k`` scaled MADs of
theirs, and the time it lost against that median is at least ``SlowOptions.min_share`` of
the window. A host is slow when every one of at least two links out of it (or into it) to
other hosts is slow against the other hosts' links (or untimed over TCP: see
:func:`slow_edges`), and one of its ranks lost the minimum share over its links together.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from cclctl.diagnose.slow_model import SlowOptions, span_ns
from cclctl.diagnose.slow_stats import below, median, others_median_bound, sorted_median
from cclctl.slow_signals import Window

NS = 1e9
SHM = "shared memory"
TCP_LOCAL = "TCP within a host"
TCP_REMOTE = "TCP across hosts"
#: A link charged less than this is as fast as can be told (its throughput is capped).
MIN_WAIT_S = 1e-4
#: Bytes a link judged by its waits must carry in a window (below, its time is latency,
#: not bandwidth).
MIN_BYTES = 256 << 10
#: Bytes a TCP link must carry in a window: its transfer times hold no latency (they start
#: at a message's first byte), so less traffic still tells its bandwidth.
MIN_TCP_BYTES = 64 << 10


@dataclasses.dataclass(frozen=True)
class Link:
    """A directed link in one window: ``wait_s`` is the time charged to it (see the module
    doc), ``transfer_s`` its messages' first-to-last-byte time at the receiver."""

    src: int
    dst: int
    kind: str
    nbytes: int
    wait_s: float
    span_s: float
    transfer_s: float = 0.0

    @property
    def throughput(self) -> float:
        """Bytes per second of the time charged to the link."""
        return self.nbytes / max(self.wait_s, MIN_WAIT_S)


@dataclasses.dataclass(frozen=True)
class SlowLink:
    link: Link
    reference: float  # the median throughput of the links it was judged against
    reverse: Link | None
    reverse_slow: bool = False  # the reverse direction is slow against its kind too

    @property
    def cost(self) -> float:
        """The share of the window the link lost against the reference throughput."""
        lost = self.link.wait_s - self.link.nbytes / self.reference
        return max(0.0, lost) / self.link.span_s


@dataclasses.dataclass(frozen=True)
class SlowEdge:
    """Every link out of (``direction`` "out") or into ("in") ``host`` is slow."""

    host: str
    direction: str
    links: tuple[SlowLink, ...]
    untimed: int = 0  # its other links, whose messages all arrived whole

    @property
    def cost(self) -> float:
        """The most one rank of the host lost over its links (they run in parallel across
        ranks, one after the other within a rank)."""
        mine = "src" if self.direction == "out" else "dst"
        by_rank: dict[int, float] = {}
        for slow in self.links:
            rank = getattr(slow.link, mine)
            by_rank[rank] = by_rank.get(rank, 0.0) + slow.cost
        return max(by_rank.values())


def links(
    views: Mapping[int, Window], hosts: Mapping[int, str], straggler: bool = False
) -> list[Link]:
    """Every directed link that carried enough in the window to be judged
    (:data:`MIN_TCP_BYTES`, :data:`MIN_BYTES`), with the time charged to it (see the
    module doc); ``straggler``: one is found in the window, so links judged by their
    waits are left out."""
    out = []
    for src in sorted(views):
        window = views[src]
        span = span_ns(window) / NS
        for dst, peer in sorted(window.peers.items()):
            tcp = peer.via == "tcp"
            if peer.sent < (MIN_TCP_BYTES if tcp else MIN_BYTES) or (straggler and not tcp):
                continue
            back = views[dst].peers.get(src) if dst in views else None
            transfer = back.recv_transfer_ns if back is not None else 0
            if tcp:
                charged = transfer
            else:
                held = _held(window, dst)  # what the sender itself blocked on the others
                recv = max(0, (back.recv_wait_ns if back is not None else 0) - held)
                charged = peer.send_wait_ns + recv
            out.append(Link(src, dst, _kind(peer.via, src, dst, hosts), peer.sent, charged / NS,
                            span, transfer / NS))  # fmt: skip
    return out


def _held(window: Window, but: int) -> int:
    """What a rank blocked on peers other than ``but``, before they arrived in a call or
    after, in ns."""
    return sum(p.recv_wait_ns + p.send_wait_ns + p.entry_wait_ns
               for r, p in window.peers.items() if r != but)  # fmt: skip


def _kind(via: str, src: int, dst: int, hosts: Mapping[int, str]) -> str:
    if via == "shm":
        return SHM
    return TCP_LOCAL if hosts.get(src) == hosts.get(dst) else TCP_REMOTE


def slow_links(found: Sequence[Link], opts: SlowOptions) -> list[SlowLink]:
    """The links slow against the others of their kind (see module doc)."""
    by_pair = {(x.src, x.dst): x for x in found}
    kinds = {x.kind for x in found}
    bound = {k: others_median_bound(math.log2(x.throughput) for x in found if x.kind == k)
             for k in kinds}  # fmt: skip
    least = math.log2(opts.link_ratio)
    refs = {}
    for link in found:
        if bound[link.kind] - math.log2(link.throughput) <= least:
            continue  # not below its kind's median by the ratio, whichever is left out
        others = [x for x in found if x.kind == link.kind and x is not link]
        judged = _judge(link, others, opts)
        if judged is not None:
            refs[(link.src, link.dst)] = (link, judged)
    return [
        SlowLink(link, ref, by_pair.get((dst, src)), (dst, src) in refs)
        for (src, dst), (link, ref) in refs.items()
    ]


def _judge(
    link: Link, others: Sequence[Link], opts: SlowOptions, effect: bool = True
) -> float | None:
    """The reference throughput when ``link`` is slow against ``others``, else None;
    ``effect``: only if it cost the minimum share of the window too."""
    if not others:
        return None
    logs = [math.log2(x.throughput) for x in others]
    if not below(math.log2(link.throughput), logs, opts.mad_k, math.log2(opts.link_ratio)):
        return None
    reference = 2 ** median(logs)
    slow = SlowLink(link, reference, None)
    return reference if not effect or slow.cost >= opts.min_share else None


def slow_edges(
    found: Sequence[Link], hosts: Mapping[int, str], opts: SlowOptions
) -> list[SlowEdge]:
    """Hosts whose every link out (or in), two or more slow, is slow against other hosts'
    links or untimed: all its messages arrived whole, which a link sharing a slow host's
    bottleneck does when its receiver was reading another of the host's links meanwhile."""
    remote = [x for x in found if x.kind == TCP_REMOTE]
    logs = sorted(math.log2(x.throughput) for x in remote)
    least = math.log2(opts.link_ratio)
    ends = {"out": _by_host(remote, "src", hosts), "in": _by_host(remote, "dst", hosts)}
    out = []
    for host in sorted(ends["out"].keys() | ends["in"].keys()):
        for direction in ("out", "in"):
            mine = ends[direction].get(host, [])
            # the rest's median is at most that of all but the len(mine) smallest: a link
            # not below that by the ratio is judged not slow without a median of its own
            bound = sorted_median(logs, len(mine)) if len(logs) > len(mine) else float("-inf")
            suspects = {id(x) for x in mine if bound - math.log2(x.throughput) > least}
            if len(suspects) < 2:
                continue  # fewer than two links of it can be slow: no edge is
            ids = {id(x) for x in mine}
            rest = [x for x in remote if id(x) not in ids]
            judged = [(x, _judge(x, rest, opts, effect=False) if id(x) in suspects else None)
                      for x in mine]  # fmt: skip
            slow = tuple(SlowLink(x, ref, None) for x, ref in judged if ref is not None)
            untimed = [x for x, ref in judged if ref is None and x.transfer_s == 0]
            if len({(s.link.src, s.link.dst) for s in slow}) < 2:
                continue
            if len(slow) + len(untimed) == len(judged):
                edge = SlowEdge(host, direction, slow, len(untimed))
                if edge.cost >= opts.min_share:
                    out.append(edge)
    return _egress_first(out)


def _by_host(found: Sequence[Link], end: str, hosts: Mapping[int, str]) -> dict[str, list[Link]]:
    """The links by the host of their ``end`` ("src" or "dst"), in their order."""
    out: dict[str, list[Link]] = {}
    for link in found:
        out.setdefault(hosts.get(getattr(link, end), ""), []).append(link)
    return out


def _egress_first(edges: list[SlowEdge]) -> list[SlowEdge]:
    """A host's slow egress explains the other hosts' slow ingress over the same links."""
    outs = [e for e in edges if e.direction == "out"]
    covered = {(s.link.src, s.link.dst) for e in outs for s in e.links}
    ins = [e for e in edges if e.direction == "in"
           and not {(s.link.src, s.link.dst) for s in e.links} <= covered]  # fmt: skip
    return outs + ins
