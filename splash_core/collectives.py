"""Collectives over a torch.distributed process group, for any backend whose group supports
the standard ops. Backends may return this class from ``splash_make_collectives`` or their own.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Sequence

import torch
import torch.distributed as dist


class DistCollectives:
    """:class:`splash_core.interfaces.Collectives` over one ``torch.distributed`` group.

    ``transfer_memory``/``register``: a side communicator's buffer memory (a context in which
    the movers allocate their send and receive buffers) and how to register such a buffer with
    the group before an all-gather (e.g. symmetric memory, so NCCL's zero-CTA policy moves it
    with copy engines). None: plain allocations, nothing registered."""

    def __init__(self, group: Any, device: torch.device, *,
                 transfer_memory: Callable[[], ContextManager] | None = None,
                 register: Callable[[torch.Tensor], None] | None = None):
        self.group = group
        self.device = device
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self._memory, self._register = transfer_memory, register

    def transfer_memory(self) -> ContextManager:
        """Context for allocating transfer buffers (see the class docstring)."""
        return self._memory() if self._memory is not None else contextlib.nullcontext()

    def all_gather_into(self, out, inp, async_op: bool = False):
        inp = inp.contiguous()
        if self._register is not None:
            self._register(out)
            if inp.untyped_storage().data_ptr() != out.untyped_storage().data_ptr():  # not in place
                self._register(inp)
        return dist.all_gather_into_tensor(out, inp, group=self.group, async_op=async_op)

    def all_to_all(self, out, inp, out_splits: Sequence[int], in_splits: Sequence[int], async_op: bool = False):
        return dist.all_to_all_single(
            out, inp.contiguous(), list(map(int, out_splits)), list(map(int, in_splits)),
            group=self.group, async_op=async_op,
        )

    def all_reduce(self, tensor, async_op: bool = False):
        return dist.all_reduce(tensor, group=self.group, async_op=async_op)

    def broadcast(self, tensor, src: int, async_op: bool = False):
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
