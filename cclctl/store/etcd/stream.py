"""One streaming reply of etcd's gateway (a watch): newline-delimited JSON messages."""

from __future__ import annotations

import contextlib
import http.client
import json
import time
from typing import Any


class Stream:
    """One streaming reply: newline-delimited JSON messages, read until a deadline."""

    def __init__(
        self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse, member: str
    ) -> None:
        self.conn = conn
        self.response = response
        self.member = member

    def next(self, deadline: float) -> dict[str, Any]:
        """The next message's ``result``; TimeoutError at ``deadline``, OSError (or
        ValueError on a garbled line) when the member is gone."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the watch's deadline passed")
        if self.conn.sock is not None:
            self.conn.sock.settimeout(left)
        try:
            line = self.response.readline()
        except http.client.HTTPException as exc:
            raise ConnectionError(reason(exc)) from None
        if not line:
            raise ConnectionError(f"etcd at {self.member} ended the stream")
        message = json.loads(line)
        if not isinstance(message, dict) or "error" in message:
            raise ConnectionError(f"etcd at {self.member} ended the stream: {message}")
        result = message.get("result")
        return result if isinstance(result, dict) else {}

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()


def reason(exc: BaseException) -> str:
    """A lost connection's cause, in words."""
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
