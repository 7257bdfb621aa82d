"""Rendezvous that fans in: a host's claims go to the store as one group, and the job's one
world document comes back, in a constant number of store operations per group.

A group is what one host agent (:mod:`cclctl.runtime.hostagent.rendezvous`) gathered from
its ranks, or one rank alone whose agent could not be reached. Its writer, with the job's
keys (under ``cclctl/<job>/``):

1. agrees on the world size: one compare-and-set of ``rdzv/world_size``, as the flat path's
   ranks do (marked ``fanin``, so a job whose ranks mix the two paths says so);
2. writes its claims (host, each rank's pid, its host key and whether it asked for TCP,
   for the transport's choice: :mod:`cclctl.runtime.job.fanin_meeting`) under
   ``rdzv/group/<first rank>.<its pid>.<ranks>``;
3. adds its ranks to ``rdzv/arrived``; a writer that sees the count reach the world size
   reads the groups (the one listing of the rendezvous), checks them (a rank claimed by
   two processes) and writes ``rdzv/world``: the world document (:mod:`.world_doc`), or
   the error every rank then fails with;
4. reads ``rdzv/world`` once (a blocking get up to its timeout). At the timeout the first
   writer to take ``rdzv/lister`` reads the groups and writes the error naming the ranks
   that never arrived; the others read it.

Every check names the ranks, hosts and pids involved, in the flat path's words. The
protocol is written once, over :class:`FanInStore`: an agent drives it on its event loop,
a rank alone drives it with blocking calls (:func:`run_blocking`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Coroutine, Sequence
from typing import Any, Protocol

from cclctl.ranges import fold_ranks
from cclctl.runtime.hostagent import world_doc

WORLD_SIZE_KEY = "rdzv/world_size"
GROUP_PREFIX = "rdzv/group/"
ARRIVED_KEY = "rdzv/arrived"
WORLD_KEY = "rdzv/world"
LISTER_KEY = "rdzv/lister"
ERROR_KEY = "rdzv/error"  # the flat path's: a rank of it in a mixed job fails fast too
#: how long, past its timeout, a group waits for the lister's word on who is missing
LISTER_GRACE_S = 5.0


class FanInStore(Protocol):
    """The job's store (keys relative to the job), as the protocol uses it."""

    async def set(self, key: str, value: bytes) -> None: ...
    async def add(self, key: str, delta: int) -> int: ...
    async def compare_set(self, key: str, expected: bytes | None, desired: bytes) -> bytes: ...
    async def get(self, key: str, timeout_s: float) -> bytes | None: ...  # None: timed out
    async def list(self, prefix: str) -> dict[str, bytes]: ...


@dataclasses.dataclass(frozen=True)
class Claim:
    """One rank's claim, as its rank sent it (``key``: its host key; ``tcp``: it asked for
    TCP)."""

    rank: int
    pid: int
    world_size: int
    timeout_s: float
    key: str = ""
    tcp: bool = False


@dataclasses.dataclass(frozen=True)
class Where:
    """What the messages name: the job and its store's address."""

    job: str
    store: str

    def words(self) -> str:
        """How a message names them: ``job 'j', store host:port``."""
        return f"job {self.job!r}, store {self.store}"


def never_arrived(
    what: str, timeout_s: float, missing: Sequence[int], world_size: int, where: Where
) -> str:
    """What every rendezvous round (the flat claims and exchanges, the fan-in groups, the
    transport's meeting) says at its timeout, naming the ranks that never came."""
    named = f"rank {missing[0]}" if len(missing) == 1 else f"ranks {fold_ranks(missing)}"
    return (f"{what} timed out after {timeout_s:g}s: {named} of {world_size} never arrived "
            f"({where.words()})")  # fmt: skip


def who(host: str, pid: object) -> str:
    return f"{host} pid {pid}"


