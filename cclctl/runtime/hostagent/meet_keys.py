"""The world communicator's transport meeting after a fan-in rendezvous, in the store: its
keys and the mapped verdict's protocol, written once over
:class:`~cclctl.runtime.hostagent.fanin.FanInStore` (a host agent drives it for its ranks
on its event loop, :mod:`.meeting_service`; a rank on its own drives it with blocking
calls, :mod:`cclctl.runtime.job.fanin_meeting`).

Keys, under ``transport/0/`` (the world communicator's first life):

- ``hostaddr/<tag>``: one document per host key (``tag``: :func:`host_tag`), the TCP
  addresses of the ranks it names (``{"<rank>": "<address>"}``), written once
  (compare-and-set): by the host's agent with its ranks', or empty by the first rank of
  that host that meets without its agent. A rank it does not name has set ``addr/<rank>``
  (or will: it is on its way), so a dialler reads one document per peer host, and a
  per-rank key only for a rank that met on its own;
- ``shm/<tag>/<rank>``: a segment name, for the ranks that exchange them through the store;
- ``mapped/<rank>`` or ``mapped/g<first rank>`` (the folded ranks of an agent's batch):
  who arrived at the verdict; ``problem/<rank>`` or ``problem/g<first rank>`` (a JSON
  object by rank): why a rank could not map its host's segments; ``mapped#``: the ranks
  counted in; ``verdict``; ``lister``.

The verdict: each batch (one rank, or an agent's ranks) writes its marker and problems and
adds its ranks to ``mapped#``; the batch whose add reaches N lists ``problem/`` alone and
writes ``verdict``, which every batch reads with one blocking get. At the timeout the first
batch to take ``lister`` lists ``mapped/`` and writes the verdict naming the ranks that
never arrived.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from cclctl.ranges import fold_ranks, parse_ranks
from cclctl.runtime.hostagent.fanin import FanInStore, Where, never_arrived

PREFIX = "transport/0/"  # the world communicator's join: epoch 0
ADDRESS_PREFIX = PREFIX + "addr/"
HOST_ADDRESS_PREFIX = PREFIX + "hostaddr/"
SEGMENT_PREFIX = PREFIX + "shm/"
MAPPED_PREFIX = PREFIX + "mapped/"  # every rank, as it arrives at the verdict
PROBLEM_PREFIX = PREFIX + "problem/"  # only ranks that could not map their host's segments
COUNT_KEY = PREFIX + "mapped#"
VERDICT_KEY = PREFIX + "verdict"
LISTER_KEY = PREFIX + "lister"
#: how long, past its timeout, a rank waits for the lister's word on who is missing
LISTER_GRACE_S = 5.0


def host_tag(key: str) -> str:
    """The store's name for the ranks of one host key."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _marker(ranks: Sequence[int]) -> str:
    return str(ranks[0]) if len(ranks) == 1 else f"g{ranks[0]}"


async def count_in(
    store: FanInStore, ranks: Sequence[int], problems: Mapping[int, str], size: int
) -> None:
    """Count ``ranks`` (sorted) in at the verdict with their problems (by rank, "" for none);
    the batch that completes the count writes the verdict."""
    problems = {r: p for r, p in problems.items() if p}
    if problems:
        value = problems[ranks[0]] if len(ranks) == 1 else json.dumps(problems)
        await store.set(f"{PROBLEM_PREFIX}{_marker(ranks)}", str(value).encode())
    folded = b"" if len(ranks) == 1 else fold_ranks(ranks).encode()
    await store.set(f"{MAPPED_PREFIX}{_marker(ranks)}", folded)
    after = await store.add(COUNT_KEY, len(ranks))
    if after - len(ranks) < size <= after:
        await judge(store)


async def counted(store: FanInStore, rank: int) -> bool:
    """Whether ``rank`` is counted in already: a marker names it (an agent that died, or
    whose store answer was lost, after it wrote its batch's marker; the marker goes before
    the add, so a rank never adds twice, and at worst waits for the lister, which finds
    it). One listing of ``mapped/``: only a rank whose agent failed it in this step."""
    for key, value in (await store.list(MAPPED_PREFIX)).items():
        name = key.rsplit("/", 1)[1]
        if name == str(rank) or (name.startswith("g") and rank in parse_ranks(value.decode())):
            return True
    return False


async def judge(store: FanInStore) -> None:
    """Write the verdict once every rank has arrived: the problems, by rank."""
    problems: dict[str, str] = {}
    for key, raw in (await store.list(PROBLEM_PREFIX)).items():
        name = key.rsplit("/", 1)[1]
        text = raw.decode(errors="replace")
        if name.startswith("g"):
            problems.update({str(r): str(p) for r, p in json.loads(text).items()})
        else:
            problems[name] = text
    await store.compare_set(VERDICT_KEY, None, json.dumps({"problems": problems}).encode())


async def verdict(
    store: FanInStore, ranks: Sequence[int], size: int, timeout_s: float, where: Where
) -> dict[str, Any]:
    """The verdict (``{"problems": ...}``), or at the timeout the lister's word on the ranks
    that never came (``{"error": ..., "fields": ...}``)."""
    raw = await store.get(VERDICT_KEY, timeout_s)
    if raw is not None:
        return dict(json.loads(raw))
    me = _marker(ranks).encode()
    if await store.compare_set(LISTER_KEY, None, me) == me:
        present: set[int] = set()
        for key, value in (await store.list(MAPPED_PREFIX)).items():
            name = key.rsplit("/", 1)[1]
            present.update(parse_ranks(value.decode()) if name.startswith("g") else [int(name)])
        missing = [r for r in range(size) if r not in present]
        if not missing:  # all came, but the last one's verdict did not: write it here
            await judge(store)
        else:
            what = "exchange 'shm/mapped'"
            message = never_arrived(what, timeout_s, missing, size, where)
            fields = {"missing": fold_ranks(missing), "elapsed": timeout_s}
            failed = json.dumps({"error": message, "fields": fields}).encode()
            await store.compare_set(VERDICT_KEY, None, failed)
    raw = await store.get(VERDICT_KEY, LISTER_GRACE_S)
    if raw is not None:
        return dict(json.loads(raw))
    return {
        "error": f"exchange 'shm/mapped' timed out after {timeout_s:g}s: no word of the "
        f"ranks missing ({where.words()})",
        "fields": {},
    }


async def publish_addresses(store: FanInStore, tag: str, addresses: Mapping[int, str]) -> bool:
    """Write the host document of ``tag`` naming ``addresses``; False when another (an
    empty one: a rank of the host met on its own) was there first."""
    doc = json.dumps({str(r): a for r, a in sorted(addresses.items())}).encode()
    return await store.compare_set(f"{HOST_ADDRESS_PREFIX}{tag}", None, doc) == doc
