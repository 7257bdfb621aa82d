"""Reading request frames as their bytes arrive: each header parsed once, sizes checked early.

A frame's size is known from its header and field-length table, so a frame that would
exceed the connection's cap is refused there, before its payload is buffered; while it
arrives, a frame costs what has arrived, and each chunk costs a length check, never a
re-parse of a field table that may hold a million entries.
"""

from __future__ import annotations

import dataclasses

from cclctl.store.protocol import REQUEST_HEADER, lengths_struct, split_fields


class FrameRefused(ValueError):
    """A frame no client of ours would send; ``reason`` names the limit, for the counters."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclasses.dataclass
class Request:
    op: int
    timeout: float
    fields: list[bytes]


class FrameReader:
    """Buffers one connection's bytes and cuts them into requests no larger than a cap."""

    def __init__(self, max_frame: int, max_fields: int) -> None:
        self.max_frame = max_frame
        self.max_fields = max_fields
        self._buffer = bytearray()
        self._header: tuple[int, float, int] | None = None
        self._lengths: tuple[int, ...] | None = None
        self._need = REQUEST_HEADER.size  # bytes of the current frame needed to go on

    @property
    def buffered(self) -> int:
        """Bytes held for the frame (or frames) not yet taken."""
        return len(self._buffer)

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def take(self) -> Request | None:
        """The next whole request, or None until it has arrived. Raises FrameRefused."""
        buffer = self._buffer
        if len(buffer) < self._need:
            return None
        if self._header is None:
            self._read_header()
            if len(buffer) < self._need:
                return None
        if self._lengths is None:
            self._read_lengths()
            if len(buffer) < self._need:
                return None
        assert self._header is not None and self._lengths is not None
        op, timeout, count = self._header
        start = REQUEST_HEADER.size + 4 * count
        payload = bytes(buffer[start : self._need])
        del buffer[: self._need]
        fields = split_fields(payload, self._lengths)
        self._header, self._lengths, self._need = None, None, REQUEST_HEADER.size
        return Request(op, timeout, fields)

    def _read_header(self) -> None:
        op, timeout, count = REQUEST_HEADER.unpack_from(self._buffer)
        table = REQUEST_HEADER.size + 4 * count
        if count > self.max_fields or table > self.max_frame:
            raise FrameRefused(f"a request with {count} fields is not a store request", "fields")
        self._header = (op, timeout, count)
        self._need = table

    def _read_lengths(self) -> None:
        assert self._header is not None
        count = self._header[2]
        lengths: tuple[int, ...] = lengths_struct(count).unpack_from(
            self._buffer, REQUEST_HEADER.size
        )
        total = self._need + sum(lengths)
        if total > self.max_frame:
            raise FrameRefused(
                f"a frame of {total} bytes is larger than this connection accepts "
                f"({self.max_frame} bytes)",
                "frame_too_large",
            )
        self._lengths = lengths
        self._need = total
