"""The statuses in host agents' documents, with ranks that are alike parsed once.

A host agent's summary gives each rank whose status is plain a digest
(:mod:`cclctl.status_digest`): its key, its identity and clock, and its call in flight.
Of the ranks of one key across every host, the first is parsed in full (the *model*); the
others are made from it and their digests, never parsed. A model is checked: the digest
of what it says must be the key its agent gave it, else the next rank of the key is tried
as the model; and every rank's text must hash to what its digest says: a document whose
summary does not match its statuses costs time, never a wrong status. A rank without a
digest (its status is not plain: a revoke, an error, a
stack, an ending ...) or with one that does not have the shape is parsed in full, as every
rank is without this module.

What a made status lacks: its slow signals (none), its counters (the model's) and its
completed calls' timings (the model's). A hang's diagnosis reads none of them; `top` and
`diagnose slow`, which do, parse every status.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from cclctl.errors import BadInput
from cclctl.host_status import HostDocument
from cclctl.records import RankSnapshot
from cclctl.status_digest import Alike, Digest, checked, text_hash

#: From this many statuses in host documents `cclctl diagnose hang --store` (and the rank
#: that diagnoses a hang its watchdog found) parses ranks that are alike once; below it, a
#: job's every status costs less than a second to read.
ALIKE_FROM = 1024
#: Parses one rank's status text in full: its snapshot (or why it is unusable) and its
#: own digest's key (None: it has none).
ParseOne = Callable[[str, int], tuple[RankSnapshot | BadInput, str | None]]
#: What :func:`host_statuses` yields: a rank, the document that holds it, its status (or
#: why it is unusable).
Found = tuple[int, HostDocument, RankSnapshot | BadInput]


def digest_rows(doc: HostDocument) -> Mapping[str, object]:
    """The digests a host document's summary gives its ranks, by rank as text, unchecked
    (:func:`~cclctl.status_digest.checked` each); none where the summary has no map."""
    rows = doc.summary.get("digests")
    return rows if isinstance(rows, dict) else {}


def host_statuses(
    hosts: Iterable[HostDocument], parse_one: ParseOne, makers: dict[str, Alike] | None = None
) -> Iterator[Found]:
    """Every status ``hosts`` hold, in full where it has no digest, else made from its
    key's model (see the module's docstring). ``makers``: each key's maker, found here or
    given (a key's maker is added to it as its model is found)."""
    makers = {} if makers is None else makers
    groups: dict[str, list[tuple[int, HostDocument, Digest]]] = {}
    for doc in hosts:
        rows = digest_rows(doc)
        for rank, text in doc.statuses.items():
            own = checked(rows.get(str(rank)))
            if own is None or text_hash(text) != own.text:
                yield rank, doc, parse_one(text, rank)[0]
            else:
                groups.setdefault(own.key, []).append((rank, doc, own))
    for key, members in groups.items():
        for rank, doc, own in members:
            maker = makers.get(key)
            if maker is not None:
                yield rank, doc, maker.make(rank, doc.host, own)
                continue
            snap, its_key = parse_one(doc.statuses[rank], rank)
            if isinstance(snap, RankSnapshot) and its_key == key:
                makers[key] = Alike(snap)
            yield rank, doc, snap