def error_doc(message: str, ranks: Sequence[int] = (), **fields: Any) -> bytes:
    """``rdzv/world`` when the rendezvous failed: the message, and the ranks it is about
    (they raise it as it is; the others as "rendezvous abandoned: ...")."""
    return json.dumps({"error": message, "ranks": list(ranks), "fields": fields}).encode()


async def join_group(
    store: FanInStore, host: str, claims: Sequence[Claim], where: Where
) -> dict[int, dict[str, Any]]:
    """Join ``claims`` (one host's, ranks distinct) to the job; each rank's answer:
    ``{"world": <document>}`` or ``{"error": ..., "fields": {...}}``."""
    answers = await _agree_world_size(store, host, claims)
    joining = [c for c in claims if c.rank not in answers]
    if not joining:
        return answers
    world_size, timeout_s = joining[0].world_size, min(c.timeout_s for c in joining)
    # the first claim's rank and pid, and the group's size: a rank alone after its agent
    # died never overwrites the agent's group of several
    key = f"{GROUP_PREFIX}{joining[0].rank}.{joining[0].pid}.{len(joining)}"
    group = _group(host, joining)
    await store.set(key, json.dumps(group, separators=(",", ":")).encode())
    if await store.add(ARRIVED_KEY, len(joining)) >= world_size:
        await settle(store, world_size, where, timeout_s, missing_is_final=False)
    raw = await store.get(WORLD_KEY, timeout_s)
    if raw is None:
        if await store.compare_set(LISTER_KEY, None, key.encode()) == key.encode():
            await settle(store, world_size, where, timeout_s, missing_is_final=True)
        raw = await store.get(WORLD_KEY, LISTER_GRACE_S)
    if raw is None:
        message = (f"rendezvous timed out after {timeout_s:g}s: no word of the ranks missing "
                   f"(job {where.job!r}, store {where.store})")  # fmt: skip
        answers.update({c.rank: {"error": message, "fields": {}} for c in joining})
        return answers
    answers.update(await _answers(store, raw, host, joining, world_size))
    return answers


def _group(host: str, claims: Sequence[Claim]) -> dict[str, Any]:
    """The group's document: its claims, their host key (one, or one per claim where they
    differ) and the ranks that asked for TCP (only when some did)."""
    group: dict[str, Any] = {"host": host, "claims": [[c.rank, c.pid] for c in claims]}
    keys = [c.key for c in claims]
    if len(set(keys)) == 1:
        group["key"] = keys[0]
    else:
        group["keys"] = keys
    tcp = [c.rank for c in claims if c.tcp]
    if tcp:
        group["tcp"] = tcp
    return group


async def _agree_world_size(
    store: FanInStore, host: str, claims: Sequence[Claim]
) -> dict[int, dict[str, Any]]:
    """One compare-and-set for the group; an answer for each rank that disagrees."""
    first_claim = claims[0]
    mine = {"rank": first_claim.rank, "host": host, "pid": first_claim.pid,
            "world_size": first_claim.world_size, "fanin": True}  # fmt: skip
    first = json.loads(await store.compare_set(WORLD_SIZE_KEY, None, json.dumps(mine).encode()))
    first_who = who(str(first.get("host", "?")), first.get("pid", "?"))
    answers: dict[int, dict[str, Any]] = {}
    for claim in claims:
        if first.get("fanin") is not True:
            message = (f"rendezvous path disagreement: rank {claim.rank} ({who(host, claim.pid)}) "
                       f"joins through its host agent, but rank {first.get('rank')} "
                       f"({first_who}) joined without one: set the same CCLCTL_HOST_AGENT "
                       "on every rank")  # fmt: skip
        elif claim.world_size != first.get("world_size"):
            message = (f"world size disagreement: rank {claim.rank} ({who(host, claim.pid)}) "
                       f"was started with world size {claim.world_size}, but rank "
                       f"{first.get('rank')} ({first_who}) set it to {first.get('world_size')} "
                       "first")  # fmt: skip
        else:
            continue
        answers[claim.rank] = {"error": message, "fields": {"world_size": claim.world_size}}
        await report(store, message, [claim.rank])
    return answers


