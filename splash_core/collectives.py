"""Collectives over a torch.distributed process group, for any backend whose group supports
the standard ops. Backends may return this class from ``splash_make_collectives`` or their own.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.distributed as dist


class DistCollectives:
    """:class:`splash_core.interfaces.Collectives` over one ``torch.distributed`` group."""

    def __init__(self, group: Any, device: torch.device):
        self.group = group
        self.device = device
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)

    def all_gather_into(self, out, inp, async_op: bool = False):
        return dist.all_gather_into_tensor(out, inp.contiguous(), group=self.group, async_op=async_op)

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
