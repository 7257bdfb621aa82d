"""Parsers of configuration values: raw text in, a typed value out, or ValueError saying
what was expected (``parse`` turns that into a ConfigError naming the variable)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping
from typing import TypeVar

from cclctl.errors import ConfigError

T = TypeVar("T")


def parse(env: Mapping[str, str], name: str, default: T, conv: Callable[[str], T]) -> T:
    """``env[name]`` converted by ``conv``; ``default`` when it is unset or blank."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return conv(raw.strip())
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name}={raw!r} is not valid: {exc}", variable=name) from None


def _number(raw: str, what: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"expected {what}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"expected {what}")
    return value


def positive_float(raw: str) -> float:
    value = _number(raw, "a positive number of seconds")
    if not value > 0:
        raise ValueError("must be a positive number of seconds")
    return value


#: The longest a store may outlive its job (``CCLCTL_STORE_LINGER``): a day.
MAX_LINGER_S = 86400.0


def linger_seconds(raw: str) -> float:
    """A grace in seconds: positive (a store no rank could reach is useless), at most a day."""
    value = positive_float(raw)
    if value > MAX_LINGER_S:
        raise ValueError(f"must be at most {MAX_LINGER_S:g} seconds (a day)")
    return value


#: The shortest and longest window of the slowness signals (``CCLCTL_SLOW_WINDOW``).
MIN_SLOW_WINDOW_S, MAX_SLOW_WINDOW_S = 0.1, 3600.0


def slow_window(raw: str) -> float:
    """The slowness signals' window in seconds: 0.1 to 3600 (see cclctl/slow_signals.py)."""
    value = positive_float(raw)
    if not MIN_SLOW_WINDOW_S <= value <= MAX_SLOW_WINDOW_S:
        raise ValueError(
            f"must be {MIN_SLOW_WINDOW_S:g} to {MAX_SLOW_WINDOW_S:g} seconds, not {value:g}"
        )
    return value


def non_negative_float(raw: str) -> float:
    value = _number(raw, "a number of seconds, 0 or more")
    if value < 0:
        raise ValueError("must be 0 or more seconds")
    return value


def integer(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError("expected a whole number") from None


def non_negative_int(raw: str) -> int:
    value = integer(raw)
    if value < 0:
        raise ValueError("must be >= 0")
    return value


def choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def conv(raw: str) -> str:
        value = raw.lower()
        if value not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return value

    return conv


def flag(raw: str) -> bool:
    value = raw.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected 1 or 0 (on or off)")


def port(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError("expected a port number (0 to 65535)") from None
    if not 0 <= value <= 65535:
        raise ValueError("a port is between 0 and 65535")
    return value


def host_port(raw: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) of a running store: a port from 1 to 65535."""
    host, sep, port_text = raw.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError("expected HOST:PORT with a port from 1 to 65535")
    return host, int(port_text)


#: The scheme of an etcd cluster's address (``CCLCTL_STORE=etcd://h1:p1,h2:p2``).
ETCD_SCHEME = "etcd://"


def is_etcd(raw: str) -> bool:
    """Whether a store address names an etcd cluster rather than cclctl's own store."""
    return raw.strip().lower().startswith(ETCD_SCHEME)


def etcd_endpoints(raw: str) -> list[tuple[str, int]]:
    """``etcd://h1:p1,h2:p2`` -> ``[(h1, p1), (h2, p2)]``, the members' client ports in the
    order a client tries them (``[::1]:port`` for IPv6); duplicates dropped."""
    text = raw.strip()
    if not is_etcd(text):
        raise ValueError("expected etcd://HOST:PORT,HOST:PORT,...")
    endpoints: list[tuple[str, int]] = []
    for entry in text[len(ETCD_SCHEME) :].rstrip("/").split(","):
        try:
            endpoint = host_port(entry)
        except ValueError:
            raise ValueError(
                f"{entry.strip()!r} is not HOST:PORT (expected etcd://HOST:PORT,HOST:PORT,...)"
            ) from None
        if endpoint not in endpoints:
            endpoints.append(endpoint)
    return endpoints


def store_address(raw: str) -> str:
    """A running store's address: ``HOST:PORT`` (cclctl's) or ``etcd://HOST:PORT,...``."""
    if is_etcd(raw):
        etcd_endpoints(raw)
    else:
        host_port(raw)
    return raw.strip()


STORE_MAX_FRAME_RANGE = (64 << 10, 1 << 30)
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")


def bind_address(raw: str) -> str:
    """An address to listen on: an IP (``0.0.0.0``, ``::`` for every interface) or a name."""
    host = raw.strip("[]")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        if _HOSTNAME.fullmatch(host) and len(host) <= 253:
            return host
    raise ValueError("expected an address to listen on (an IP, 0.0.0.0, or a host name)")


def _size(raw: str) -> int:
    """Bytes, with an optional K, M or G (binary): ``64M``."""
    text = raw.upper().removesuffix("B").removesuffix("I")
    unit = text[-1:] if text[-1:] in _SIZE_UNITS else ""
    try:
        return int(text[: len(text) - len(unit)]) * _SIZE_UNITS[unit]
    except ValueError:
        raise ValueError("expected a size in bytes, like 67108864 or 64M") from None


def frame_size(raw: str) -> int:
    """Bytes, with an optional K, M or G (binary): ``64M``; a store frame cap's range."""
    value = _size(raw)
    low, high = STORE_MAX_FRAME_RANGE
    if not low <= value <= high:
        raise ValueError("a store frame cap is between 64K and 1G")
    return value


#: The relay's staging chunk (``CCLCTL_STAGE_CHUNK``) and ring depth (``CCLCTL_STAGE_DEPTH``).
STAGE_CHUNK_RANGE = (4 << 10, 1 << 30)
STAGE_DEPTH_RANGE = (2, 64)


def stage_chunk(raw: str) -> int:
    """Bytes per staging buffer, with an optional K, M or G: ``4M``; between 4K and 1G."""
    value = _size(raw)
    low, high = STAGE_CHUNK_RANGE
    if not low <= value <= high:
        raise ValueError("a staging chunk is between 4K and 1G")
    return value


def stage_depth(raw: str) -> int:
    """Staging buffers in the relay's ring: 2 (copies overlap the wire) to 64."""
    value = integer(raw)
    low, high = STAGE_DEPTH_RANGE
    if not low <= value <= high:
        raise ValueError(f"a staging depth is between {low} and {high}")
    return value
