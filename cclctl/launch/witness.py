"""The launcher as the first witness of a rank's death, through the job's store (the one it
hosts, or the etcd cluster the job runs on).

The launcher is the ranks' parent: it learns of a death from ``waitpid`` with the signal or
exit code, which no peer can know. It writes the job's revoke record (first writer wins)
so the ranks adopt a failure named with its signal, and it reads back what the store holds
(the record, the ranks' acknowledgements, their statuses) for the verdict. A store that
does not answer never stops the launcher: the witness then reports nothing.
"""

from __future__ import annotations

import dataclasses
import socket

from cclctl import revocation
from cclctl.errors import BadInput, CclError
from cclctl.revocation import OPERATOR, Revocation
from cclctl.store.backends import open_store
from cclctl.store.kv import KeyValueStore
from cclctl.store.scope import job_prefix

REQUEST_TIMEOUT_S = 5.0


@dataclasses.dataclass(frozen=True)
class StoreSeen:
    """What the job's store held at one moment: its revoke record (None: none, or not
    readable), the ranks that acknowledged it, and every key of the job (full keys, as
    ``cclctl.live.snapshot.parse`` reads them)."""

    revoke: Revocation | None
    acks: frozenset[int]
    listing: dict[str, bytes]


def death_record(rank: int, pid: int, returncode: int, signal_name: str | None) -> Revocation:
    """The launcher's record of ``rank``'s death: ``died``, its signal or exit code."""
    reason = signal_name if signal_name is not None else f"exit code {returncode}"
    return Revocation(
        kind="died",
        origin=rank,
        reason=reason,
        host=socket.gethostname(),
        pid=pid,
        seen_by=OPERATOR,
        via="launcher",
    )


class Witness:
    """The launcher's client of the job's store, for one job."""

    def __init__(self, address: str, token: str, job: str) -> None:
        self.address = address
        self.token = token
        self.job = job
        self.prefix = job_prefix(job)
        self._client: KeyValueStore | None = None

    def record(self, record: Revocation) -> bool:
        """Write ``record`` as the job's revoke record unless one is there; True if it won."""
        client = self._connect()
        if client is None:
            return False
        key = self.prefix + revocation.KEY
        try:
            return client.compare_set(key, None, record.encode()) == record.encode()
        except CclError:
            return False

    def look(self) -> StoreSeen | None:
        """Everything the store holds of the job now (None: it does not answer)."""
        client = self._connect()
        if client is None:
            return None
        try:
            listing = client.list(self.prefix)
        except CclError:
            return None
        return StoreSeen(self._revoke(listing), self._acks(listing), listing)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _connect(self) -> KeyValueStore | None:
        if self._client is None:
            try:
                self._client = open_store(
                    self.address,
                    timeout_s=REQUEST_TIMEOUT_S,
                    connect_timeout_s=REQUEST_TIMEOUT_S,
                    token=self.token,
                )
            except (CclError, OSError):
                return None
        return self._client

    def _revoke(self, listing: dict[str, bytes]) -> Revocation | None:
        raw = listing.get(self.prefix + revocation.KEY)
        if raw is None:
            return None
        try:
            return revocation.decode(raw, f"the job's revoke record in {self.address}")
        except BadInput:
            return None

    def _acks(self, listing: dict[str, bytes]) -> frozenset[int]:
        head = self.prefix + revocation.ack_key(0)[:-1]  # "revoke_ack/"
        ranks = (key[len(head) :] for key in listing if key.startswith(head))
        return frozenset(int(text) for text in ranks if text.isdigit() and len(text) <= 9)
