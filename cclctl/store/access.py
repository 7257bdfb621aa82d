"""Who may do what on a store: the token handshake and the one read-only set.

A store started with a token serves two kinds of connection. One that proved the token
(``HELLO``/``AUTH`` below) may do everything. One that did not may only read what ``cclctl
top`` and ``cclctl diagnose hang --store`` read: a ``LIST`` (answered with the public keys
only) and ``PING``. Everything else, above all every write, is refused with a reason.

The handshake, two round trips, the token never on the wire::

    client -> HELLO(client_nonce)
    server -> (server_nonce, prove(token, SERVER, client_nonce, server_nonce))
    client    checks the server's proof: a store without the token cannot fake it
    client -> AUTH(prove(token, CLIENT, server_nonce, client_nonce))
    server    checks it; a wrong proof closes the connection

Each side's proof is bound to its role and to both fresh nonces, so neither can be replayed
on another connection nor reflected back as the other side's answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from cclctl import auth
from cclctl.store.protocol import Op

#: What the two proofs are about (the first part of each proof's context).
SERVER_ROLE = "cclctl-store/server"
CLIENT_ROLE = "cclctl-store/client"

#: Requests a connection without the token may make (``cclctl top``, ``diagnose hang``),
#: and ``TRY_GET`` of a key it may see.
READ_ONLY_OPS = frozenset((Op.LIST, Op.PING, Op.HELLO, Op.AUTH))

#: The keys such a connection may see: every rank's status, each host agent's document of
#: its ranks' statuses and that document's head (all of it but the statuses), the job's
#: world size and its last probe (``cclctl.live.snapshot`` reads exactly these).
PUBLIC_KEYS = re.compile(
    rb"cclctl/[^/]+/(status/[0-9]+|host/[^/]+|head/[^/]+|rdzv/world_size|probe)"
)

#: What a host agent asks of its job's store (``runtime/hostagent``): its host's document
#: written, the job's dump requests read, its host's part of the fan-in rendezvous
#: (``runtime/hostagent/fanin.py``) and of the transport's meeting after it
#: (``runtime/hostagent/meet_keys.py``: its host's address document, its ranks' marker and
#: problems, their count, the verdict), and the job's revoke record waited on and read. A
#: connection that asks nothing else is no rank's: a lingering store does not wait for it,
#: nor refuse a rerun's takeover for it.
AGENT_REQUESTS = {
    Op.SET: re.compile(
        rb"cclctl/[^/]+/(host/[^/]+|head/[^/]+|rdzv/group/[0-9]+\.[0-9]+\.[0-9]+"
        rb"|transport/0/(mapped|problem)/g?[0-9]+)"
    ),
    Op.TRY_GET: re.compile(rb"cclctl/[^/]+/(signal/dump/(count|why)|revoke)"),
    Op.COMPARE_SET: re.compile(
        rb"cclctl/[^/]+/(rdzv/(world_size|world|error|lister)"
        rb"|transport/0/(hostaddr/[^/]+|verdict|lister))"
    ),
    Op.ADD: re.compile(rb"cclctl/[^/]+/(rdzv/arrived|transport/0/mapped#)"),
    Op.GET: re.compile(rb"cclctl/[^/]+/(rdzv/world|auth/check|revoke|transport/0/verdict)"),
}
_AGENT_PATTERNS: dict[int, re.Pattern[bytes]] = {int(op): p for op, p in AGENT_REQUESTS.items()}

#: A connection without the token sends nothing larger (a LIST of a job's prefix is tiny).
READ_ONLY_MAX_FRAME = 64 << 10

_VERBS = {
    Op.SET: "set",
    Op.SET_MANY: "set",
    Op.GET: "get",
    Op.TRY_GET: "get",
    Op.ADD: "add",
    Op.COMPARE_SET: "compare-and-set",
    Op.WAIT: "wait",
    Op.DELETE: "delete",
}


def server_proof(token: str, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return auth.prove(token, SERVER_ROLE, client_nonce, server_nonce)


def client_proof(token: str, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return auth.prove(token, CLIENT_ROLE, server_nonce, client_nonce)


def reads_only(op: int, fields: Sequence[bytes]) -> bool:
    """Whether the request only reads what a connection without the token may see."""
    if op == Op.TRY_GET:
        return len(fields) == 1 and PUBLIC_KEYS.fullmatch(fields[0]) is not None
    return op in READ_ONLY_OPS


def refusal(op: int, fields: Sequence[bytes]) -> str | None:
    """Why a connection without the token may not make this request; None: it may."""
    if reads_only(op, fields):
        return None
    verb = _VERBS.get(Op(op), "request") if op in Op._value2member_map_ else f"request {op}"
    key = fields[0].decode(errors="replace") if fields else ""
    return f"{verb} of {key!r}: no token (a client without the job's token may only read statuses)"


def public_listing(found: Sequence[bytes]) -> list[bytes]:
    """A LIST reply (key, value, key, value, ...) cut to the keys anyone may read."""
    return [
        part
        for i in range(0, len(found), 2)
        if PUBLIC_KEYS.fullmatch(found[i])
        for part in (found[i], found[i + 1])
    ]


def is_agents(op: int, fields: list[bytes]) -> bool:
    """Whether the request is one a host agent makes (:data:`AGENT_REQUESTS`; a set of
    many keys is one where a set of each key is)."""
    if op == Op.SET_MANY:
        keys = fields[::2]
        return bool(keys) and all(is_agents(Op.SET, [key]) for key in keys)
    pattern = _AGENT_PATTERNS.get(op)
    return pattern is not None and bool(fields) and pattern.fullmatch(fields[0]) is not None
