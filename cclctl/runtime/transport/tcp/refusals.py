"""The log of refused link handshakes: every refusal counted, a bounded number of lines.

A stranger can open thousands of connections a second; one line each would flood the
rank's log (and its disk). So the first refusal of each kind (:data:`~.link_auth.KINDS`, a
fixed set, whatever the stranger sent) is logged in full, with its address, claimed rank
and words; the rest of that kind within ``every_s`` are counted and told in one line when
the window ends (``refused 1,234 more link handshakes in the last 60 s: bad proof ...``),
or when the links close. At most two lines per kind per window, as the store's own
notices (``store/limits.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

from cclctl.runtime.transport.tcp.link_auth import KINDS, HandshakeRefused

log = logging.getLogger("cclctl.links")

NOTICE_EVERY_S = 60.0


@dataclasses.dataclass
class _Window:
    opened: float
    count: int = 0  # refusals since ``opened`` not yet told
    latest: str = ""  # who the latest of them was


class RefusalLog:
    """Counts refused handshakes (``total``, ``by_kind``) and logs them at a bounded rate."""

    def __init__(
        self,
        rank: int,
        every_s: float = NOTICE_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rank = rank
        self.every_s = every_s
        self._clock = clock
        self.total = 0
        self.by_kind: Counter[str] = Counter()
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()

    def refused(self, addr: tuple[str, int], exc: HandshakeRefused) -> None:
        """Count one refusal; log it in full when it is the first of its kind in a window."""
        who = f"{addr[0]}:{addr[1]} claiming rank {'?' if exc.claimed is None else exc.claimed}"
        with self._lock:
            now = self._clock()
            self._tell_due(now)
            window = self._windows.get(exc.kind)
            if window is None:
                self._windows[exc.kind] = _Window(now)
                log.warning("rank %d: refused a link from %s: %s", self.rank, who, exc.why)
            else:
                window.count += 1
                window.latest = who
            self.by_kind[exc.kind] += 1
            self.total += 1  # after the log: whoever sees the count can read why

    def tell_due(self) -> None:
        """Log the count of every window that has ended (the accept loop calls this)."""
        with self._lock:
            self._tell_due(self._clock())

    def close(self) -> None:
        """Log what no line told yet: the links are closing."""
        with self._lock:
            now = self._clock()
            for kind, window in sorted(self._windows.items()):
                self._tell(kind, window, now)
            self._windows.clear()

    def _tell_due(self, now: float) -> None:
        for kind, window in list(self._windows.items()):
            if now - window.opened < self.every_s:
                continue
            if window.count:  # a new window: the flood goes on, one count a window
                self._tell(kind, window, now)
                self._windows[kind] = _Window(now)
            else:  # the kind went quiet: its next refusal is told in full again
                del self._windows[kind]

    def _tell(self, kind: str, window: _Window, now: float) -> None:
        if not window.count:
            return
        log.warning(
            "rank %d: refused %s more link handshakes in the last %.0f s: %s; the latest from %s",
            self.rank, f"{window.count:,}", now - window.opened, KINDS[kind], window.latest,
        )  # fmt: skip
