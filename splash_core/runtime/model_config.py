"""What one rank's :class:`~splash_core.runtime.model.Model` is built from: the model to build
(:class:`ModelConfig`, the same on every rank and validated once) and the rank it runs on
(:class:`RankOps`: its place in the group and what its backend hands the model)."""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch

from .. import dtypes
from ..dtypes import torch_dtype
from ..layouts import Layout
from ..model import ops
from ..model.kv_format import SCALE_BYTES, ScaledFP8, indexer_layout, kv_format_problem
from ..planning.moe_dispatch import MoEDispatch, dispatch_rule
from ..platform.interfaces import Collectives, FP8LinearKernels, FusedKernels, GraphOps, KDAKernels, StreamOps
from ..profiles.graphs import GraphConfig
from ..profiles.model import LayerKind, ModelProfile
from ..profiles.transfer import TransferConfig
from ..reference.streams import HostStreamOps
from .kv_pool import PageFormat
from .recurrent_pool import RecurrentFormat


def attends_sparsely(deployment) -> bool:
    """Whether ``deployment``'s MLA layers attend over its model's DSA indexer's top-k keys: its
    ``sparse_attention`` (None: whenever the model has an indexer), as the cost model charges."""
    has_indexer = deployment.model.indexer is not None
    return has_indexer if deployment.sparse_attention is None else bool(deployment.sparse_attention and has_indexer)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The model one rank builds: ``profile``'s first ``num_layers`` layers (None: all), each in
    ``layouts`` (one for every layer, or one per layer), with ``pages_per_layer`` KV pages of
    ``page_size`` tokens per MLA layer, computing in ``dtype``.

    ``kv_dtype``: the element format the KV pool stores (None: ``dtype``); ``kv_scales`` > 0: the
    pool stores the scaled-fp8 format instead (:mod:`~splash_core.model.kv_format`), an fp8 latent
    with that many float32 scales per token and a bf16 rotary key. ``graphs``: how decode steps
    replay captured graphs (None, or mode ``off``: never; mode ``auto`` needs the backend's graph
    ops; models with KDA layers always run eagerly). ``attention_form``: how prefill rows attend
    (:mod:`splash_core.planning.attention_forms`; DOP layers always attend absorbed: their owners
    hold no one else's kv_b heads). ``sparse_attention``: MLA layers attend over the DSA indexer's
    top-k keys (needs a profile with an indexer; decode steps then run eagerly, never from graphs).
    ``fp8_ffn``: the feed-forward weights (routed and shared experts, dense MLPs) stay FP8
    block-scaled as the checkpoint stores them, dequantized at each use (needs an FP8 block-scaled
    checkpoint; the model's outputs are unchanged); False: dequantized to ``dtype`` at load.
    ``fp8_attention``: likewise the MLA layers' head-indexed projections (Q-B, KV-B, O; a switch
    moves them FP8 with their scales: :class:`~splash_core.model.mla.MLAWeights`). ``moe_dispatch``: in
    which steps MoE layers dispatch their owners' rows by all-to-all (:mod:`~splash_core.planning.moe_dispatch`;
    every rank then holds the shared experts whole)."""

    profile: ModelProfile
    layouts: Layout | Sequence[Layout]
    pages_per_layer: int
    page_size: int
    dtype: torch.dtype = torch.float32
    kv_dtype: torch.dtype | None = None
    kv_scales: int = 0
    num_layers: int | None = None
    graphs: GraphConfig | None = None
    attention_form: str = "auto"
    sparse_attention: bool = False
    fp8_ffn: bool = False
    fp8_attention: bool = False
    moe_dispatch: MoEDispatch = MoEDispatch()

    def __post_init__(self):
        if self.sparse_attention and self.profile.indexer is None:
            raise ValueError(f"sparse attention needs a DSA indexer; model {self.profile.name!r} has none")
        count = self.layer_count
        layouts = [self.layouts] * count if isinstance(self.layouts, Layout) else list(self.layouts)
        if len(layouts) != count:
            raise ValueError(f"{len(layouts)} layouts given for {count} layers")
        object.__setattr__(self, "layouts", tuple(layouts))
        if self.kv_scales and self.mla_layers and self.kv_dtype not in (None, torch.float8_e4m3fn):
            raise ValueError(f"a scaled KV cache stores an fp8 latent (got kv_dtype {self.kv_dtype})")

    @classmethod
    def of(cls, deployment, *, pages_per_layer: int, layouts=None) -> "ModelConfig":
        """A deployment's model: its profile, page size, compute format, layer count, initial
        layout (unless ``layouts`` is given), decode graphs, prefill attention, sparse attention
        (:func:`attends_sparsely`), the feed-forward weights' format and MoE dispatch; the KV pool stores the
        model's cache format (one the runtime can store: :func:`~splash_core.model.kv_format.kv_format_problem`)."""
        kv = deployment.model.kv_cache
        problem = kv_format_problem(deployment.model)
        if problem:
            raise ValueError(f"model {deployment.model.name!r}: model.kv_cache: {problem}")
        return cls(deployment.model, deployment.initial_layout if layouts is None else layouts,
                   pages_per_layer=pages_per_layer, page_size=deployment.page_size,
                   dtype=torch_dtype(deployment.compute_dtype), kv_dtype=torch_dtype(kv.latent_dtype),
                   kv_scales=kv.scale_bytes // SCALE_BYTES, num_layers=deployment.layers, graphs=deployment.graphs,
                   attention_form=deployment.prefill_attention, sparse_attention=attends_sparsely(deployment),
                   fp8_ffn=deployment.ffn_weights == "fp8", fp8_attention=deployment.attention_weights == "fp8",
                   moe_dispatch=dispatch_rule(deployment.moe_dispatch, deployment.model, deployment.hardware,
                                             deployment.T, dtypes.nbytes(deployment.compute_dtype)))

    @property
    def layer_count(self) -> int:
        return self.profile.num_layers if self.num_layers is None else self.num_layers

    @property
    def kinds(self) -> tuple[LayerKind, ...]:
        return self.profile.layer_kinds[: self.layer_count]

    @property
    def mla_layers(self) -> list[int]:
        return [i for i, k in enumerate(self.kinds) if k is LayerKind.MLA]

    @property
    def kda_layers(self) -> list[int]:
        return [i for i, k in enumerate(self.kinds) if k is LayerKind.KDA]

    def page_format(self) -> PageFormat:
        """The KV pool's page format: the latent and rotary key in ``kv_dtype`` per token, or the
        scaled-fp8 entry, plus the indexer keys where the model has an indexer."""
        indexer = _indexer_format(self.profile)
        if not self.mla_layers:
            return PageFormat(self.page_size, 0, self.kv_dtype or self.dtype, **indexer)
        p = self.profile.mla
        if self.kv_scales:
            layout = ScaledFP8(p.kv_lora_rank, p.qk_rope_head_dim, self.kv_scales)
            problem = layout.problem()
            if problem:
                raise ValueError(f"model {self.profile.name!r}: {self.kv_scales} KV scales per token: {problem}")
            return PageFormat.scaled_fp8(self.page_size, layout, **indexer)
        return PageFormat(self.page_size, p.kv_lora_rank + p.qk_rope_head_dim, self.kv_dtype or self.dtype, **indexer)

    def recurrent_format(self) -> RecurrentFormat:
        k = self.profile.kda
        if k is None:
            return RecurrentFormat(0, 0, 0, 0, torch.float32)
        return RecurrentFormat(k.heads, k.head_dim, k.head_dim, k.conv_size - 1, torch_dtype(k.state_dtype))


