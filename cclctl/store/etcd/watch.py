"""Blocking reads on etcd: a key's value once some client puts it, or a set of keys.

One range says what is there and at which revision; a watch from the revision after it
then sees every later put, so a key set between the two is never missed. A watch whose
member goes away is opened again after a new range, on another member when that one is
gone. A member that stops answering without closing (stopped, cut off) sends nothing, as a
quiet key does: a watch lasts at most :data:`WATCH_SLICE_S`, then the range asks again,
through a member that answers.
"""

from __future__ import annotations

import time
from typing import Any

from cclctl.errors import StoreError
from cclctl.store.etcd.codec import b64, number, unb64
from cclctl.store.etcd.gateway import Gateway
from cclctl.store.etcd.stream import Stream

#: The longest one range request of a blocking read may take.
RANGE_S = 5.0
#: The longest one watch waits before a range checks again (a silent member is found out).
WATCH_SLICE_S = 5.0
#: The pause before a watch that ended early starts over.
RESTART_PAUSE_S = 0.05


def await_keys(
    gateway: Gateway, keys: list[bytes], deadline: float, *, values: bool
) -> tuple[dict[bytes, bytes], list[bytes]]:
    """Every key's value (empty unless ``values``) once all exist, and ``[]``; or what was
    found and the keys still missing when ``deadline`` (monotonic) passes."""
    wanted = sorted(set(keys))
    while True:
        found, revision = _present(gateway, wanted, values)
        missing = [key for key in wanted if key not in found]
        if not missing or time.monotonic() >= deadline:
            return found, missing
        slice_end = min(deadline, time.monotonic() + WATCH_SLICE_S)
        if _watch(gateway, missing, revision + 1, slice_end, found):
            return found, []
        if time.monotonic() < slice_end:  # a watch that ended early: never spin on a member
            time.sleep(RESTART_PAUSE_S)


def _present(gateway: Gateway, keys: list[bytes], values: bool) -> tuple[dict[bytes, bytes], int]:
    """The keys of ``keys`` that exist (with their values when asked) and the revision."""
    body: dict[str, Any] = {"key": b64(keys[0])}
    if len(keys) > 1:
        body["range_end"] = b64(keys[-1] + b"\x00")
    if not values:
        body["keys_only"] = True
    reply = gateway.call("/v3/kv/range", body, idempotent=True, within_s=RANGE_S)
    wanted = set(keys)
    found = {}
    for kv in reply.get("kvs", ()):
        key = unb64(kv.get("key"))
        if key in wanted:
            found[key] = unb64(kv.get("value"))
    return found, number(reply.get("header", {}), "revision")


def _watch(
    gateway: Gateway,
    missing: list[bytes],
    start: int,
    deadline: float,
    found: dict[bytes, bytes],
) -> bool:
    """Watch ``missing`` from revision ``start``, filling ``found`` as they are put; True
    once none is missing, False at the deadline or when the watch must start over."""
    body = {
        "create_request": {
            "key": b64(missing[0]),
            "range_end": b64(missing[-1] + b"\x00"),
            "start_revision": str(start),
        }
    }
    left = set(missing)
    try:
        stream = gateway.open_stream("/v3/watch", body, max(deadline - time.monotonic(), 0.05))
    except StoreError:  # no member took it in time: the range says what changed
        return False
    try:
        while left:
            result = _next(stream, deadline, gateway)
            if result is None or result.get("canceled"):
                return False  # deadline, a lost member, or a compacted revision
            for event in result.get("events", ()):
                if event.get("type", "PUT") != "PUT":
                    continue
                kv = event.get("kv", {})
                key = unb64(kv.get("key"))
                if key in left:
                    left.discard(key)
                    found[key] = unb64(kv.get("value"))
        return True
    finally:
        stream.close()


def _next(stream: Stream, deadline: float, gateway: Gateway) -> dict[str, Any] | None:
    """The stream's next message; None at the deadline or when its member went away."""
    try:
        return stream.next(deadline)
    except TimeoutError:
        return None
    except (OSError, ValueError):
        gateway.lost_member(stream.member)
        return None
