"""The link handshake: both ranks of a TCP link prove they hold the job's token.

Four messages, the lower rank (the connector) first::

    HELLO      connector -> acceptor   version, flags, job tag, from, to, world, epoch, nonce_a
    CHALLENGE  acceptor  -> connector  nonce_b
    PROOF      connector -> acceptor   HMAC(token, "connector", job, epoch, ranks, world,
                                            flags, nonce_a, nonce_b)
    ACCEPT     acceptor  -> connector  HMAC(token, "acceptor", the same context)

An acceptor that turns a link away after its HELLO says why before it closes (REFUSE, a
code from :data:`TOLD`), so the connector's error names the cause; "evicted" (every slot
taken by connections that proved nothing) asks it to connect again.

The token never crosses the wire, a proof answers one exchange only (both nonces are in it),
roles are bound (an acceptor's proof is never a connector's), and the connector proves
itself before the acceptor answers with a proof of its own. Both sides derive the link's
session key from the same context; with ``CCLCTL_LINK_MAC=1`` it keys an HMAC-SHA256 tag on
every message (:class:`~.mac.LinkMac`).
"""

from __future__ import annotations

import dataclasses
import hmac
import socket
import struct
import zlib

from cclctl import auth
from cclctl.runtime.socket_io import recv_exact
from cclctl.runtime.transport.tcp.mac import LinkMac

VERSION = 1
FLAG_MAC = 0x01
#: magic, version, flags, 0, job tag, from, to, world size, epoch, nonce_a
_HELLO = struct.Struct("<4sBBHIIIIQ16s")
_HELLO_MAGIC = b"CCL2"
_OLD_HELLO_MAGIC = b"CCL1"  # the unauthenticated hello of earlier versions: job tag, rank, world
_CHALLENGE = struct.Struct("<4s16s")
_PROOF = struct.Struct(f"<4s{auth.PROOF_BYTES}s")
CHALLENGE_MAGIC = b"CCLc"
PROOF_MAGIC = b"CCLp"
ACCEPT_MAGIC = b"CCLa"


#: Why a handshake was refused: a fixed set, so that what a stranger sends never makes a new
#: kind of log line. Each kind's phrase is what the refusal log and the connector say.
KINDS = {
    "old_hello": "an unauthenticated (CCL1) handshake",
    "not_cclctl": "not a cclctl link handshake",
    "malformed": "a malformed handshake",
    "version": "another handshake version",
    "another_job": "another job",
    "wrong_rank": "meant for another rank or world size",
    "epoch": "another epoch",
    "mac": "CCLCTL_LINK_MAC differs",
    "bad_proof": "bad proof (it does not hold the job's token)",
    "already_linked": "that rank is already linked",
    "closed_in_epoch": "its link was closed earlier in this epoch",
    "closing": "this rank's links are closing",
    "evicted": "all handshake slots were taken, and this was the oldest unproven connection",
    "timeout": "no complete handshake before the deadline",
    "closed": "closed during the handshake",
    "socket": "a socket error",
}
#: The kinds an acceptor tells the connector (REFUSE's code is the index): what follows a
#: HELLO, which only a cclctl rank sends. "evicted" asks it to connect again.
TOLD = (
    "evicted", "version", "another_job", "wrong_rank", "epoch", "mac", "bad_proof",
    "already_linked", "closed_in_epoch", "closing",
)  # fmt: skip
_REFUSE = struct.Struct("<4sB3x")
REFUSE_MAGIC = b"CCLr"


class HandshakeRefused(Exception):
    """A handshake that failed: ``why`` in words, ``kind`` one of :data:`KINDS`, ``claimed``
    the rank the newcomer said it was, if any."""

    def __init__(self, why: str, claimed: int | None = None, kind: str = "malformed") -> None:
        super().__init__(why)
        self.why = why
        self.claimed = claimed
        self.kind = kind

    @property
    def busy(self) -> bool:
        """The acceptor turned this connection away for want of a slot: connect again."""
        return self.kind == "evicted"


