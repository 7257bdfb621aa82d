"""Where rank 0 hosts the job's store, and how every rank connects to it with the job's token.

The store (a process of its own: :mod:`cclctl.runtime.job.store_process`) listens on an
address of this host (or where ``CCLCTL_STORE_ADDR`` says), never every interface unless
asked, and a rank whose token file is stale reads it again.
"""

from __future__ import annotations

import time

from cclctl.config import RuntimeConfig
from cclctl.errors import ConfigError, StoreError
from cclctl.runtime.job.token import TokenSource, is_this_host
from cclctl.store.client import StoreClient
from cclctl.store.linger import ENDED_KEY

#: How long a rank whose token the store refused waits before reading the token file again.
TOKEN_REREAD_S = 0.2
#: How often a rank that reached an ended run's store looks again for this run's.
ENDED_POLL_S = 0.1


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


def connect_live(host: str, port: int, cfg: RuntimeConfig, source: TokenSource) -> StoreClient:
    """:func:`connect`, past a store whose job ended: a rank of a rerun that reaches the
    previous run's lingering store waits for the store this run's rank 0 starts once that
    one left (rank 0 retires it: ``store_retire.py``). It never joins the ended store, whose
    claims are the previous run's; a StoreError says so after the connect timeout."""
    deadline = time.monotonic() + cfg.connect_timeout_s
    while True:
        client = connect(host, port, cfg, source)
        try:
            if client.try_get(ENDED_KEY) is None:
                return client
        except StoreError:
            pass  # the ended store left under us: connect again
        client.close()
        if time.monotonic() >= deadline:
            raise StoreError(
                f"the store on {host}:{port} belongs to a run that ended (its ranks all left), "
                f"and this run's rank 0 did not replace it within {cfg.connect_timeout_s:g}s: "
                "start rank 0 with the same MASTER_ADDR and MASTER_PORT, or stop that store",
                address=f"{host}:{port}",
                reason="ended",
            )
        time.sleep(ENDED_POLL_S)


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
