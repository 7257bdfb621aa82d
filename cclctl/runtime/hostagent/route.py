"""A rank's way to the store for its status: through its host's agent while there is one.

:class:`AgentRoute` is the store the rank's status publisher writes to
(:class:`~cclctl.telemetry.status.StatusPublisher` needs only ``set``). The rank's own
status key goes to the agent over its socket; any other key (a probe's document), and the
status itself while no agent answers, go to the store as before. So a rank never waits on
its agent and never fails for it: an agent that is not there yet, or has died, costs one
refused connect per interval, and its statuses reach the store directly, under the rank's
own key, from the next interval on. Readers take, per rank, the newer of the two
(:mod:`cclctl.live.snapshot`), so a lost agent is seen as its ranks publishing directly.

Once the agent's answer says its written document holds the rank's status, the rank deletes
the status it had written directly (one request), so a job's listing holds one document per
host and a reader always finds one of the two. When the rank closes, its
last status (the final one, with ``finished``) is also written directly: it is in the store
before the rank exits, whatever its agent does next.

The agent answers each status with its news: the job's dump requests, which it reads from
the store once per interval for all its ranks. :class:`AgentSignals` serves the rank's
dump-request poller from that answer, so a job's store is polled once per host, not once
per rank; without an agent's answer the poller reads the store, as before.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from typing import Any, Protocol

from cclctl.runtime.agent.dump_requests import DUMP_KEY, SignalStore
from cclctl.runtime.hostagent.wire import MAX_NEWS, NEWS, read_object, status_frame
from cclctl.runtime.socket_io import connect_unix

log = logging.getLogger("cclctl.hostagent")

#: a send to the agent that takes longer than this counts as the agent lost
SEND_TIMEOUT_S = 2.0


class RankStore(Protocol):
    """The job's store, scoped to the job (a :class:`~cclctl.store.scope.ScopedStore`)."""

    def set(self, key: str, value: bytes) -> None: ...
    def delete(self, key: str) -> bool: ...


class AgentRoute:
    """``set`` for a rank's status publisher: ``status_key`` via the agent at ``name``."""

    def __init__(self, store: RankStore, name: str, rank: int, status_key: str) -> None:
        self.store = store
        self.name = name
        self.rank = rank
        self.status_key = status_key
        self.via_agent = 0  # statuses the agent took
        self.direct = 0  # statuses written to the store directly
        self.agent_lost = False  # an agent took statuses, then stopped answering
        self._sock: socket.socket | None = None
        self.news: dict[str, Any] | None = None  # the agent's last answer (None: none now)
        self._last: bytes | None = None
        self._direct_key_written = False
        self._lock = threading.Lock()

    @property
    def reconnects(self) -> int:
        """The store client's reopened connections (the publisher reports them)."""
        count = getattr(self.store, "reconnects", 0)
        return count if isinstance(count, int) else 0

    def set(self, key: str, value: bytes) -> None:
        if key != self.status_key:
            self.store.set(key, value)
            return
        with self._lock:
            self._last = value
            if self._send(value):
                self.via_agent += 1
                # once the agent's written document holds it (not before: readers would see
                # neither), the status the rank wrote to its own key goes
                held = self.news is not None and self.news.get("written") is True
                if self._direct_key_written and held:
                    with contextlib.suppress(Exception):
                        self.store.delete(key)
                    self._direct_key_written = False
                return
        self.store.set(key, value)
        self.direct += 1
        self._direct_key_written = True

    def _send(self, value: bytes) -> bool:
        """Send the status to the agent (connecting first); False if no agent took it."""
        if self._sock is None:
            self._sock = self._connect()
            if self._sock is None:
                return False
        try:
            self._sock.sendall(status_frame(self.rank, value))
            self.news = self._answer(self._sock)
            return True
        except (OSError, ValueError) as exc:
            self._drop()
            if not self.agent_lost:
                self.agent_lost = True
                log.warning("cclctl: rank %d lost its host agent (%s); it publishes its own "
                            "status", self.rank, getattr(exc, "strerror", None) or exc)  # fmt: skip
            return False

    @staticmethod
    def _answer(sock: socket.socket) -> dict[str, Any]:
        """The agent's news after a status (a ValueError if it is not a JSON object)."""
        return read_object(sock, NEWS, MAX_NEWS)

    def _connect(self) -> socket.socket | None:
        return connect_unix(self.name, SEND_TIMEOUT_S)

    def _drop(self) -> None:
        self.news = None
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    def close(self) -> None:
        """Write the last status directly (it is in the store before the rank exits), then
        close the agent's connection."""
        with self._lock:
            last, sent = self._last, self._sock is not None
            self._drop()
        if last is not None and sent:
            with contextlib.suppress(Exception):
                self.store.set(self.status_key, last)


#: the keys the agent's answer holds, by the field that holds them
_FROM_NEWS = {f"{DUMP_KEY}/count": "dump_count", f"{DUMP_KEY}/why": "dump_why"}


class AgentSignals:
    """The dump-request poller's store: the dump keys from the agent's last answer while
    there is one, else (and for every write) the job's store."""

    def __init__(self, route: AgentRoute, store: SignalStore) -> None:
        self.route = route
        self.store = store

    def try_get(self, key: str) -> bytes | None:
        news, field = self.route.news, _FROM_NEWS.get(key)
        if news is None or field is None or field not in news:
            return self.store.try_get(key)
        value = news[field]
        return value.encode() if isinstance(value, str) else None

    def add(self, key: str, delta: int) -> int:
        return self.store.add(key, delta)

    def set(self, key: str, value: bytes) -> None:
        self.store.set(key, value)
