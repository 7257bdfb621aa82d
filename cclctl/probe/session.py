"""One pair's meeting in a round: latency by ping-pong, then bandwidth each way (or both
ways at once), each figure the median of the repeats its sender timed.

Both ranks run the same sequence of messages, so each message's step number (a count) is
the same on both sides. The sender of a bandwidth direction times a warm-up transfer and
picks how many timed repeats fit ``budget_s`` (at least 1, at most :data:`MAX_REPEATS`), and
tells the receiver in an 8-byte message: a slow link costs one budget, not many slow
transfers, and a fast one is timed over the whole budget, so a rank descheduled for a few
milliseconds on a loaded machine spoils a few repeats, not the median.
The first message gets twice the timeout, for a partner still finishing its round.
"""

from __future__ import annotations

import dataclasses
import statistics
import struct
import time

from cclctl.probe.channel import FAILURES, Channel
from cclctl.probe.model import OK, UNREACHABLE
from cclctl.probe.options import ProbeOptions

#: The most timed bandwidth repeats one direction gets, however fast the link.
MAX_REPEATS = 64


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What this rank measured of its link to the partner (this rank sends)."""

    status: str = OK
    bandwidth: float | None = None
    latency: float | None = None
    repeats: int = 0
    why: str = ""


class Buffers:
    """The messages' memory, allocated once per rank."""

    def __init__(self, opts: ProbeOptions) -> None:
        self.small_out = memoryview(bytearray(opts.small))
        self.small_in = memoryview(bytearray(opts.small))
        self.large_out = memoryview(bytearray(b"\x5a" * opts.large))
        self.large_in = memoryview(bytearray(opts.large))
        self.word = memoryview(bytearray(8))


class Meeting:
    """Rank ``me`` meets ``peer`` in round ``seq`` over ``channel``."""

    def __init__(
        self, channel: Channel, me: int, peer: int, seq: int, opts: ProbeOptions, bufs: Buffers
    ) -> None:
        self.ch, self.me, self.peer, self.seq, self.opts, self.bufs = (
            channel, me, peer, seq, opts, bufs,
        )  # fmt: skip
        self._step = 0

    def run(self) -> Outcome:
        """Measure; a failure ends the meeting as ``unreachable`` (both sides fail)."""
        try:
            latency = self._latency()
            bandwidth, repeats = self._bandwidth()
        except FAILURES as exc:
            return Outcome(UNREACHABLE, why=_short(exc))
        return Outcome(OK, bandwidth, latency, repeats)

    def _move(self, send: memoryview | None = None, recv: memoryview | None = None) -> None:
        timeout = self.opts.timeout_s * (2 if self._step == 0 else 1)
        self.ch.move(self.peer, self.seq, self._step, timeout, send, recv)
        self._step += 1

    def _latency(self) -> float:
        """Half the median round trip of ``small`` messages this rank started."""
        b, n = self.bufs, self.opts.warmup + self.opts.iters
        mine: list[float] = []
        for pinger in sorted((self.me, self.peer)):
            for i in range(n):
                if pinger == self.me:
                    t0 = time.perf_counter()
                    self._move(send=b.small_out)
                    self._move(recv=b.small_in)
                    if i >= self.opts.warmup:
                        mine.append(time.perf_counter() - t0)
                else:
                    self._move(recv=b.small_in)
                    self._move(send=b.small_out)
        return statistics.median(mine) / 2

    def _bandwidth(self) -> tuple[float, int]:
        if self.opts.direction == "both":
            return self._both()
        mine = (0.0, 0)
        for sender in sorted((self.me, self.peer)):
            if sender == self.me:
                mine = self._send_timed()
            else:
                self._receive_timed()
        return mine

    def _send_timed(self) -> tuple[float, int]:
        b = self.bufs
        times = []
        for _ in range(max(1, self.opts.warmup)):
            times.append(self._one_way(b))
        repeats = self._repeats(times[-1])
        struct.pack_into("<q", b.word, 0, repeats)
        self._move(send=b.word)
        timed = [self._one_way(b) for _ in range(repeats)]
        return self.opts.large / statistics.median(timed), repeats

    def _one_way(self, b: Buffers) -> float:
        t0 = time.perf_counter()
        self._move(send=b.large_out)
        self._move(recv=b.word)  # the receiver's word: the message arrived whole
        return time.perf_counter() - t0

    def _receive_timed(self) -> None:
        b = self.bufs
        for _ in range(max(1, self.opts.warmup)):
            self._move(recv=b.large_in)
            self._move(send=b.word)
        self._move(recv=b.word)
        (repeats,) = struct.unpack_from("<q", b.word, 0)
        for _ in range(max(1, min(int(repeats), MAX_REPEATS))):
            self._move(recv=b.large_in)
            self._move(send=b.word)

    def _both(self) -> tuple[float, int]:
        """Both directions at once: each side times the exchange it took part in."""
        b = self.bufs

        def exchange() -> float:
            t0 = time.perf_counter()
            self._move(send=b.large_out, recv=b.large_in)
            return time.perf_counter() - t0

        warm = [exchange() for _ in range(max(1, self.opts.warmup))]
        if self.me < self.peer:
            repeats = self._repeats(warm[-1])
            struct.pack_into("<q", b.word, 0, repeats)
            self._move(send=b.word)
        else:
            self._move(recv=b.word)
            repeats = max(1, min(int(struct.unpack_from("<q", b.word, 0)[0]), MAX_REPEATS))
        timed = [exchange() for _ in range(repeats)]
        return self.opts.large / statistics.median(timed), repeats

    def _repeats(self, seconds: float) -> int:
        return max(1, min(MAX_REPEATS, int(self.opts.budget_s / max(seconds, 1e-9))))


def _short(exc: BaseException, limit: int = 240) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
