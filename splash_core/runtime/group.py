"""A rank of the group: process group, device, collectives and streams from the backend.

Created by torchrun (``from_env``) or by :mod:`splash_core.runtime.spawn`. The group's
collectives time out after ``timeout_s``, so a crashed or hung peer becomes an error on every
other rank instead of a hang.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import Any

import torch
import torch.distributed as dist

from ..platform.backend import Backend, get_backend
from ..platform.collectives import DistCollectives
from ..platform.interfaces import Collectives, PeerMemory, StreamOps
from ..profiles.transfer import TransferConfig


@dataclasses.dataclass
class RankContext:
    """Everything one rank needs to take part in the group."""

    rank: int
    world_size: int
    local_rank: int
    backend: Backend
    device: Any
    group: Any
    collectives: Collectives
    streams: StreamOps
    timeout_s: float
    _side: Collectives | None = None
    _host: Collectives | None = None

    def side_collectives(self, transfer: TransferConfig = TransferConfig()) -> Collectives:
        """A second communicator over the same ranks, for transfers that overlap compute, made
        by the backend as ``transfer`` asks (its first caller's options hold for the rank).

        Created collectively on first use: every rank must call it at the same point."""
        if self._side is None:
            options = self.backend.side_group_options(transfer)
            group = dist.new_group(
                list(range(self.world_size)),
                backend=self.backend.process_group_backend(),
                timeout=datetime.timedelta(seconds=self.timeout_s),
                **({"pg_options": options} if options is not None else {}),
            )
            self._side = self.backend.collectives(group, self.device, side=True, transfer=transfer)
        return self._side

    def peer_memory(self) -> PeerMemory | None:
        """The backend's peer memory, for KV pools that switches pull pages out of rank to rank
        (:class:`~splash_core.platform.interfaces.PeerMemory`); None for a single rank or where the
        backend has none. Callers ask only where ``transfer.peer_pulls`` is on. Every rank must
        call it at the same point (the first call makes the host collectives)."""
        if self.world_size == 1:
            return None
        return self.backend.peer_memory(self.host_collectives(), self.device)

    def host_collectives(self) -> Collectives:
        """Collectives over the same ranks on host memory, for the small numbers a switch agrees
        on before anything moves (page needs, page addresses): they never wait for the device,
        so a switch's checks do not drain its queue. The main collectives where those already
        run on the host; otherwise a gloo group, created collectively on first use."""
        if self._host is None:
            if getattr(self.device, "type", "cpu") == "cpu":
                self._host = self.collectives
            else:
                group = dist.new_group(list(range(self.world_size)), backend="gloo",
                                       timeout=datetime.timedelta(seconds=self.timeout_s))
                self._host = DistCollectives(group, torch.device("cpu"))
        return self._host


def init_rank(
    rank: int,
    world_size: int,
    *,
    backend: str | Backend = "auto",
    init_method: str | None = None,
    local_rank: int | None = None,
    timeout_s: float = 300.0,
) -> RankContext:
    """Join (or create) the default process group through the selected backend."""
    be = backend if isinstance(backend, Backend) else get_backend(backend)
    local_rank = rank if local_rank is None else local_rank
    device = be.device(local_rank)
    pg_backend = be.process_group_backend()
    kwargs = dict(rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
    if init_method:
        kwargs["init_method"] = init_method
    if getattr(device, "type", "cpu") != "cpu":
        kwargs["device_id"] = device  # eager init: communicators bound to this rank's device
    dist.init_process_group(backend=pg_backend, **kwargs)
    group = dist.group.WORLD
    return RankContext(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        backend=be,
        device=device,
        group=group,
        collectives=be.collectives(group, device),
        streams=be.stream_ops(device),
        timeout_s=timeout_s,
    )


def from_env(backend: str = "auto", timeout_s: float = 300.0) -> RankContext:
    """Join the group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT)."""
    return init_rank(
        int(os.environ["RANK"]),
        int(os.environ["WORLD_SIZE"]),
        backend=backend,
        local_rank=int(os.environ.get("LOCAL_RANK", os.environ["RANK"])),
        timeout_s=timeout_s,
        init_method="env://",
    )


def shutdown(ctx: RankContext | None = None) -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
