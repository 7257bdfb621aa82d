"""The accept side of a rank's links: one thread runs every newcomer's handshake, fairly.

Anyone who can reach the port can connect, so connections that prove nothing must never
starve the rank's real peers. The thread holds at most ``slots`` handshakes; every socket
is non-blocking and read as its bytes arrive (a HELLO, then a PROOF: no newcomer can hold
up another). When the slots are full, a newcomer still gets one: the oldest connection that
has not sent a whole HELLO is dropped for it, else the oldest waiting with its PROOF. A
peer that proves the token leaves the slots at once (its link is filed by ``admit``), so a
flood of silent connections costs a real peer nothing; one dropped mid-handshake is told so
(REFUSE "evicted") and connects again. Each handshake also has ``deadline_s`` in all. What
is refused is counted and logged at a bounded rate (:mod:`~.refusals`).
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import threading
import time
from collections.abc import Callable

from cclctl.runtime.transport.tcp import link_auth
from cclctl.runtime.transport.tcp.link_auth import Challenged, HandshakeRefused, LinkContext
from cclctl.runtime.transport.tcp.refusals import RefusalLog

POLL_S = 0.2  # how often the thread looks whether the links were closed, at the longest
_ACCEPTS_PER_WAKE = 32  # newcomers accepted before the thread reads those it holds again
_DRAIN_BYTES = 1 << 16  # read from a refused connection before it is closed, at most


class _Newcomer:
    """One connection's handshake so far."""

    __slots__ = ("addr", "buf", "challenged", "need", "sock", "started")

    def __init__(self, sock: socket.socket, addr: tuple[str, int], started: float) -> None:
        self.sock = sock
        self.addr = addr
        self.started = started
        self.buf = b""
        self.need = 4  # a HELLO's magic first: a stranger is turned away at once
        self.challenged: Challenged | None = None

    @property
    def claimed(self) -> int | None:
        return None if self.challenged is None else self.challenged.context.connector


