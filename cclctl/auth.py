"""The job's secret: how it is made, kept, shown and proved, with the standard library only.

Every job has a token. A peer proves it knows the token by answering a challenge: an HMAC
over fresh nonces from both sides and the context of the exchange (what is being proved,
the job, the ranks, ...), so the token itself never crosses the wire and an answer cannot
be replayed in another exchange. Comparisons take constant time.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
import tempfile
from pathlib import Path

from cclctl.errors import ConfigError

#: Bytes of randomness in a fresh nonce and in a generated token.
NONCE_BYTES = 16
#: the job's store key where rank 0 leaves its proof of the token (never the token)
TOKEN_CHECK_KEY = "auth/check"
TOKEN_BYTES = 32
#: An answer to a challenge (HMAC-SHA256).
PROOF_BYTES = hashlib.sha256().digest_size
#: The name of the token's file in the job's folder (``token_path``).
TOKEN_FILE = "token"


def new_token() -> str:
    """A fresh random token (43 URL-safe characters)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def nonce() -> bytes:
    """A fresh random challenge."""
    return secrets.token_bytes(NONCE_BYTES)


def prove(token: str, *context: bytes | str | int) -> bytes:
    """The answer to a challenge: HMAC-SHA256 of ``context`` under ``token``.

    Each part is length-prefixed, so ("ab", "c") and ("a", "bc") never prove the same thing.
    """
    mac = hmac.new(token.encode(), digestmod=hashlib.sha256)
    for part in context:
        raw = part if isinstance(part, bytes) else str(part).encode()
        mac.update(len(raw).to_bytes(4, "big"))
        mac.update(raw)
    return mac.digest()


def verify(token: str, proof: bytes, *context: bytes | str | int) -> bool:
    """Whether ``proof`` answers ``context`` under ``token`` (constant time)."""
    return hmac.compare_digest(proof, prove(token, *context))


def redact(token: str) -> str:
    """What logs may show of a token: enough to tell two apart, too little to use."""
    return f"{token[:4]}…" if token else "(none)"


def token_path(folder: str | os.PathLike[str]) -> Path:
    """Where a job's token file lives in its folder (beside its dumps)."""
    return Path(folder) / TOKEN_FILE


def write_token_file(folder: str | os.PathLike[str], token: str) -> Path:
    """Write ``token`` to the job's folder, readable by its owner only (0600), whole or not
    at all; the folder is made (0700) if missing. Returns the file's path."""
    path = token_path(folder)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # A name of its own (mkstemp: 0600), so two writers at once (two launches in one
    # process) never rename each other's file away.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{TOKEN_FILE}.")
    try:
        try:
            os.write(fd, token.encode() + b"\n")
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def remove_token_file(folder: str | os.PathLike[str], token: str) -> bool:
    """Remove the job's token file if it holds ``token`` (a rerun's file, holding its own,
    stays); True if removed. Called by whoever made it once nothing needs it: the job's
    store as it exits (``cclctl abort``, ``retry`` and ``top`` read the file to reach it)."""
    try:
        if not token or read_token_file(folder) != token:
            return False
        os.unlink(token_path(folder))
    except (OSError, ConfigError):
        return False
    return True


def read_token_file(folder: str | os.PathLike[str]) -> str | None:
    """The token in the job's folder, or None when there is none (or it is empty).

    Only a file of this user's that no one else may read or write counts: in a shared
    ``/tmp`` another user could plant a token of theirs where the job looks for its own.
    """
    path = token_path(folder)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read the token file {path}: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid() or info.st_mode & 0o077 or not stat.S_ISREG(info.st_mode):
            raise ConfigError(
                f"the token file {path} is not this user's alone (owner uid {info.st_uid}, "
                f"mode {stat.S_IMODE(info.st_mode):o}): remove it, or set CCLCTL_TOKEN"
            )
        text = os.read(fd, 4096).decode(errors="replace").strip()
    finally:
        os.close(fd)
    return text or None


def proves_check(check: bytes, token: str, job: str) -> bool:
    """Whether ``token`` is the one rank 0's check (:data:`TOKEN_CHECK_KEY`: a nonce, then
    the proof over it) was made with."""
    challenge, proof = check[:NONCE_BYTES], check[NONCE_BYTES:]
    return verify(token, proof, "token-check", job, challenge)
