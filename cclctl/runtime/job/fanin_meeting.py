"""The world communicator's transport meeting after a fan-in rendezvous: a constant number
of store requests per rank, and no rank lists or waits on every rank's key.

The exchange rounds of :class:`~cclctl.runtime.transport.meeting.ExchangeMeeting` have
every rank read every rank's value: three times N times N key reads for the job, which a
job of ten thousand ranks never gets through. After the fan-in rendezvous each rank
already holds most of what the choice needs, in the world document
(:mod:`cclctl.runtime.hostagent.world_doc`): every rank's host key and the ranks that
asked for TCP came in the claims. The rest, under ``transport/0/`` (the world
communicator's first life; a retry meets in rounds under its own prefix):

- **addresses**: each rank sets ``addr/<rank>`` once; a rank reads a peer's address with
  one blocking get when it first dials that peer (:class:`PeerAddresses`), so it reads
  only its algorithms' peers. A peer that never published fails the dial, naming it in
  the words of the exchange's timeout;
- **segment names**: among a host's ranks only, under ``shm/<hash of the host key>/``: a
  set, then one blocking get per peer of the host (no listing: the store's scans every
  key it holds);
- **the mapped verdict**: each rank sets ``mapped/<rank>`` (and ``problem/<rank>`` when it
  could not map its host's segments) and adds 1 to ``mapped#``; the rank whose add reaches
  N lists ``problem/`` alone and writes ``verdict``, which every rank reads with one
  blocking get, so all reach the same choice. At the timeout the first rank to take
  ``lister`` lists ``mapped/`` and writes the verdict naming the ranks that never arrived.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, overload

from cclctl.errors import RendezvousError, StoreTimeout
from cclctl.ranges import fold_ranks
from cclctl.runtime.transport.meeting import Roster
from cclctl.store.scope import ScopedStore

PREFIX = "transport/0/"  # the world communicator's join: epoch 0
ADDRESS_PREFIX = PREFIX + "addr/"
SEGMENT_PREFIX = PREFIX + "shm/"
MAPPED_PREFIX = PREFIX + "mapped/"  # every rank, as it arrives at the verdict
PROBLEM_PREFIX = PREFIX + "problem/"  # only ranks that could not map their host's segments
COUNT_KEY = PREFIX + "mapped#"
VERDICT_KEY = PREFIX + "verdict"
LISTER_KEY = PREFIX + "lister"
#: how long, past its timeout, a rank waits for the lister's word on who is missing
LISTER_GRACE_S = 5.0


def _timed_out(what: str, timeout_s: float, missing: Sequence[int], n: int, where: str) -> str:
    """The exchange's words (:func:`~cclctl.runtime.job.gather.gather`) for a timeout."""
    named = f"rank {missing[0]}" if len(missing) == 1 else f"ranks {fold_ranks(missing)}"
    return f"{what} timed out after {timeout_s:g}s: {named} of {n} never arrived ({where})"