class Acceptor:
    """Accepts on ``listener`` until ``closed`` is set; ``admit(sock, ctx)`` files a proven
    link (raising :class:`HandshakeRefused` to turn it away), ``refusals`` counts the rest."""

    def __init__(
        self,
        listener: socket.socket,
        *,
        rank: int,
        link: tuple[str, str, int, int, int],  # token, job, epoch, world size, flags
        deadline_s: float,
        slots: int,
        admit: Callable[[socket.socket, LinkContext], None],
        refusals: RefusalLog,
        closed: threading.Event,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._listener = listener
        self._rank = rank
        self._token, self._job, self._epoch, self._world, self._flags = link
        self._deadline_s = deadline_s
        self._slots = slots
        self._admit = admit
        self._refusals = refusals
        self._closed = closed
        self._clock = clock
        self._held: dict[socket.socket, _Newcomer] = {}  # oldest first
        self._sel = selectors.DefaultSelector()

    def run(self) -> None:
        """The accept thread's body."""
        try:
            self._listener.setblocking(False)
            self._sel.register(self._listener, selectors.EVENT_READ, None)
        except (OSError, ValueError):  # the links closed before this thread ran: nothing to do
            self._sel.close()
            return
        try:
            while not self._closed.is_set():
                for key, _ in self._sel.select(self._wait_s()):
                    if key.data is None:
                        if not self._accept():
                            return  # the listener was closed
                    elif key.fileobj in self._held:
                        self._read(key.data)
                self._expire()
                self._refusals.tell_due()
        finally:
            for one in list(self._held.values()):
                self._forget(one)
            self._sel.close()

    def _wait_s(self) -> float:
        if not self._held:
            return POLL_S
        oldest = next(iter(self._held.values()))
        return max(0.0, min(POLL_S, oldest.started + self._deadline_s - self._clock()))

    def _accept(self) -> bool:
        for _ in range(_ACCEPTS_PER_WAKE):
            try:
                sock, addr = self._listener.accept()
            except BlockingIOError:
                return True
            except OSError as exc:
                if self._closed.is_set() or exc.errno in (errno.EBADF, errno.EINVAL):
                    return False
                self._accept_failed(exc)
                return True
            if len(self._held) >= self._slots:
                self._evict()
            sock.setblocking(False)
            one = _Newcomer(sock, addr, self._clock())
            self._held[sock] = one
            self._sel.register(sock, selectors.EVENT_READ, one)
        return True

    def _accept_failed(self, exc: OSError) -> None:
        """The kernel refused an accept (out of descriptors, ...): free one, or wait."""
        why = HandshakeRefused(f"accept failed: {exc.strerror or exc}", None, "socket")
        self._refusals.refused(("?", 0), why)
        if self._held:
            self._evict()
        else:
            self._closed.wait(0.05)

    def _evict(self) -> None:
        """Drop the oldest connection that sent no whole HELLO, else the oldest of all."""
        held = self._held.values()
        victim = next((one for one in held if one.challenged is None), next(iter(held)))
        why = f"{link_auth.KINDS['evicted']} ({self._slots} slots)"
        self._refuse(victim, HandshakeRefused(why, victim.claimed, "evicted"))

    def _expire(self) -> None:
        now = self._clock()
        for one in list(self._held.values()):  # oldest first
            if now - one.started < self._deadline_s:
                break
            why = link_auth.KINDS["timeout"]
            self._refuse(one, HandshakeRefused(why, one.claimed, "timeout"))

    def _read(self, one: _Newcomer) -> None:
        try:
            while True:
                chunk = one.sock.recv(one.need - len(one.buf))
                if not chunk:
                    raise HandshakeRefused(link_auth.KINDS["closed"], one.claimed, "closed")
                one.buf += chunk
                if len(one.buf) == one.need and self._step(one):
                    return
        except BlockingIOError:
            return
        except HandshakeRefused as exc:
            self._refuse(one, exc)
        except OSError as exc:
            why = f"socket error: {exc.strerror or exc}"
            self._refuse(one, HandshakeRefused(why, one.claimed, "socket"))

    def _step(self, one: _Newcomer) -> bool:
        """Act on a whole message; True when the handshake is over (proven)."""
        raw, one.buf = one.buf, b""
        if one.challenged is None and one.need == 4:
            one.buf, one.need = raw, link_auth.hello_size(raw)
            return False
        if one.challenged is None:
            one.challenged = link_auth.answer_hello(
                raw, self._job, self._epoch, self._rank, self._world, self._flags
            )
            one.need = link_auth.PROOF_SIZE
            one.sock.send(one.challenged.challenge)  # 20 bytes into an empty buffer
            return False
        link_auth.check_proof(raw, self._token, one.challenged.context)
        self._release(one)  # proven: it needs no slot, whatever ``admit`` says
        self._admit(one.sock, one.challenged.context)
        return True

    def _refuse(self, one: _Newcomer, exc: HandshakeRefused) -> None:
        self._forget(one, exc)
        self._refusals.refused(one.addr, exc)

    def _release(self, one: _Newcomer) -> None:
        """Take ``one`` out of the slots (its socket stays open)."""
        del self._held[one.sock]
        self._sel.unregister(one.sock)

    def _forget(self, one: _Newcomer, exc: BaseException | None = None) -> None:
        if one.sock in self._held:
            self._release(one)
        self._tell_and_close(one.sock, exc)

    @staticmethod
    def _tell_and_close(sock: socket.socket, exc: BaseException | None) -> None:
        """Close ``sock``, first telling a connector why where it may be a rank: what it sent
        is read first, so that the close is a FIN after the reason rather than a reset."""
        told = link_auth.refusal(exc.kind) if isinstance(exc, HandshakeRefused) else b""
        if told and sock.fileno() >= 0:
            with contextlib.suppress(OSError):
                sock.setblocking(False)
                left = _DRAIN_BYTES
                while left > 0 and (chunk := sock.recv(min(left, 4096))):
                    left -= len(chunk)
            with contextlib.suppress(OSError):
                sock.send(told)
        sock.close()
