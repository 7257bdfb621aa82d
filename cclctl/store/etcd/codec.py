"""etcd's JSON gateway encodes keys and values in base64 and 64-bit integers as strings."""

from __future__ import annotations

import base64
from typing import Any


def b64(data: bytes | str) -> str:
    """Bytes (or text, as UTF-8) as the gateway takes them."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    return base64.b64encode(raw).decode("ascii")


def unb64(text: str | None) -> bytes:
    """A gateway field back to bytes (an absent field is empty: the gateway omits zeros)."""
    return base64.b64decode(text) if text else b""


def number(obj: dict[str, Any], name: str) -> int:
    """An int64 field of a gateway reply (a string, or absent when zero)."""
    return int(obj.get(name) or 0)


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes a range cover every key starting with ``prefix``."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\x00"  # every key
