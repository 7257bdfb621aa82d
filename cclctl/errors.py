"""Typed errors shared by every layer.

The core raises these with the fields an SRE needs (rank, peer, comm, seq, op, elapsed);
exactly one place, :mod:`cclctl.cli`, turns them into a message and an exit code, and in a
rank's process :mod:`cclctl.telemetry.uncaught` prints an uncaught one as its message.
"""

from __future__ import annotations

from typing import Any

#: Exit codes of the CLI (see docs/architecture.md, "CLI conventions").
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_FAULT = 3
EXIT_CHECK_FAILED = 4


class CclError(Exception):
    """Base of every error cclctl raises on purpose.

    ``fields`` keeps the structured context (rank, peer, comm, seq, op, ...) so that callers
    and the CLI's ``--json`` output do not have to parse the message.
    """

    exit_code = EXIT_ERROR
    #: the job's failure this error stands for (a :class:`cclctl.revocation.Revocation`),
    #: set on communicator errors once the failure state knows its origin
    revocation: Any = None

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = {k: v for k, v in fields.items() if v is not None}

    def __str__(self) -> str:
        return self.message


class UsageError(CclError):
    """Bad input from the user: a flag, an environment variable, a file."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    """An environment variable or option that cannot be parsed or is out of range."""


class InvalidArgument(UsageError):
    """A collective called with buffers it cannot work on (dtype, shape, layout)."""


class StoreError(CclError):
    """The rendezvous store could not be reached or answered badly."""


class StoreTimeout(StoreError):
    """A store request or wait did not complete within its timeout."""


class RendezvousError(CclError):
    """Ranks disagree about the job: world size, duplicate rank ids, missing ranks."""


class CommError(CclError):
    """A collective failed; fields name the rank, peer, comm, seq and op involved."""


class PeerError(CommError):
    """A link to a peer broke or a peer vanished in the middle of a collective."""


class ProtocolError(CommError):
    """A message arrived that does not match what this rank expected.

    Typically two ranks called different collectives, or the same one with a different
    count or dtype, at the same sequence number.
    """


class CollectiveTimeout(CommError):
    """A collective did not finish within the configured timeout."""


class CommAborted(CommError):
    """The communicator was aborted (by a peer, the watchdog or an operator)."""


class CommRevoked(CommAborted):
    """Another rank's failure revoked the communicator; ``revocation`` names its origin."""


class CollectiveAborted(CommAborted):
    """An operator (``cclctl abort``) or an abort policy aborted the communicator."""


class CommShrunk(CommError):
    """``CCLCTL_ON_FAILURE=shrink`` dropped dead ranks and the communicator now holds the
    survivors (``world_size``, ``rank``, ``excluded``), but this call cannot re-run by
    itself (its buffers or root depend on the world): the caller redoes it."""


class CheckFailed(CclError):
    """A verification failed: wrong results or bandwidth below the requested floor."""

    exit_code = EXIT_CHECK_FAILED


class FaultFound(CclError):
    """A diagnosis found a fault (hang, mismatch, dead or slow rank)."""

    exit_code = EXIT_FAULT


class BadInput(UsageError):
    """A file or document from outside (a dump, a status record) that cannot be used."""
