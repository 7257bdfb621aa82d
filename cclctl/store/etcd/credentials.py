"""Who cclctl is to an etcd cluster that checks: a user and password, TLS, or both.

etcd never sees the job's token (``docs/security.md``); a cluster that refuses strangers
checks its own users (``etcdctl auth enable``) and client certificates
(``--client-cert-auth``). Every cclctl process that opens the store (ranks, host agents,
the launcher, ``top``, ``diagnose``, ``abort``) reads the same variables:

- ``CCLCTL_ETCD_USER`` and ``CCLCTL_ETCD_PASSWORD_FILE``: an etcd user and a file holding
  its password (a file, not a variable: environments leak into process listings and
  dumps). The user needs read and write on the prefix ``cclctl/``.
- ``CCLCTL_ETCD_CA``: the CA bundle that signed the members' certificates; with it cclctl
  speaks TLS to etcd (``https``), and checks each member's certificate and name.
- ``CCLCTL_ETCD_CERT`` and ``CCLCTL_ETCD_KEY``: this client's certificate and key, for a
  cluster that asks for one.
"""

from __future__ import annotations

import dataclasses
import os
import ssl
from collections.abc import Mapping

from cclctl.errors import ConfigError

USER, PASSWORD_FILE = "CCLCTL_ETCD_USER", "CCLCTL_ETCD_PASSWORD_FILE"
CA, CERT, KEY = "CCLCTL_ETCD_CA", "CCLCTL_ETCD_CERT", "CCLCTL_ETCD_KEY"
#: A password file larger than this is not one.
MAX_PASSWORD_BYTES = 4096


@dataclasses.dataclass(frozen=True)
class Credentials:
    """A user and its password (both or neither), and the TLS files (none: plain HTTP)."""

    user: str = ""
    password: str = dataclasses.field(default="", repr=False)
    ca: str = ""
    cert: str = ""
    key: str = ""

    @property
    def tls(self) -> bool:
        return bool(self.ca)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context members are reached with (None: plain HTTP)."""
        if not self.tls:
            return None
        try:
            context = ssl.create_default_context(cafile=self.ca)
            if self.cert:
                context.load_cert_chain(self.cert, self.key or None)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"etcd's TLS files ({CA}={self.ca}, {CERT}={self.cert or '-'}, "
                f"{KEY}={self.key or '-'}) cannot be used: {exc}"
            ) from None
        return context


def from_env(env: Mapping[str, str] | None = None) -> Credentials:
    """The credentials the ``CCLCTL_ETCD_*`` variables name (see the module); ConfigError,
    in words, where they are incomplete or a file cannot be read."""
    env = os.environ if env is None else env
    user, password_file = env.get(USER, ""), env.get(PASSWORD_FILE, "")
    if bool(user) != bool(password_file):
        raise ConfigError(f"{USER} and {PASSWORD_FILE} go together: set both, or neither")
    ca, cert, key = env.get(CA, ""), env.get(CERT, ""), env.get(KEY, "")
    if (cert or key) and not ca:
        raise ConfigError(f"{CERT} and {KEY} are for TLS: set {CA} too (the members' CA)")
    if bool(cert) != bool(key):
        raise ConfigError(f"{CERT} and {KEY} go together: set both, or neither")
    for name, path in ((CA, ca), (CERT, cert), (KEY, key)):
        if path and not os.path.isfile(path):
            raise ConfigError(f"{name}={path}: no such file")
    return Credentials(user, _password(password_file), ca, cert, key)


def _password(path: str) -> str:
    """The password in ``path`` (its last line break dropped)."""
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_PASSWORD_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{PASSWORD_FILE}={path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_PASSWORD_BYTES:
        raise ConfigError(f"{PASSWORD_FILE}={path}: over {MAX_PASSWORD_BYTES} bytes")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise ConfigError(f"{PASSWORD_FILE}={path}: not UTF-8 text") from None
    password = text.removesuffix("\n").removesuffix("\r")
    if not password:
        raise ConfigError(f"{PASSWORD_FILE}={path}: the file is empty")
    return password
