"""How a live switch moves state: the deployment profile's ``transfer:`` section.

One frozen object carries every option of the switch executor, its state movers and the
backend's side communicator, each with the one default it has; benchmarks build variants with
:func:`dataclasses.replace` (their ``--transfer KEY=VALUE`` flags), nothing reads the environment.
"""

from __future__ import annotations

import dataclasses

from .schema import field, non_negative, positive

MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class TransferConfig:
    """Options of a switch's transfers (paper §4.1, appendix F)."""

    peer_pulls: bool = field(
        "experimental: allocate KV pools in the backend's peer memory, so a switch pulls pages rank to "
        "rank with copies instead of packing them for collectives (off: collectives, the route measured "
        "between GPUs; pulls have run on one GPU and on the host only)", default=False)
    min_run_bytes: int | None = field(
        "pulls only where a layer's pages average at least this many bytes a copy, else collectives "
        "(None: the peer memory's own threshold)", default=None, checks=[lambda v: None if v is None else non_negative(v)])
    pitched_pulls: bool = field(
        "pull runs of every T-th page (as CP holds them) in one pitched copy each (off: only "
        "consecutive pages form a run)", default=True)
    copy_engines: bool = field(
        "let the side communicator gather in memory its backend moves with copy engines where it has "
        "such memory (measured on 2 x H200: overheads into TP 25.7 -> 13.8 ms)", default=True)
    chunk_bytes: int = field("bytes of KV pages per collective before a layer's pages are split",
                             default=128 * MIB, checks=[positive])
    max_chunks: int = field("most collectives per layer's pages", default=4, checks=[positive])
    max_chunks_buffered: int = field(
        "most collectives per layer's pages over the side communicator's transfer buffers (2 x H200: "
        "0.90 / 0.82 of a bare collective in 2 chunks against 0.79 / 0.72 in 1)", default=2, checks=[positive])
    align_transfers: bool = field(
        "a layer's transfer starts once the compute stream reached the layer it overlaps, so every "
        "rank's collectives start together", default=True)
    defer_first: bool = field(
        "the first moving layer computes the switching step in its source layout and moves last, "
        "beside the last layer (off: it moves first, as the paper does)", default=True)
