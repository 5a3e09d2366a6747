"""Collectives of the simulated device: torch.distributed over gloo, counting what they move.

A vendor's backend puts its own collective library where :class:`DistCollectives` (the
core's torch.distributed collectives) is the base here; the counts show what SPLASH asks of
that library, collective kind by kind, in the units of the hardware profile's bandwidths
(the bytes a rank receives from its peers; for all-reduce and broadcast, the tensor's bytes).
Object collectives carry small metadata and are not counted.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import torch

from splash_core.platform.collectives import DistCollectives, TransferBuffers


class CountingCollectives(DistCollectives):
    """:class:`splash_core.platform.interfaces.Collectives` over gloo that keep ``calls`` and ``bytes``
    (Counters by collective kind) for this rank."""

    def __init__(self, group, device: torch.device, *, transfer_buffers: TransferBuffers | None = None):
        super().__init__(group, device, transfer_buffers=transfer_buffers)
        self.calls: Counter = Counter()
        self.bytes: Counter = Counter()

    def _count(self, kind: str, nbytes: int) -> None:
        self.calls[kind] += 1
        self.bytes[kind] += nbytes

    def all_gather_into(self, out, inp, async_op: bool = False):
        self._count("all_gather", (out.numel() - inp.numel()) * out.element_size())
        return super().all_gather_into(out, inp, async_op)

    def all_to_all(self, out, inp, out_splits: Sequence[int], in_splits: Sequence[int], async_op: bool = False):
        row_bytes = out[0].numel() * out.element_size() if out.shape[0] else 0
        self._count("all_to_all", (sum(out_splits) - out_splits[self.rank]) * row_bytes)
        return super().all_to_all(out, inp, out_splits, in_splits, async_op)

    def all_reduce(self, tensor, async_op: bool = False):
        self._count("all_reduce", tensor.numel() * tensor.element_size())
        return super().all_reduce(tensor, async_op)

    def broadcast(self, tensor, src: int, async_op: bool = False):
        self._count("broadcast", tensor.numel() * tensor.element_size())
        return super().broadcast(tensor, src, async_op)
