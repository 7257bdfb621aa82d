"""How the commands that read a live job reach its store: ``--store`` and one connection.

``top``, ``diagnose hang --store`` and ``abort`` take the store's address the same way and
open it with the same bounds, so a typo in ``--store`` is the same one-line error and a
store that is gone fails within the same two seconds for all three.
"""

from __future__ import annotations

from typing import Any

import typer

from cclctl.config import client_token
from cclctl.errors import ConfigError, StoreError
from cclctl.store.backends import endpoint_of, open_store
from cclctl.store.kv import KeyValueStore

CONNECT_TIMEOUT_S = 2.0
REQUEST_TIMEOUT_S = 10.0
STORE_HELP = (
    "The job's store, HOST:PORT, as `cclctl launch` prints it, or etcd://HOST:PORT,... "
    "\\[default: CCLCTL_STORE]."
)


def store_option(help_text: str = STORE_HELP) -> Any:
    """The ``--store HOST:PORT`` option (its default comes from the preflight)."""
    return typer.Option(None, "--store", help=help_text, show_default=False)


def connect(
    address: str,
    *,
    token: str | None = None,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
) -> KeyValueStore:
    """A client of the store at ``address`` (``HOST:PORT``, or an etcd cluster's
    ``etcd://HOST:PORT,...``) with ``token`` (default: this user's ``CCLCTL_TOKEN``, if
    any); a malformed address is a ConfigError naming ``--store``."""
    try:
        endpoint_of(address)
    except StoreError as exc:
        raise ConfigError(f"--store: {exc}", flag="--store") from None
    return open_store(
        address,
        timeout_s=REQUEST_TIMEOUT_S,
        connect_timeout_s=connect_timeout_s,
        token=client_token() if token is None else token,
    )