class PeerAddresses(Sequence[str]):
    """Every rank's TCP address by rank, each fetched on its first read (the dial to that
    peer) with one blocking get, then kept; thread-safe (a read twice at once gets twice)."""

    def __init__(self, scoped: ScopedStore, rank: int, own: str, size: int, timeout_s: float):
        self._scoped, self._size, self._timeout_s = scoped, size, timeout_s
        self._known: dict[int, str] = {rank: own}
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
        try:
            address = self._scoped.get(f"{ADDRESS_PREFIX}{peer}", self._timeout_s).decode()
        except StoreTimeout:
            where = f"job {_job_of(self._scoped)!r}, store {self._scoped.address}"
            message = _timed_out("exchange 'transport'", self._timeout_s, [peer], self._size, where)
            raise RendezvousError(message, missing=str(peer), elapsed=self._timeout_s) from None
        with self._lock:
            self._known[peer] = address
        return address


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
    ) -> None:
        """``keys``, ``tcp_ranks``: the world document's (every rank's host key; the ranks
        that asked for TCP), which stand for each rank's ``choice`` and ``host``."""
        self._scoped, self._rank, self._size = scoped, rank, world_size
        self._keys, self._tcp = list(keys), list(tcp_ranks)
        self._timeout_s = timeout_s

    def meet(self, choice: str, host: str, address: str) -> Roster:
        """Publish this rank's address; ``choice`` and ``host`` came in its claim."""
        self._scoped.set(f"{ADDRESS_PREFIX}{self._rank}", address.encode())
        addresses = PeerAddresses(self._scoped, self._rank, address, self._size, self._timeout_s)
        return Roster(keys=self._keys, tcp_asked=bool(self._tcp), addresses=addresses)

    def segments(self, local: Sequence[int], name: bytes) -> Mapping[int, bytes]:
        """The host's ranks' segment names, exchanged among them alone: one blocking get
        per peer of the host (a listing would scan every key of the store)."""
        if len(local) < 2:
            return {self._rank: name}
        host = hashlib.sha256(self._keys[self._rank].encode()).hexdigest()[:16]
        prefix = f"{SEGMENT_PREFIX}{host}/"
        self._scoped.set(f"{prefix}{self._rank}", name)
        names = {self._rank: name}
        deadline = time.monotonic() + self._timeout_s
        for peer in local:
            if peer in names:
                continue
            try:
                left = max(0.001, deadline - time.monotonic())
                names[peer] = self._scoped.get(f"{prefix}{peer}", left)
            except StoreTimeout:
                missing = [r for r in local if r not in names
                           and self._scoped.try_get(f"{prefix}{r}") is None]  # fmt: skip
                where = f"job {_job_of(self._scoped)!r}, store {self._scoped.address}"
                what = "exchange 'shm/segments'"
                message = _timed_out(what, self._timeout_s, missing, self._size, where)
                raise RendezvousError(
                    message, missing=fold_ranks(missing), elapsed=self._timeout_s
                ) from None
        return names

    def mapped(self, problem: str) -> bool:
        """Whether every rank of the job mapped its host's segments: one verdict for all."""
        scoped, rank = self._scoped, self._rank
        if problem:
            scoped.set(f"{PROBLEM_PREFIX}{rank}", problem.encode())
        scoped.set(f"{MAPPED_PREFIX}{rank}", b"")
        if scoped.add(COUNT_KEY, 1) == self._size:
            self._judge()
        verdict = self._verdict()
        if "error" in verdict:
            raise RendezvousError(str(verdict["error"]), **(verdict.get("fields") or {}))
        return not verdict["problems"]

    def _judge(self) -> None:
        """Write the verdict once every rank has arrived: the problems, by rank."""
        scoped = self._scoped
        problems = {key.rsplit("/", 1)[1]: raw.decode(errors="replace")
                    for key, raw in scoped.list(PROBLEM_PREFIX).items()}  # fmt: skip
        scoped.compare_set(VERDICT_KEY, None, json.dumps({"problems": problems}).encode())

    def _verdict(self) -> dict[str, Any]:
        """The verdict, or at the timeout the lister's word on the ranks that never came."""
        scoped = self._scoped
        try:
            return dict(json.loads(scoped.get(VERDICT_KEY, self._timeout_s)))
        except StoreTimeout:
            pass
        me = str(self._rank).encode()
        if scoped.compare_set(LISTER_KEY, None, me) == me:
            present = scoped.list(MAPPED_PREFIX)
            missing = [r for r in range(self._size) if f"{MAPPED_PREFIX}{r}" not in present]
            if not missing:  # all came, but the last one's verdict did not: write it here
                self._judge()
                return dict(json.loads(scoped.get(VERDICT_KEY, LISTER_GRACE_S)))
            where = f"job {_job_of(scoped)!r}, store {scoped.address}"
            message = _timed_out(
                "exchange 'shm/mapped'", self._timeout_s, missing, self._size, where
            )
            fields = {"missing": fold_ranks(missing), "elapsed": self._timeout_s}
            failed = json.dumps({"error": message, "fields": fields}).encode()
            scoped.compare_set(VERDICT_KEY, None, failed)
        try:
            return dict(json.loads(scoped.get(VERDICT_KEY, LISTER_GRACE_S)))
        except StoreTimeout:
            where = f"job {_job_of(scoped)!r}, store {scoped.address}"
            raise RendezvousError(
                f"exchange 'shm/mapped' timed out after {self._timeout_s:g}s: no word of the "
                f"ranks missing ({where})"
            ) from None


def _job_of(scoped: ScopedStore) -> str:
    return scoped.prefix.removeprefix("cclctl/").rstrip("/")