def refusal(kind: str) -> bytes:
    """What an acceptor sends before it closes a refused connection that sent a HELLO."""
    return _REFUSE.pack(REFUSE_MAGIC, TOLD.index(kind)) if kind in TOLD else b""


def job_tag(job: str) -> int:
    """A 32-bit tag for the job name, to turn strangers away before any proof."""
    return zlib.crc32(job.encode())


@dataclasses.dataclass(frozen=True)
class LinkContext:
    """What a link's proofs are bound to: the job, its epoch, both ranks and the options."""

    job: str
    epoch: int
    connector: int
    acceptor: int
    world_size: int
    flags: int
    nonce_a: bytes
    nonce_b: bytes

    def parts(self) -> tuple[bytes | str | int, ...]:
        return (
            "cclctl-link",
            VERSION,
            self.job,
            self.epoch,
            self.connector,
            self.acceptor,
            self.world_size,
            self.flags,
            self.nonce_a,
            self.nonce_b,
        )

    def proof(self, token: str, role: str) -> bytes:
        return auth.prove(token, role, *self.parts())

    def session(self, token: str, sender: int) -> LinkMac | None:
        """This side's session (None without FLAG_MAC); ``sender`` is this rank."""
        if not self.flags & FLAG_MAC:
            return None
        key = auth.prove(token, "session", *self.parts())
        return LinkMac(key, sender, self.acceptor if sender == self.connector else self.connector)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    return recv_exact(sock, size, "closed during the handshake")


def _expect(sock: socket.socket, shape: struct.Struct, magic: bytes, claimed: int | None) -> bytes:
    head = _recv_exact(sock, len(magic))
    if head == REFUSE_MAGIC:  # the acceptor says why it turns this link away
        (_, code) = _REFUSE.unpack(head + _recv_exact(sock, _REFUSE.size - len(head)))
        kind = TOLD[code] if code < len(TOLD) else "malformed"
        raise HandshakeRefused(_told(kind), claimed, kind)
    fields = shape.unpack(head + _recv_exact(sock, shape.size - len(head)))
    if fields[0] != magic:
        raise HandshakeRefused(f"malformed handshake (got {fields[0]!r})", claimed)
    return bytes(fields[1])


def _told(kind: str) -> str:
    if kind == "evicted":
        return (
            "it turned the link away: every handshake slot was taken by connections that "
            "proved nothing (a flood of connections on its port?)"
        )
    if kind == "bad_proof":
        return "it refused this rank's proof (a different CCLCTL_TOKEN?)"
    return f"it refused the link: {KINDS[kind]}"


def connect(
    sock: socket.socket,
    token: str,
    job: str,
    epoch: int,
    rank: int,
    peer: int,
    world_size: int,
    flags: int,
) -> LinkMac | None:
    """The connector's side, on a blocking socket with a deadline; raises
    :class:`HandshakeRefused` (or OSError) when the peer is not the job's rank ``peer``."""
    nonce_a = auth.nonce()
    sock.sendall(
        _HELLO.pack(
            _HELLO_MAGIC, VERSION, flags, 0, job_tag(job), rank, peer, world_size, epoch, nonce_a
        )
    )
    try:
        nonce_b = _expect(sock, _CHALLENGE, CHALLENGE_MAGIC, peer)
        ctx = LinkContext(job, epoch, rank, peer, world_size, flags, nonce_a, nonce_b)
        sock.sendall(_PROOF.pack(PROOF_MAGIC, ctx.proof(token, "connector")))
        answer = _expect(sock, _PROOF, ACCEPT_MAGIC, peer)
    except ConnectionError:  # closed without a word: not a refusal this version sends
        why = "it closed the link during the handshake without saying why"
        raise HandshakeRefused(why, peer, "closed") from None
    if not hmac.compare_digest(answer, ctx.proof(token, "acceptor")):
        raise HandshakeRefused("it failed to prove the job's token", peer, "bad_proof")
    return ctx.session(token, rank)


