"""A job's store from its address: ``etcd://h1:p1,...`` is an etcd cluster
(:class:`~cclctl.store.etcd.client.EtcdClient`), anything else cclctl's own store at
``HOST:PORT`` (:class:`~cclctl.store.client.StoreClient`, the default)."""

from __future__ import annotations

from cclctl.config_values import is_etcd
from cclctl.store.channel import MAX_RETRY_DELAY_S
from cclctl.store.client import StoreClient, parse_address
from cclctl.store.etcd.address import parse_endpoints
from cclctl.store.etcd.client import EtcdClient
from cclctl.store.kv import KeyValueStore

__all__ = ["endpoint_of", "is_etcd", "open_store"]


def endpoint_of(address: str) -> tuple[str, int]:
    """``(host, port)`` of the store at ``address``: an etcd cluster's first member."""
    if is_etcd(address):
        return parse_endpoints(address)[0]
    return parse_address(address)


def open_store(
    address: str,
    *,
    timeout_s: float = 60.0,
    connect_timeout_s: float = 60.0,
    token: str | None = None,
    max_retry_delay_s: float = MAX_RETRY_DELAY_S,
) -> KeyValueStore:
    """A client of the store at ``address``, reached within ``connect_timeout_s``; the
    job's ``token`` is proved to cclctl's store (etcd checks its own users instead)."""
    kind = EtcdClient if is_etcd(address) else StoreClient
    return kind.from_address(
        address,
        timeout_s=timeout_s,
        connect_timeout_s=connect_timeout_s,
        token=token,
        max_retry_delay_s=max_retry_delay_s,
    )
