"""A link's message MACs (``CCLCTL_LINK_MAC=1``): an HMAC-SHA256 tag on every message.

The session key comes from the link's handshake (:mod:`~.link_auth`); each message's MAC
covers its sender and number, so a message dropped, repeated or reordered in flight fails
its check as surely as a changed byte.
"""

from __future__ import annotations

import hmac
import struct
from typing import Any

from cclctl.errors import ProtocolError

TAG_BYTES = 16  # a message's MAC (HMAC-SHA256, truncated)


class LinkMac:
    """The MAC of every message on one link, in both directions, numbered so that a
    message dropped, repeated or reordered in flight fails its check as surely as a
    changed byte."""

    __slots__ = ("_base", "peer", "rank", "recv_seq", "send_seq")

    def __init__(self, key: bytes, rank: int, peer: int) -> None:
        # OpenSSL's HMAC-SHA256 runs on the CPU's SHA instructions (x86 SHA-NI, ARMv8), which
        # hash large payloads faster than BLAKE2b does in software.
        self._base = hmac.new(key, digestmod="sha256")
        self.rank = rank
        self.peer = peer
        self.send_seq = 0
        self.recv_seq = 0

    def _start(self, sender: int, seq: int) -> Any:
        mac = self._base.copy()
        mac.update(struct.pack("<IQ", sender, seq))
        return mac

    def send_mac(self) -> Any:
        """A MAC for the next message this rank sends, to feed its header and payload."""
        self.send_seq += 1
        return self._start(self.rank, self.send_seq)

    def recv_mac(self) -> tuple[int, Any]:
        """The number of the next message from the peer, and a MAC to feed it to."""
        self.recv_seq += 1
        return self.recv_seq, self._start(self.peer, self.recv_seq)

    def check(self, seq: int, mac: Any, tag: bytes) -> None:
        """Raise ProtocolError naming the peer unless ``tag`` is the message's."""
        if not hmac.compare_digest(tag, tag_of(mac)):
            raise ProtocolError(
                f"rank {self.rank}: message {seq} from rank {self.peer} failed its integrity "
                "check (CCLCTL_LINK_MAC): it was changed in flight",
                rank=self.rank,
                peer=self.peer,
            )


def tag_of(mac: Any) -> bytes:
    """A message's tag: its HMAC-SHA256, truncated to TAG_BYTES (as IPsec's HMAC-SHA-256-128)."""
    return bytes(mac.digest()[:TAG_BYTES])
