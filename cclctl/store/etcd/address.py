"""An etcd store's address: ``etcd://host1:port1,host2:port2,...`` (one entry per member)."""

from __future__ import annotations

from cclctl import config_values
from cclctl.errors import StoreError

SCHEME = config_values.ETCD_SCHEME
is_etcd = config_values.is_etcd


def parse_endpoints(address: str) -> list[tuple[str, int]]:
    """The members' ``(host, port)`` in the order a client tries them; StoreError naming
    the address when it is not one."""
    try:
        return config_values.etcd_endpoints(address)
    except ValueError as exc:
        raise StoreError(f"{address!r} is not an etcd address: {exc}") from None


def format_endpoints(endpoints: list[tuple[str, int]]) -> str:
    """The address of ``endpoints``, as :func:`parse_endpoints` reads it."""
    return SCHEME + ",".join(
        f"[{host}]:{port}" if ":" in host else f"{host}:{port}" for host, port in endpoints
    )
