"""Where rank 0 hosts the job's store, and how every rank connects to it with the job's token.

The store listens on an address of this host (or where ``CCLCTL_STORE_ADDR`` says), never
every interface unless asked, and a rank whose token file is stale reads it again.
"""

from __future__ import annotations

import time

from cclctl.config import RuntimeConfig, StoreServerConfig
from cclctl.errors import ConfigError, StoreError
from cclctl.runtime.job.token import TokenSource, is_this_host
from cclctl.store.client import StoreClient, StoreServer
from cclctl.store.limits import StoreLimits

ANY_ADDRESSES = ("0.0.0.0", "::")
#: How long a rank whose token the store refused waits before reading the token file again.
TOKEN_REREAD_S = 0.2


def start_store(
    bind: str, port: int, token: str, hosting: StoreServerConfig
) -> tuple[StoreServer, str, int]:
    """Start the job's store on ``bind``; return it with the host and port to connect to."""
    server = StoreServer(
        bind, port, token=token or None, limits=StoreLimits(max_frame=hosting.max_frame)
    ).start()
    host = "127.0.0.1" if server.host in ANY_ADDRESSES else server.host
    return server, host, server.port


def connect(host: str, port: int, cfg: RuntimeConfig, source: TokenSource) -> StoreClient:
    """A client that proved the job's token; a token file that still holds an earlier
    run's token is read again until it holds this one's (or the connect timeout passes)."""
    deadline = time.monotonic() + cfg.connect_timeout_s
    while True:
        try:
            return StoreClient(
                host,
                port,
                timeout_s=cfg.timeout_s,
                connect_timeout_s=max(0.1, deadline - time.monotonic()),
                token=source.token or None,
            )
        except StoreError as exc:
            if exc.fields.get("reason") != "token" or time.monotonic() >= deadline:
                raise
            if not source.refresh():  # rank 0 may not have written this run's token yet
                time.sleep(TOKEN_REREAD_S)


def bind_host(host: str, bind: str = "") -> str:
    """Where rank 0's store listens: ``bind`` (``CCLCTL_STORE_ADDR``) when given, else
    ``host``, which must be one of this machine's addresses. Never every interface unless
    asked: behind NAT or in a container, say which address (or ``0.0.0.0``) to listen on.
    """
    if bind:
        return bind
    if is_this_host(host):
        return host
    raise ConfigError(
        f"the store's address {host!r} (MASTER_ADDR) is not an address of this host, and "
        "rank 0 hosts the job's store there: start rank 0 on that host, or set "
        "CCLCTL_STORE_ADDR to the address to listen on (0.0.0.0 for every interface)",
        variable="MASTER_ADDR",
    )