async def report(store: FanInStore, message: str, ranks: Sequence[int]) -> None:
    """End the rendezvous with ``message`` (the first error written wins), where the fan-in
    ranks and any flat one look."""
    await store.compare_set(WORLD_KEY, None, error_doc(message, ranks))
    await store.compare_set(ERROR_KEY, None, message.encode())


async def settle(
    store: FanInStore, world_size: int, where: Where, timeout_s: float, *, missing_is_final: bool
) -> None:
    """Read the groups and write ``rdzv/world``: the world, a rank claimed twice, or (once
    the timeout passed: ``missing_is_final``) the ranks that never arrived."""
    claims: dict[int, tuple[str, int]] = {}
    keys: dict[int, str] = {}
    tcp: set[int] = set()
    for raw in (await store.list(GROUP_PREFIX)).values():
        group = json.loads(raw)
        their = group.get("keys") or [group.get("key", "")] * len(group["claims"])
        for (rank, pid), key in zip(group["claims"], their, strict=True):
            host = str(group["host"])
            # the same process twice (through its agent, then alone) is one claim
            seen = claims.setdefault(int(rank), (host, int(pid)))
            if seen != (host, int(pid)):
                message = f"rank {rank} is claimed twice: by {who(*seen)} and {who(host, pid)}"
                await report(store, message, [int(rank)])
                return
            keys.setdefault(int(rank), str(key))
        tcp.update(int(rank) for rank in group.get("tcp", ()))
    missing = [r for r in range(world_size) if r not in claims]
    if not missing:
        doc = world_doc.build(
            world_size, ((r, h, p) for r, (h, p) in claims.items()), keys, tcp & set(claims)
        )
        await store.compare_set(WORLD_KEY, None, doc)
    elif missing_is_final:
        message = never_arrived("rendezvous", timeout_s, missing, world_size, where)
        fields = {"missing": fold_ranks(missing), "elapsed": timeout_s}
        failed = json.dumps({"error": message, "timeout": True, "fields": fields}).encode()
        await store.compare_set(WORLD_KEY, None, failed)


async def _answers(
    store: FanInStore, raw: bytes, host: str, claims: Sequence[Claim], world_size: int
) -> dict[int, dict[str, Any]]:
    """Each rank's answer from ``rdzv/world`` as read."""
    if raw.startswith(b'{"error"'):  # else the world (world_doc.build), not decoded here
        doc = json.loads(raw)
        message = str(doc["error"])
        own = set(doc.get("ranks") or ())
        fields = doc.get("fields") or {}
        if not doc.get("timeout"):
            return {c.rank: {"error": message if c.rank in own
                             else f"rendezvous abandoned: {message}", "fields": {}}
                    for c in claims}  # fmt: skip
        return {c.rank: {"error": message, "fields": fields} for c in claims}
    members = world_doc.host_members(raw, host, world_size)
    answers: dict[int, dict[str, Any]] = {}
    text = raw.decode()  # each rank reads the whole world from it
    for claim in claims:
        if members.get(claim.rank) == claim.pid:
            answers[claim.rank] = {"world": text}
            continue
        hosts, pids = world_doc.expand(raw, world_size)  # a rank claimed twice: who else
        first = who(hosts[claim.rank], pids[claim.rank])
        message = f"rank {claim.rank} is claimed twice: by {first} and {who(host, claim.pid)}"
        await store.compare_set(ERROR_KEY, None, message.encode())
        answers[claim.rank] = {"error": message, "fields": {}}
    return answers


def run_blocking(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coro`` to its end in this thread, without an event loop: it may only await a
    :class:`FanInStore` whose methods never suspend (a blocking store's)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a blocking rendezvous awaited something that suspends")
