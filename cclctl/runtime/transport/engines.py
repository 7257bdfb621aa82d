"""The engines a transport may offer beside point-to-point steps, as Protocols.

Algorithms and dispatch are written against these alone; the shared-memory group
(:class:`~cclctl.runtime.transport.shm.group.ShmGroup`) and the hybrid transport's host
hierarchy satisfy them, and a transport names what it offers in its
:class:`~cclctl.runtime.transport.capabilities.Capabilities`. Another engine (a host-staging
one for device buffers, say) slots in as one more Protocol here and one more capability.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from cclctl.runtime.transport.wait import Wait
from cclctl.runtime.transport.wire import Call

if TYPE_CHECKING:  # the CLI loads capabilities without numpy (tests/core/test_layering.py)
    import numpy as np


class Round(Protocol):
    """One round of a one-copy collective: every rank publishes ``nbytes`` in its slot."""

    @property
    def nbytes(self) -> int: ...


class PeerSlots(Protocol):
    """One rank's slots as this rank reads them."""

    @property
    def rank(self) -> int: ...


class SlotLayout(Protocol):
    @property
    def slot_bytes(self) -> int: ...


class BufferPlan(Protocol):
    """Where a zero-copy call's arrays lie, as its peers find them (the shared-buffer
    registry makes these: ``shared_buffers.plan``)."""

    def pack(self) -> bytes:
        """One packed descriptor per array, in order, as peers read them."""
        ...


class PeerBuffers(Protocol):
    """Peers' shared buffers (``comm.empty()``), mapped from the descriptors they publish."""

    @property
    def descriptor_size(self) -> int:
        """Bytes of one packed descriptor."""
        ...

    def array(
        self, packed: bytes, dtype: np.dtype, peer: int, writable: bool = False
    ) -> np.ndarray: ...


R = TypeVar("R", bound=Round)
V = TypeVar("V", bound=PeerSlots)


class OneCopyEngine(Protocol[R, V]):
    """Ranks that share a host read each other's slots directly: a rank claims a round,
    publishes its input there, and reads, reduces or copies its peers' (one-copy and
    zero-copy collectives). ``R`` and ``V`` are the engine's own round and slot types,
    handed out by it and given back to it."""

    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def local(self) -> int: ...
    @property
    def ranks(self) -> Sequence[int]: ...
    @property
    def views(self) -> Sequence[V]: ...
    @property
    def me(self) -> V: ...
    @property
    def others(self) -> Sequence[V]: ...
    @property
    def layout(self) -> SlotLayout: ...
    @property
    def peer_buffers(self) -> PeerBuffers: ...
    @property
    def sent(self) -> list[int]: ...
    @property
    def received(self) -> list[int]: ...

    def next_round(self, call: Call, wait: Wait, step: int, nbytes: int) -> R: ...
    def claim_round(self, call: Call, wait: Wait, step: int, nbytes: int) -> R: ...
    def publish(self, rnd: R, src: np.ndarray, skip: tuple[int, int] = (0, 0)) -> None: ...
    def publish_bytes(self, rnd: R, payload: bytes) -> None: ...
    def input_array(self, view: V, rnd: R, dtype: np.dtype) -> np.ndarray: ...
    def input_bytes(self, view: V, rnd: R) -> memoryview: ...
    def inputs_read(self, rnd: R, notify: bool = True) -> None: ...
    def await_read(self, view: V, rnd: R) -> None: ...
    def result_array(self, rnd: R, a: int, b: int, dtype: np.dtype) -> np.ndarray: ...
    def publish_result(self, rnd: R) -> None: ...
    def await_result(self, view: V, rnd: R) -> None: ...
    def peer_result(self, view: V, rnd: R, a: int, b: int, dtype: np.dtype) -> np.ndarray: ...
    def results_read(self, rnd: R) -> None: ...
    def account(self, nbytes: int) -> None: ...


#: A one-copy engine as algorithms hold it (its round and slot types are its own business).
OneCopy = OneCopyEngine[Any, Any]


class CrossMemory(Protocol):
    """This rank moves bytes straight between its own memory and a host peer's (the
    kernel's cross-memory attach): single-copy collectives on plain buffers. Addresses are
    the peer's, as it published them in a round of the one-copy engine; a peer that is gone
    or whose memory is not there fails the call, naming it."""

    def read(self, peer: int, remote: int, into: np.ndarray, call: Call) -> None:
        """``into`` = ``into.nbytes`` bytes at ``remote`` in rank ``peer``'s memory."""
        ...

    def write(self, peer: int, remote: int, data: np.ndarray, call: Call) -> None:
        """``data``'s bytes to ``remote`` in rank ``peer``'s memory."""
        ...


class HostHierarchy(Protocol):
    """Which ranks share a host, for collectives that work within hosts, then across."""

    @property
    def group(self) -> OneCopy | None:
        """This rank's host's one-copy engine (None: alone on it)."""
        ...

    @property
    def leaders(self) -> Sequence[int]:
        """The lowest rank of every host, ascending."""
        ...

    @property
    def leader(self) -> int:
        """This rank's host's leader."""
        ...

    @property
    def cross_memory(self) -> CrossMemory | None:
        """This host's cross-memory engine, where its ranks may reach each other's memory."""
        ...
