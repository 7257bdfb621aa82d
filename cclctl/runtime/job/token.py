"""How a rank gets the job's token, and how the ranks make sure they hold the same one.

``CCLCTL_TOKEN`` when set (``cclctl launch`` sets it; under srun, mpirun or torchrun across
hosts the user exports one on every node). Without it, rank 0, which hosts the store, makes
one and writes it 0600 to the job's folder (:func:`cclctl.config.job_dir`), and the ranks on
its host read it from there: the file may appear after they start, or still hold an earlier
run's token, so they wait for it and read it again when it proves wrong. A rank on another
host has no way to read it and stops at once, saying what to set. The job's store removes
that file as it exits (``cclctl.store.detached``), not rank 0 at its close: ``cclctl abort``,
``retry`` and ``top`` read it to reach the store, which outlives rank 0.
"""

from __future__ import annotations

import dataclasses
import socket
import time

from cclctl import auth
from cclctl.config import RuntimeConfig, job_dir
from cclctl.errors import ConfigError, RendezvousError, StoreTimeout
from cclctl.store.scope import ScopedStore

#: How a rank gets its token (see :func:`token_plan`).
GIVEN, GENERATE, READ_FILE, WAIT_FOR_FILE, REFUSE = (
    "given",
    "generate",
    "read-file",
    "wait-for-file",
    "refuse",
)
CHECK_KEY = auth.TOKEN_CHECK_KEY
_FILE_POLL_S = 0.1
RECIPE = "export CCLCTL_TOKEN=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"


def token_plan(*, given: bool, hosts_store: bool, store_is_local: bool, store_running: bool) -> str:
    """The one decision: use the given token, make one (rank 0 hosting the store), read the
    job's token file (waiting for it while rank 0 has yet to write it), or refuse."""
    if given:
        return GIVEN
    if hosts_store:
        return GENERATE
    if store_is_local:
        return READ_FILE if store_running else WAIT_FOR_FILE
    return REFUSE


@dataclasses.dataclass
class TokenSource:
    """This rank's token, where it came from, and the file to read again if it is stale."""

    token: str
    plan: str
    folder: str

    def refresh(self) -> bool:
        """Read the token file again; True when it now holds another token."""
        if self.plan not in (READ_FILE, WAIT_FOR_FILE):
            return False
        fresh = auth.read_token_file(self.folder)
        if fresh is None or fresh == self.token:
            return False
        self.token = fresh
        return True


def resolve_token(
    cfg: RuntimeConfig,
    *,
    rank: int,
    store: tuple[str, int],
    hosts_store: bool,
    store_running: bool,
) -> TokenSource:
    """This rank's token by :func:`token_plan`; a ConfigError (one line) when it has none."""
    folder = cfg.trace_dir or job_dir(cfg.job)
    plan = token_plan(
        given=bool(cfg.token),
        hosts_store=hosts_store,
        store_is_local=not cfg.token and not hosts_store and is_this_host(store[0]),
        store_running=store_running,
    )
    if plan == GIVEN:
        return TokenSource(cfg.token, plan, folder)
    if plan == GENERATE:
        token = auth.new_token()
        try:
            auth.write_token_file(folder, token)
        except OSError as exc:
            raise ConfigError(
                f"rank 0 cannot write the job's token file in {folder}: "
                f"{exc.strerror or exc} (set CCLCTL_TRACE_DIR or TMPDIR to a folder of "
                f"yours, or CCLCTL_TOKEN on every rank: {RECIPE})",
                variable="CCLCTL_TOKEN",
            ) from None
        return TokenSource(token, plan, folder)
    if plan == REFUSE:
        raise ConfigError(
            f"rank {rank} has no CCLCTL_TOKEN and the job's store ({store[0]}:{store[1]}) is on "
            f"another host, whose token file it cannot read: set the same token on every node "
            f"before srun, mpirun or torchrun: {RECIPE}",
            variable="CCLCTL_TOKEN",
        )
    deadline = time.monotonic() + (cfg.connect_timeout_s if plan == WAIT_FOR_FILE else 0.0)
    while True:
        found = auth.read_token_file(folder)
        if found is not None:
            return TokenSource(found, plan, folder)
        if time.monotonic() >= deadline:
            raise ConfigError(
                f"rank {rank} has no CCLCTL_TOKEN and found no token file at "
                f"{auth.token_path(folder)} (written by rank 0 or cclctl launch as the job "
                f"starts): set CCLCTL_TOKEN on every rank: {RECIPE}",
                variable="CCLCTL_TOKEN",
            )
        time.sleep(_FILE_POLL_S)


def is_this_host(host: str) -> bool:
    """Whether ``host`` names this machine (loopback, or an address it can bind)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, kind, proto, _, sockaddr in infos:
        if str(sockaddr[0]).startswith("127.") or sockaddr[0] == "::1":
            return True
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.bind((sockaddr[0], 0))
            except OSError:
                continue
            return True
    return False


def publish_check(scoped: ScopedStore, token: str, job: str) -> None:
    """Rank 0: leave a proof of its token in the store (never the token itself)."""
    challenge = auth.nonce()
    scoped.set(CHECK_KEY, challenge + auth.prove(token, "token-check", job, challenge))


def agree_token(
    scoped: ScopedStore, source: TokenSource, rank: int, job: str, timeout_s: float
) -> str:
    """Another rank: check its token against rank 0's proof, reading the token file again
    while it is stale (until ``timeout_s``); returns the agreed token."""
    deadline = time.monotonic() + timeout_s
    try:
        scoped.wait([CHECK_KEY], timeout_s=timeout_s)
    except StoreTimeout:
        raise RendezvousError(
            f"rank {rank}: rank 0 left no proof of the job's token within {timeout_s:g}s",
            rank=rank,
        ) from None
    raw = scoped.get(CHECK_KEY)
    while not auth.proves_check(raw, source.token, job):
        if source.plan not in (READ_FILE, WAIT_FOR_FILE) or time.monotonic() >= deadline:
            raise RendezvousError(
                f"rank {rank}'s token ({auth.redact(source.token)}, {source.plan}) is not rank "
                "0's: set the same CCLCTL_TOKEN on every rank, or on none of one host's",
                rank=rank,
            )
        if not source.refresh():
            time.sleep(_FILE_POLL_S)
    return source.token
