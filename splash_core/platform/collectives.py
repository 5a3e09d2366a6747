"""Collectives over a torch.distributed process group, for any backend whose group supports
the standard ops. Backends may return this class from ``splash_make_collectives`` or their own.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

_ROUND_BYTES = 16 << 20  # buffers grow in these steps, so chunks of slightly different sizes share one


class TransferBuffers:
    """Buffers a side communicator moves without processors (e.g. memory registered with it,
    which a collective library may move with copy engines), one per role (what a mover uses it
    for), reused layer after layer and switch after switch: they are the one layer in transit
    that Eq 5's headroom holds room for, and registering them is too slow to repeat per switch.
    :meth:`release` gives them back.

    ``allocate(nbytes)`` makes a uint8 buffer; it may be a collective (registration is), so every
    rank must ask for the same roles with the same sizes in the same order: all-gathers do.
    A buffer outgrown mid-switch is kept until :meth:`release`, since work in flight may still
    use it."""

    def __init__(self, allocate: Callable[[int], torch.Tensor]):
        self._allocate = allocate
        self._held: dict[Any, torch.Tensor] = {}
        self._outgrown: list[torch.Tensor] = []

    def get(self, role: Any, nbytes: int) -> torch.Tensor:
        """The first ``nbytes`` of role ``role``'s buffer (uint8)."""
        buf = self._held.get(role)
        if buf is None or buf.numel() < nbytes:
            if buf is not None:
                self._outgrown.append(buf)
            buf = self._held[role] = self._allocate(-(-max(nbytes, 1) // _ROUND_BYTES) * _ROUND_BYTES)
        return buf[:nbytes]

    def release(self) -> None:
        """Drop every buffer (only while no transfer is in flight)."""
        self._held.clear()
        self._outgrown.clear()

    @property
    def nbytes(self) -> int:
        return sum(b.numel() for b in (*self._held.values(), *self._outgrown))


class _Done:
    """The handle of a collective that completed when called (one rank: nothing to wait for)."""

    def wait(self) -> bool:
        return True


def _done(async_op: bool):
    return _Done() if async_op else None


class DistCollectives:
    """:class:`splash_core.platform.interfaces.Collectives` over one ``torch.distributed`` group; with
    ``transfer_buffers``, a side communicator's buffers for all-gathers that run without
    processors. A group of one rank moves nothing: its tensor collectives are local copies (or
    nothing), so a one-device step launches no communication kernel at all (and a captured one
    records none)."""

    def __init__(self, group: Any, device: torch.device, *, transfer_buffers: TransferBuffers | None = None):
        self.group = group
        self.device = device
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.transfer_buffers = transfer_buffers  # None: all-gathers use ordinary memory

    def all_gather_into(self, out, inp, async_op: bool = False):
        if self.size == 1:
            if inp.data_ptr() != out.data_ptr():  # gathered in place, it is there already
                out.copy_(inp.reshape(out.shape))
            return _done(async_op)
        return dist.all_gather_into_tensor(out, inp.contiguous(), group=self.group, async_op=async_op)

    def all_to_all(self, out, inp, out_splits: Sequence[int], in_splits: Sequence[int], async_op: bool = False):
        if self.size == 1:
            out.copy_(inp.reshape(out.shape))
            return _done(async_op)
        return dist.all_to_all_single(
            out, inp.contiguous(), list(map(int, out_splits)), list(map(int, in_splits)),
            group=self.group, async_op=async_op,
        )

    def all_reduce(self, tensor, async_op: bool = False):
        if self.size == 1:
            return _done(async_op)
        return dist.all_reduce(tensor, group=self.group, async_op=async_op)

    def broadcast(self, tensor, src: int, async_op: bool = False):
        if self.size == 1:
            return _done(async_op)
        return dist.broadcast(tensor, src=dist.get_global_rank(self.group, src), group=self.group,
                              async_op=async_op)

    def all_gather_object(self, obj: Any) -> list:
        out: list = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, src), group=self.group)
        return box[0]

    def barrier(self) -> None:
        dist.barrier(group=self.group)
