"""Decode many status documents that repeat the same member lists, decoding each list once.

Every rank's status lists each communicator's member ranks, so a 1,000-rank job's statuses
hold 1,000 copies of the same 1,000 integers: most of the bytes of a refresh, and most of
``json.loads``' time. Each ``"ranks":[...]`` list is swapped for a short placeholder before
decoding and the one decoded list is put back, which makes a refresh several times cheaper.
The result is exactly what ``json.loads`` returns; anything unusual takes the plain path.
"""

from __future__ import annotations

import json
import re
from typing import Any

_RANKS = re.compile(rb'"ranks":\[([0-9,]*)\]')
_MARK = "\x00ranks:"  # no document of ours has a NUL in a string


class SharedListDecoder:
    """``loads`` for a batch of documents; remembers the member lists it has seen."""

    def __init__(self) -> None:
        self._index: dict[bytes, int] = {}
        self._lists: list[list[int]] = []

    def loads(self, raw: bytes) -> Any:
        """Like ``json.loads(raw)`` (and raising the same errors)."""
        return json.loads(_RANKS.sub(self._swap, raw), object_hook=self._restore)

    def _swap(self, match: re.Match[bytes]) -> bytes:
        body = match.group(1)
        index = self._index.get(body)
        if index is None:
            try:
                members = json.loads(b"[" + body + b"]")
            except ValueError:
                return match.group(0)  # not a plain list ("1,,2"): let json.loads judge it
            index = self._index[body] = len(self._lists)
            self._lists.append(members)
        return b'"ranks":"\\u0000ranks:%d"' % index

    def _restore(self, obj: dict[str, Any]) -> dict[str, Any]:
        value = obj.get("ranks")
        if isinstance(value, str) and value.startswith(_MARK):
            obj["ranks"] = self._lists[int(value[len(_MARK) :])]  # readers copy what they keep
        return obj