def hello_size(magic: bytes) -> int:
    """How many bytes the HELLO that begins with these 4 has; refuses a stranger at once."""
    if magic == _OLD_HELLO_MAGIC:
        return len(magic) + 12
    if magic != _HELLO_MAGIC:
        raise HandshakeRefused(
            f"not a cclctl link handshake (it began {magic!r})", None, "not_cclctl"
        )
    return _HELLO.size


@dataclasses.dataclass(frozen=True)
class Challenged:
    """An acceptor's handshake between its CHALLENGE and the connector's PROOF."""

    context: LinkContext
    challenge: bytes  # what to send the connector


def answer_hello(
    raw: bytes, job: str, epoch: int, rank: int, world_size: int, flags: int
) -> Challenged:
    """The acceptor's answer to a whole HELLO (:func:`hello_size` bytes): a challenge with a
    fresh nonce, or :class:`HandshakeRefused` naming what in it is not this link's."""
    if raw[: len(_OLD_HELLO_MAGIC)] == _OLD_HELLO_MAGIC:
        _, claimed, _ = struct.unpack("<III", raw[len(_OLD_HELLO_MAGIC) :])
        raise HandshakeRefused("an unauthenticated (CCL1) handshake", claimed, "old_hello")
    _, version, their_flags, _, tag, claimed, to, world, their_epoch, nonce_a = _HELLO.unpack(raw)
    hello = _Hello(version, their_flags, tag, claimed, to, world, their_epoch)
    kind, why = hello.problem(job=job, epoch=epoch, rank=rank, world_size=world_size, flags=flags)
    if kind:
        raise HandshakeRefused(why, claimed, kind)
    nonce_b = auth.nonce()
    ctx = LinkContext(job, epoch, claimed, rank, world_size, flags, bytes(nonce_a), nonce_b)
    return Challenged(ctx, _CHALLENGE.pack(CHALLENGE_MAGIC, nonce_b))


#: Bytes of the connector's PROOF.
PROOF_SIZE = _PROOF.size


def check_proof(raw: bytes, token: str, ctx: LinkContext) -> None:
    """Raise :class:`HandshakeRefused` unless ``raw`` (:data:`PROOF_SIZE` bytes) is the
    connector's proof of the token for this exchange; ``ctx.connector`` is then proven."""
    magic, proof = _PROOF.unpack(raw)
    if magic != PROOF_MAGIC:
        raise HandshakeRefused(f"malformed handshake (got {magic!r})", ctx.connector)
    if not hmac.compare_digest(proof, ctx.proof(token, "connector")):
        why = "bad proof (it does not hold the job's token)"
        raise HandshakeRefused(why, ctx.connector, "bad_proof")


def confirmation(token: str, ctx: LinkContext) -> bytes:
    """The acceptor's last message: its own proof, once the link is registered."""
    return _PROOF.pack(ACCEPT_MAGIC, ctx.proof(token, "acceptor"))


@dataclasses.dataclass(frozen=True)
class _Hello:
    version: int
    flags: int
    tag: int
    claimed: int
    to: int
    world: int
    epoch: int

    def problem(
        self, *, job: str, epoch: int, rank: int, world_size: int, flags: int
    ) -> tuple[str, str]:
        """The kind and words of why this HELLO is refused before any proof, or ("", "")
        when it may go on."""
        if self.version != VERSION:
            return "version", f"handshake version {self.version}, expected {VERSION}"
        if self.tag != job_tag(job):
            return "another_job", "another job"
        if self.world != world_size or self.to != rank:
            this = f"this is rank {rank} of {world_size}"
            return "wrong_rank", f"meant for rank {self.to} of {self.world}, {this}"
        if not 0 <= self.claimed < rank:
            return "wrong_rank", "a rank that does not connect to this one"
        if self.epoch != epoch:
            return "epoch", f"epoch {self.epoch}, this rank is at epoch {epoch}"
        if self.flags != flags:
            on = "on" if flags & FLAG_MAC else "off"
            return "mac", f"CCLCTL_LINK_MAC differs (it is {on} here)"
        return "", ""
