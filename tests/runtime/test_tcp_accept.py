"""The accept thread's start against a close: links closed before the thread first runs
leave it nothing to do, and it ends quietly (no exception on a thread of the job)."""

from __future__ import annotations

import socket
import threading

from cclctl.runtime.transport.tcp.accept import Acceptor
from cclctl.runtime.transport.tcp.refusals import RefusalLog


def _acceptor(listener: socket.socket, closed: threading.Event) -> Acceptor:
    def admit(sock: socket.socket, ctx: object) -> None:
        raise AssertionError("nothing connects in this test")

    return Acceptor(
        listener,
        rank=0,
        link=("token", "job", 0, 2, 0),
        deadline_s=1.0,
        slots=4,
        admit=admit,
        refusals=RefusalLog(0),
        closed=closed,
    )


def test_links_closed_before_the_accept_thread_runs_end_it_quietly() -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    closed = threading.Event()
    acceptor = _acceptor(listener, closed)
    closed.set()
    listener.close()
    acceptor.run()  # raised OSError (EBADF) from setblocking before the fix


def test_a_listener_closed_while_accepting_ends_the_thread() -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    closed = threading.Event()
    acceptor = _acceptor(listener, closed)
    errors: list[BaseException] = []

    def body() -> None:
        try:
            acceptor.run()
        except BaseException as exc:  # what the thread would have raised
            errors.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    closed.set()
    listener.close()
    thread.join(30)
    assert not thread.is_alive()
    assert errors == []
