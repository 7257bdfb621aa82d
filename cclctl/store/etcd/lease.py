"""The lease a client's keys live under, so they linger after it, then go.

The embedded store outlives a job's last rank by its linger (``CCLCTL_STORE_LINGER``) and
takes every key with it. On etcd, which outlives every job, each client puts its keys under
one lease of its own, granted at its first write and kept alive by a daemon thread while the
client is open: a key outlives its last writer by the lease's time to live, so ``top`` and
``diagnose`` read a finished or crashed job for that long, and nothing of a job stays for
good. A lease the cluster lost (a client stalled past its TTL) is granted again.
"""

from __future__ import annotations

import threading

from cclctl.errors import StoreError
from cclctl.store.etcd.codec import number
from cclctl.store.etcd.gateway import Gateway

#: A key's life after its writer's last keep-alive: the embedded store's default linger.
DEFAULT_LEASE_TTL_S = 120.0
#: The longest one grant or keep-alive request may take.
LEASE_REQUEST_S = 5.0


class Lease:
    """One client's lease: granted on first use, kept alive until :meth:`close`."""

    def __init__(self, gateway: Gateway, ttl_s: float | None) -> None:
        """``ttl_s`` None: keys are put with no lease and stay until deleted."""
        self.gateway = gateway
        self.ttl_s = None if ttl_s is None else max(round(ttl_s), 2)
        self._id = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def current(self) -> int:
        """The lease to put keys under (0: none), granted now if there is none yet."""
        if self.ttl_s is None:
            return 0
        with self._lock:
            if not self._id:
                reply = self.gateway.call(
                    "/v3/lease/grant",
                    {"TTL": self.ttl_s},
                    idempotent=True,  # a lost grant leaves an unused lease, which expires
                    within_s=LEASE_REQUEST_S,
                )
                self._id = number(reply, "ID")
                self._start()
            return self._id

    def lost(self, lease_id: int) -> None:
        """The cluster no longer knows ``lease_id``: the next write grants another."""
        with self._lock:
            if self._id == lease_id:
                self._id = 0

    def _start(self) -> None:
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(
                target=self._keep_alive, name="cclctl-etcd-lease", daemon=True
            )
            self._thread.start()

    def _keep_alive(self) -> None:
        assert self.ttl_s is not None
        while not self._stop.wait(self.ttl_s / 3):
            lease_id = self._id
            if not lease_id:
                continue
            try:
                reply = self.gateway.call(
                    "/v3/lease/keepalive",
                    {"ID": str(lease_id)},
                    idempotent=True,
                    within_s=LEASE_REQUEST_S,
                )
            except StoreError:
                continue  # the cluster may be electing a leader: try at the next beat
            if not number(reply.get("result", {}), "TTL"):
                self.lost(lease_id)

    def close(self) -> None:
        """Stop keeping the lease alive; its keys go once its TTL passes."""
        self._stop.set()
