"""The world communicator's transport meeting after a fan-in rendezvous: a handful of store
requests per host, and no rank lists or waits on every rank's key.

The exchange rounds of :class:`~cclctl.runtime.transport.meeting.ExchangeMeeting` have
every rank read every rank's value: three times N times N key reads for the job, which a
job of ten thousand ranks never gets through. After the fan-in rendezvous each rank
already holds most of what the choice needs, in the world document
(:mod:`cclctl.runtime.hostagent.world_doc`): every rank's host key and the ranks that
asked for TCP came in the claims. The rest goes through the host's agent, which carried
the rank's claim (:mod:`cclctl.runtime.hostagent.meeting_service`; the keys and the
verdict's protocol: :mod:`cclctl.runtime.hostagent.meet_keys`):

- **addresses**: the agent writes one document per host key with its ranks' addresses; a
  rank reads a peer's address when it first dials that peer (:class:`PeerAddresses`): its
  host's document once per peer host, and the peer's own ``addr/<rank>`` only where the
  document does not name it (the peer met on its own). A peer that never published fails
  the dial, naming it in the words of the exchange's timeout;
- **segment names**: among a host's ranks only, through their agent, with no store
  request; where a rank of the host meets on its own, all of them exchange under
  ``shm/<host tag>/``: a set, then one blocking get per peer of the host (no listing: the
  store's scans every key it holds);
- **the mapped verdict**: the agent counts its ranks in at once and reads the verdict once
  for them; a rank on its own counts itself in and reads it; the counter counts ranks, so
  both add up, and all reach the same choice.

A rank meets on its own (the store path) where it joined alone, where its agent is gone
(its connection fails or breaks: it stays on its own for the rest of the meeting), or
where the agent answers so; the agent answers so to a round of the segment names that
lacks a rank of the host when its wait is over, so the two paths never wait on each other.
A rank that sent its agent the mapped step and got no verdict back looks for its agent's
marker first, and counts itself in only where none names it (never twice). An agent that
holds the connection but never answers fails the rank, naming the agent.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, overload

from cclctl.errors import RendezvousError
from cclctl.ranges import fold_ranks
from cclctl.runtime.hostagent import meet_keys, world_doc
from cclctl.runtime.hostagent.address import peer_pid
from cclctl.runtime.hostagent.fanin import WORLD_KEY, Where, never_arrived, run_blocking
from cclctl.runtime.hostagent.fanin_stores import BlockingStore, get_or_none
from cclctl.runtime.hostagent.meet_keys import (
    ADDRESS_PREFIX,
    COUNT_KEY,
    HOST_ADDRESS_PREFIX,
    LISTER_GRACE_S,
    LISTER_KEY,
    MAPPED_PREFIX,
    PREFIX,
    PROBLEM_PREFIX,
    SEGMENT_PREFIX,
    VERDICT_KEY,
    host_tag,
)
from cclctl.runtime.hostagent.meeting_service import GATHER_S
from cclctl.runtime.hostagent.rendezvous import LENGTH, MAX_ANSWER, frame
from cclctl.runtime.hostagent.wire import read_object
from cclctl.runtime.socket_io import connect_unix
from cclctl.runtime.transport.meeting import Roster
from cclctl.store.scope import ScopedStore

__all__ = [
    "ADDRESS_PREFIX", "COUNT_KEY", "HOST_ADDRESS_PREFIX", "LISTER_GRACE_S", "LISTER_KEY",
    "MAPPED_PREFIX", "PREFIX", "PROBLEM_PREFIX", "SEGMENT_PREFIX", "VERDICT_KEY",
    "FanInMeeting", "PeerAddresses", "published_address",
]  # fmt: skip

log = logging.getLogger("cclctl.rendezvous")

#: the agent's answer may come this long after the rank's timeout (its round's wait, the
#: lister's grace, and a margin)
ANSWER_SLACK_S = GATHER_S + LISTER_GRACE_S + 5.0


class PeerAddresses(Sequence[str]):
    """Every rank's TCP address by rank, each fetched on its first read (the dial to that
    peer): the peer's host document (one blocking get per peer host, then kept), and the
    peer's own key where the document does not name it; thread-safe (a read twice at once
    gets twice)."""

    def __init__(
        self,
        scoped: ScopedStore,
        rank: int,
        own: str,
        keys: Sequence[str],
        timeout_s: float,
    ) -> None:
        self._scoped, self._keys, self._timeout_s = scoped, keys, timeout_s
        self._size = len(keys)
        self._known: dict[int, str] = {rank: own}
        self._hosts: dict[str, dict[str, str]] = {}  # host tag -> its document
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._size

    @overload
    def __getitem__(self, peer: int) -> str: ...
    @overload
    def __getitem__(self, peer: slice) -> list[str]: ...
    def __getitem__(self, peer: int | slice) -> str | list[str]:
        if isinstance(peer, slice):
            return [self[p] for p in range(self._size)[peer]]
        if not 0 <= peer < self._size:
            raise IndexError(peer)
        with self._lock:
            known = self._known.get(peer)
        if known is not None:
            return known
        deadline = time.monotonic() + self._timeout_s
        tag = host_tag(self._keys[peer])
        with self._lock:
            doc = self._hosts.get(tag)
        if doc is None:
            raw = get_or_none(self._scoped, f"{HOST_ADDRESS_PREFIX}{tag}", self._timeout_s)
            if raw is None:
                raise self._never(peer)
            doc = {str(r): str(a) for r, a in json.loads(raw).items()}
            with self._lock:
                self._hosts[tag] = doc
        address = doc.get(str(peer))
        if address is None:  # the peer met on its own: its own key
            left = max(0.001, deadline - time.monotonic())
            raw = get_or_none(self._scoped, f"{ADDRESS_PREFIX}{peer}", left)
            if raw is None:
                raise self._never(peer)
            address = raw.decode()
        with self._lock:
            self._known[peer] = address
        return address

    def _never(self, peer: int) -> RendezvousError:
        where = Where(self._scoped.job, self._scoped.address)
        message = never_arrived("exchange 'transport'", self._timeout_s, [peer], self._size,
                                where)  # fmt: skip
        return RendezvousError(message, missing=str(peer), elapsed=self._timeout_s)


class FanInMeeting:
    """The meeting of a job that joined through its host agents (see the module)."""

    def __init__(
        self,
        scoped: ScopedStore,
        rank: int,
        world_size: int,
        keys: Sequence[str],
        tcp_ranks: Sequence[int],
        timeout_s: float,
        agent: str = "",
    ) -> None:
        """``keys``, ``tcp_ranks``: the world document's (every rank's host key; the ranks
        that asked for TCP), which stand for each rank's ``choice`` and ``host``;
        ``agent``: the rendezvous socket of the host agent that carried this rank's claim
        ("" where it joined alone)."""
        self._scoped, self._rank, self._size = scoped, rank, world_size
        self._keys, self._tcp = list(keys), list(tcp_ranks)
        self._timeout_s = timeout_s
        self._agent = agent
        self._taken = False  # the agent took the last step's frame, then gave no answer
        self._where = Where(scoped.job, scoped.address)
        self._tag = host_tag(self._keys[rank])
        self._local = [r for r, key in enumerate(self._keys) if key == self._keys[rank]]

    def meet(self, choice: str, host: str, address: str) -> Roster:
        """Publish this rank's address; ``choice`` and ``host`` came in its claim."""
        if self._ask("addr", address) is None:  # on its own: its key, and its host's
            self._scoped.set(f"{ADDRESS_PREFIX}{self._rank}", address.encode())
            store = BlockingStore(self._scoped)
            run_blocking(meet_keys.publish_addresses(store, self._tag, {}))
        addresses = PeerAddresses(self._scoped, self._rank, address, self._keys,
                                  self._timeout_s)  # fmt: skip
        return Roster(keys=self._keys, tcp_asked=bool(self._tcp), addresses=addresses)

    def segments(self, local: Sequence[int], name: bytes) -> Mapping[int, bytes]:
        """The host's ranks' segment names, exchanged among them alone: through their
        agent, else one blocking get per peer of the host (a listing would scan every key
        of the store)."""
        if len(local) < 2:
            return {self._rank: name}
        answer = self._ask("segments", name.decode())
        names_in = answer.get("names") if answer is not None else None
        if isinstance(names_in, dict):
            got = {int(r): str(n).encode() for r, n in names_in.items()}
            if all(r in got for r in local):
                return {r: got[r] for r in local}
        prefix = f"{SEGMENT_PREFIX}{self._tag}/"
        self._scoped.set(f"{prefix}{self._rank}", name)
        names = {self._rank: name}
        deadline = time.monotonic() + self._timeout_s
        for peer in local:
            if peer in names:
                continue
            left = max(0.001, deadline - time.monotonic())
            raw = get_or_none(self._scoped, f"{prefix}{peer}", left)
            if raw is None:
                missing = [r for r in local if r not in names
                           and self._scoped.try_get(f"{prefix}{r}") is None]  # fmt: skip
                what = "exchange 'shm/segments'"
                message = never_arrived(what, self._timeout_s, missing, self._size, self._where)
                raise RendezvousError(
                    message, missing=fold_ranks(missing), elapsed=self._timeout_s
                ) from None
            names[peer] = raw
        return names

    def mapped(self, problem: str) -> bool:
        """Whether every rank of the job mapped its host's segments: one verdict for all."""
        answer = self._ask("mapped", problem)
        verdict = answer.get("verdict") if answer is not None else None
        if not isinstance(verdict, dict):
            store, me = BlockingStore(self._scoped), [self._rank]
            # the agent took the frame, then failed it or sent the rank off: it may have
            # counted the rank in (its marker goes before its add)
            already = answer is not None and answer.get("counted") is True
            if not already and self._taken:
                already = run_blocking(meet_keys.counted(store, self._rank))
            if not already:
                run_blocking(meet_keys.count_in(store, me, {self._rank: problem}, self._size))
            verdict = run_blocking(
                meet_keys.verdict(store, me, self._size, self._timeout_s, self._where)
            )
        if "error" in verdict:
            raise RendezvousError(str(verdict["error"]), **(verdict.get("fields") or {}))
        return not verdict["problems"]

    def _ask(self, step: str, value: str) -> dict[str, Any] | None:
        """The agent's answer to this rank's ``step``; None where the rank meets on its own
        (no agent, the agent gone, or the agent's word)."""
        self._taken = False
        if not self._agent:
            return None
        sock = connect_unix(self._agent, None)
        if sock is None:
            log.info("cclctl: rank %d found its host agent gone; it meets on its own",
                     self._rank)  # fmt: skip
            self._agent = ""
            return None
        body = {"meet": step, "rank": self._rank, "key": self._keys[self._rank],
                "local": fold_ranks(self._local), "world_size": self._size,
                "timeout_s": self._timeout_s, "value": value}  # fmt: skip
        agent, within = peer_pid(sock), self._timeout_s + ANSWER_SLACK_S
        sock.settimeout(within)
        try:
            sock.sendall(frame(body))
            self._taken = True
            answer = read_object(sock, LENGTH, MAX_ANSWER)
        except TimeoutError:
            raise RendezvousError(
                f"rank {self._rank}: the host agent (pid {agent}) gave no answer to the "
                f"transport meeting's {step!r} within {within:g}s",
                rank=self._rank,
                agent_pid=agent,
            ) from None
        except (OSError, ValueError) as exc:
            log.warning("cclctl: rank %d lost its host agent (pid %d) during the transport "
                        "meeting (%s); it meets on its own", self._rank, agent, exc)  # fmt: skip
            self._agent = ""
            return None
        finally:
            sock.close()
        return None if answer.get("store") else answer


def published_address(scoped: ScopedStore, rank: int, world_size: int, timeout_s: float) -> str:
    """``rank``'s TCP address where it published it after a fan-in rendezvous, read as a
    dialler reads it (the world document names its host): for a reader outside the job."""
    raw = get_or_none(scoped, WORLD_KEY, timeout_s)
    if raw is None:
        raise RendezvousError(f"no world document within {timeout_s:g}s ({scoped.address})")
    keys = world_doc.read(raw, world_size).keys
    return PeerAddresses(scoped, -1, "", keys, timeout_s)[rank]
