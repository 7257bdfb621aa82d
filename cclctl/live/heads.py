"""A large job's statuses read through its host agents' heads: a few documents whole.

Every host agent writes, with its host's document, the document's head (all of it but the
statuses: the summary with each plain status's digest, the ranks it holds; see
:mod:`cclctl.host_status`), in one store request. A reader that makes alike ranks from one
model per key (:mod:`cclctl.live.alike`) needs the text of the models and of the ranks
without a digest only, so it lists the heads (about a kilobyte a host, where the
documents are a few kilobytes a rank) and reads whole only the documents of the hosts
that hold those ranks: for a hang at 100,000 ranks, a handful of hosts out of 12,500.

What is trusted: a rank read from a head alone is made from its key's model and the digest
its agent wrote beside its text, in the same request; where a host's document is read
whole its statuses are checked against their digests as :mod:`cclctl.live.alike` checks
them. A document read whole may be newer than the head listed before it: its own
summary then counts for its ranks (keys are content hashes, so a model of a key makes the
same rank whichever write it came from). Where this cannot give the answer at low cost the
caller lists the whole job, as it does without heads: for a job below
:data:`~cclctl.live.alike.ALIKE_FROM` ranks or agents that write no heads (it sees both in
:func:`listed`'s :class:`Heads`), and where :func:`read` says None: more than
:data:`MAX_READS` documents to read, ranks the heads and the ranks' own keys do not cover,
a key whose model cannot be read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Protocol

from cclctl import host_status
from cclctl.errors import BadInput
from cclctl.host_status import HostDocument
from cclctl.live.alike import Alike, Found, ParseOne, digest_rows, host_statuses
from cclctl.status_digest import Digest, checked

#: At most this many host documents are read whole, one request each; a job that needs
#: more is listed whole (one request).
MAX_READS = 64
#: Rounds of reads to find a key's model (a model read whole may have moved on to another
#: key; the next host of its key is read then).
MODEL_ROUNDS = 3


class HeadStore(Protocol):
    """What reading through heads needs of a store (a StoreClient is one)."""

    def list(self, prefix: str) -> dict[str, bytes]: ...

    def try_get(self, key: str) -> bytes | None: ...


@dataclasses.dataclass
class HeadsRead:
    """The host documents (read whole, else their heads), those that could not be read
    (host -> why), every rank they hold (:data:`~cclctl.live.alike.Found`), and how much
    was read: heads' bytes, documents read whole and their bytes."""

    hosts: dict[str, HostDocument]
    bad_hosts: dict[str, str]
    found: list[Found]
    head_bytes: int = 0
    whole: int = 0
    whole_bytes: int = 0


@dataclasses.dataclass
class Heads:
    """A job's heads as listed: parsed by host, the hosts whose head could not be read
    (their documents are read whole), and the bytes listed."""

    docs: dict[str, HostDocument]
    unreadable: set[str]
    nbytes: int

    @property
    def ranks(self) -> int:
        return sum(len(doc.ranks) for doc in self.docs.values())


def listed(store: HeadStore, prefix: str) -> Heads:
    """The heads of the job under ``prefix`` (``cclctl/<job>/``)."""
    head = prefix + host_status.HEAD_KEY
    listing = store.list(head)
    out = Heads({}, set(), sum(map(len, listing.values())))
    for key, value in listing.items():
        host = key[len(head) :]
        where = "the head of " + host_status.document_name(host)
        try:
            out.docs[host] = host_status.parse(value, where)
        except BadInput:
            out.unreadable.add(host)  # its document whole says what is wrong, if it is
    return out


def read(
    store: HeadStore,
    prefix: str,
    listing: Heads,
    parse_one: ParseOne,
    covered: Mapping[int, object],
    world_size: int | None,
) -> HeadsRead | None:
    """The statuses of the job under ``prefix`` through its heads (``listing``: :func:`listed`),
    or None where the caller should list the job whole (see the module's docstring).
    ``covered``: the ranks whose own keys hold a status; ``world_size``: the job's, if
    known (ranks neither covers send the caller to the whole listing)."""
    heads = listing.docs
    out = HeadsRead({}, {}, [], head_bytes=listing.nbytes)
    need = set(listing.unreadable)
    if world_size is not None:
        seen = {r for doc in heads.values() for r in doc.ranks} | set(covered)
        if len(seen) < world_size:
            return None
    digests = {host: _digests(doc) for host, doc in heads.items()}
    groups = _groups(heads, digests, need)
    makers: dict[str, Alike] = {}
    for _ in range(MODEL_ROUNDS):
        need |= _model_hosts(groups, makers, out.hosts, out.bad_hosts)
        if not need:
            break
        if len(out.hosts) + len(out.bad_hosts) + len(need) > MAX_READS:
            return None
        docs = [doc for host in sorted(need) if (doc := _whole(store, prefix, host, out))]
        out.found.extend(host_statuses(docs, parse_one, makers))
        need = set()
    if any(key not in makers for key in groups):
        return None
    for host, doc in heads.items():
        if host in out.hosts or host in out.bad_hosts:
            continue
        out.hosts[host] = doc
        for rank, own in digests[host]:
            out.found.append((rank, doc, makers[own.key].make(rank, host, own)))
    return out


def _digests(doc: HostDocument) -> list[tuple[int, Digest]]:
    """Each rank a head names with its digest (checked; a rank without one is left out)."""
    rows = digest_rows(doc)
    found = ((rank, checked(rows.get(str(rank)))) for rank in doc.ranks)
    return [(rank, own) for rank, own in found if own is not None]


def _groups(
    heads: Mapping[str, HostDocument],
    digests: Mapping[str, list[tuple[int, Digest]]],
    need: set[str],
) -> dict[str, list[str]]:
    """Each key's hosts, in order; a host with a rank that has no digest goes to ``need``."""
    groups: dict[str, list[str]] = {}
    for host, doc in heads.items():
        rows = digests[host]
        if len(rows) < len(doc.ranks):
            need.add(host)
        for _, own in rows:
            hosts = groups.setdefault(own.key, [])
            if not hosts or hosts[-1] != host:
                hosts.append(host)
    return groups


def _model_hosts(
    groups: Mapping[str, list[str]],
    makers: Mapping[str, Alike],
    read_whole: Mapping[str, HostDocument],
    bad: Mapping[str, str],
) -> set[str]:
    """A host to read whole for each key without a model: its first not yet read."""
    out = set()
    for key, hosts in groups.items():
        if key not in makers:
            host = next((h for h in hosts if h not in read_whole and h not in bad), None)
            if host is not None:
                out.add(host)
    return out


def _whole(store: HeadStore, prefix: str, host: str, out: HeadsRead) -> HostDocument | None:
    """Host ``host``'s document, read whole (kept in ``out``), or None where it cannot be."""
    value = store.try_get(prefix + host_status.KEY + host)
    if value is None:
        out.bad_hosts[host] = "its head is listed, its document is gone"
        return None
    out.whole += 1
    out.whole_bytes += len(value)
    try:
        doc = host_status.parse(value, host_status.document_name(host))
    except BadInput as exc:
        out.bad_hosts[host] = exc.message
        return None
    out.hosts[host] = doc
    return doc