@dataclasses.dataclass(frozen=True)
class RankOps:
    """One rank's place in the group (``rank`` of ``T``, on ``device``) and what its backend hands
    the model: ``collectives`` and MLA ``kernels``; ``fused`` small ops (default: the torch
    reference); ``kda_kernels`` (needed by a model with KDA layers); ``host_collectives``, on host
    memory, for what the ranks agree on before a step (whether every pool has room), so that never
    waits for the device (None: ``collectives``, a round trip to the device when a batch opens a
    page); ``peer_memory`` to allocate the KV pool from, so switches pull pages rank to rank (None:
    pages move by collectives); ``graph_ops`` to capture and replay decode graphs; ``streams`` and
    events (default: host ones); ``fp8_kernels`` to multiply feed-forward and attention weights kept
    FP8 (None: dequantized at each use)."""

    rank: int
    T: int
    device: Any
    collectives: Collectives
    kernels: Any
    fused: FusedKernels = ops.KERNELS
    kda_kernels: KDAKernels | None = None
    host_collectives: Collectives | None = None
    peer_memory: Any = None
    graph_ops: GraphOps | None = None
    streams: StreamOps = dataclasses.field(default_factory=HostStreamOps)
    fp8_kernels: FP8LinearKernels | None = None

    @classmethod
    def of(cls, ctx, config: ModelConfig, transfer: TransferConfig = TransferConfig()) -> "RankOps":
        """A :class:`~splash_core.runtime.group.RankContext`'s rank with its backend's MLA (and, for
        a model with KDA layers, KDA) kernels and fused ops, its KV pool in peer memory where
        ``transfer.peer_pulls`` asks for pulls, and graph ops where ``config`` has decode graphs."""
        backend, device, dtype = ctx.backend, ctx.device, config.dtype
        return cls(ctx.rank, ctx.world_size, device, ctx.collectives, backend.mla_kernels(device, dtype),
                   fused=backend.fused_kernels(device, dtype),
                   kda_kernels=backend.kda_kernels(device, dtype) if config.kda_layers else None,
                   host_collectives=ctx.host_collectives(),
                   peer_memory=ctx.peer_memory() if transfer.peer_pulls else None,
                   graph_ops=backend.graph_ops(device) if config.graphs is not None else None, streams=ctx.streams,
                   fp8_kernels=(fp8_kernels_for(backend, device, dtype) if config.fp8_ffn or config.fp8_attention
                                else None))


def fp8_kernels_for(backend, device, dtype: torch.dtype):
    """The backend's W8A8 GEMMs, except for float32 runs: those are the exact ones (checked token for
    token), and quantizing their activations would round them, so they dequantize each weight instead."""
    return None if dtype == torch.float32 else backend.fp8_linear_kernels(device, dtype)


def _indexer_format(profile: ModelProfile) -> dict:
    """The indexer keys' fields of the page format: the profile's element format, or with scales
    the scaled-fp8 layout of one head_dim key (so the pool stores the bytes Eq 1 counts)."""
    idx = profile.indexer
    if idx is None:
        return dict(indexer_width=0, indexer_dtype=torch.float32)
    layout = indexer_layout(profile)
    if layout is None:
        return dict(indexer_width=idx.head_dim, indexer_dtype=torch_dtype(idx.dtype))
    return dict(indexer_width=layout.token_bytes, indexer_dtype=torch.uint8, indexer_scaled=layout)
