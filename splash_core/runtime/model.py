"""The runtime's model on one rank: embedding, L blocks of attention (MLA or KDA, as the
profile's layer kinds say) + a dense MLP or routed experts, LM head.

Data flow of :meth:`Model.step` (docs/design.md §3): the residual stream of all rows of the step is
the same on every rank between blocks. Each attention layer computes in its own layout (see
:mod:`~splash_core.runtime.mla_layer` and :mod:`~splash_core.runtime.kda_layer`) and returns all
rows; the feed-forward part keeps one parallelism whatever the attention layout
(:mod:`~splash_core.runtime.feed_forward`: tensor-parallel dense MLP, expert-parallel MoE, one
all-reduce each), so DP/DOP/CP rows are gathered to every rank before it and each owner selects
its rows again at the next attention layer, as DP-attention engines do (or, in the steps
:mod:`~splash_core.planning.moe_dispatch` picks, owners run a MoE block on their rows, then gather).

Logits are those of each request's last row (then those of the rows :meth:`Model.scoring` names,
for prompt logprobs), vocabulary-parallel (each rank computes
ceil(V/T) rows of the LM head) and all-gathered, so logits and greedy tokens are identical on
every rank.

Pages for a step's new tokens are reserved in every layer before any computation: when the
step opens a page anywhere (a property of the batch every rank knows), the ranks all-reduce
their shortfalls and, if any rank lacks pages in any layer, all raise
:class:`~splash_core.runtime.page_keys.PoolFullError` with nothing allocated or written.

A block's residual add and the next norm are one fused op, and so are RoPE and the cache write
(the backend's :class:`~splash_core.platform.interfaces.FusedKernels`; the torch reference by default).
With decode graphs (``graphs``, a :class:`~splash_core.profiles.graphs.GraphConfig`), a pure
decode step runs from persistent buffers and replays a captured graph of its layouts and batch
bucket (:mod:`~splash_core.runtime.decode_graphs`); prefill, mixed and switching steps run eagerly.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..checkpoint.source import weight_source
from ..layouts import Layout, Placement
from ..model.dsa import IndexerWeights
from ..model.dsa_slots import NAN_SCORES
from ..model.kda import KDAMath, KDAWeights
from ..model.mla import MLAMath, MLAWeights
from ..model.weights import WeightSource, even_shard, head_shard, layer_prefix, tensor_shapes
from ..platform.device import to_device
from ..profiles.graphs import decode_capturable
from ..profiles.model import LayerKind, ModelProfile
from ..profiles.transfer import TransferConfig
from . import exchange
from .decode_graphs import DecodeGraphs, DecodeOutputs
from .feed_forward import DenseMLP, MoE, load_feed_forward
from .kda_layer import KDALayer
from .kv_pool import KVPool, held_pages
from .mla_layer import MLALayer
from .model_config import ModelConfig, RankOps
from .page_keys import PageKeys, PoolFullError
from .recurrent_pool import RecurrentPool
from .step_batch import StepBatch
from .step_context import StepContext
from .step_tokens import StepTokens


class Model:
    """One rank's part of the model: ``config`` says what to build (the same on every rank),
    ``ops`` the rank it runs on, ``source`` where the weights come from."""

    def __init__(self, config: ModelConfig, ops: RankOps, source: WeightSource):
        if config.kda_layers and ops.kda_kernels is None:
            raise ValueError(f"model {config.profile.name!r} has KDA layers: pass kda_kernels "
                             "(the backend's splash_kda_kernels)")
        profile = config.profile
        self.config, self.profile, self.dtype, self.page_size = config, profile, config.dtype, config.page_size
        self.rank, self.T, self.device = ops.rank, ops.T, ops.device
        self.collectives, self.kernels, self.host_collectives = ops.collectives, ops.kernels, ops.host_collectives
        self.fused, self.streams = ops.fused, ops.streams
        self.math = (MLAMath(profile, self.fused, config.attention_form,
                             ops.fp8_kernels if config.fp8_attention else None) if config.mla_layers else None)
        self.pool = KVPool(config.mla_layers, config.pages_per_layer, config.page_format(), ops.device,
                           memory=ops.peer_memory,
                           keyless=[i for i in config.mla_layers if not profile.stores_indexer_keys(i)])
        self.recurrent = RecurrentPool(config.kda_layers, config.recurrent_format(), ops.device)
        weights = _Weights(source, tensor_shapes(profile, config.layer_count), ops.device, config.dtype)
        self.embed = weights.get("model.embed_tokens.weight")
        self.layers: list[MLALayer | KDALayer] = []
        self.norms: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.mlps: list[DenseMLP | MoE | None] = []  # never move in a switch
        kda_math = KDAMath(profile) if config.kda_layers else None
        for i, layout in enumerate(config.layouts):
            self.layers.append(self._attention_layer(i, layout, weights, kda_math, ops.kda_kernels))
            p = layer_prefix(i)
            self.norms.append((weights.get(f"{p}.input_layernorm.weight"),
                               weights.get(f"{p}.post_attention_layernorm.weight")))
            self.mlps.append(load_feed_forward(source, profile, i, self.rank, self.T, device=ops.device,
                                               dtype=config.dtype, silu_mul=self.fused.silu_mul, fp8=config.fp8_ffn,
                                               fp8_kernels=ops.fp8_kernels,
                                               shared_whole=config.moe_dispatch.shared_whole))
        self.final_norm = weights.get("model.norm.weight")
        self.vocab_per_rank = -(-profile.vocab_size // self.T)
        vocab = even_shard(profile.vocab_size, self.rank, self.T)
        head = weights.get("lm_head.weight", rows=slice(vocab.start, vocab.stop))
        self.lm_head = torch.cat([head, head.new_zeros(self.vocab_per_rank - head.shape[0], head.shape[1])])
        self.scored_rows: np.ndarray | None = None  # rows of the next steps whose logits follow the last rows'
        self.graphs: DecodeGraphs | None = None
        graphs = config.graphs
        eager = not decode_capturable(kda=bool(config.kda_layers))  # as costed
        if graphs is not None and config.mla_layers and not eager and graphs.mode != "off" and \
                (graphs.mode == "static" or ops.graph_ops is not None):
            self.graphs = DecodeGraphs(self, graphs, ops.graph_ops)

    def _attention_layer(self, i: int, layout: Layout, weights: "_Weights", kda_math, kda_kernels):
        """Layer ``i``'s attention in ``layout``: its heads' shard of the projections where the layout
        shards them, all of them where it replicates them."""
        profile, rank, T = self.profile, self.rank, self.T
        sharded = layout.placement is Placement.SHARDED
        kw = dict(device=weights.device, dtype=weights.dtype)
        if self.config.kinds[i] is LayerKind.KDA:
            heads = head_shard(profile.kda.heads, rank, T) if sharded else None
            return KDALayer(i, layout, KDAWeights.load(weights.source, profile, i, heads, **kw), self.recurrent[i],
                            kda_math, kda_kernels, rank, T)
        heads = head_shard(profile.mla.heads, rank, T) if sharded else None
        sparse = self.config.sparse_attention
        selects = sparse and profile.indexer.selects(i)  # else a shared-indexer layer (GLM-5) reuses the last top-k
        indexer = IndexerWeights.load(weights.source, profile, i, **kw) if selects else None
        attention = MLAWeights.load(weights.source, profile, i, heads, fp8=self.config.fp8_attention, **kw)
        return MLALayer(i, layout, attention, self.pool[i], self.math,
                        rank, T, indexer, profile.indexer.topk if sparse else 0,
                        shares_selection=sparse and not selects)

    @classmethod
    def from_context(cls, ctx, profile: ModelProfile, source: WeightSource, layouts, *,
                     transfer: TransferConfig = TransferConfig(), **config) -> "Model":
        """Build on a :class:`~splash_core.runtime.group.RankContext` (its backend's kernels, fused
        ops and graph ops; the KV pool in its peer memory where ``transfer.peer_pulls`` asks for
        pulls): ``config`` are the other fields of :class:`ModelConfig`."""
        model = ModelConfig(profile, layouts, **config)
        return cls(model, RankOps.of(ctx, model, transfer), source)

    @classmethod
    def from_deployment(cls, ctx, deployment, *, pages_per_layer: int, source: WeightSource | None = None,
                        layouts=None) -> "Model":
        """Build from a deployment profile (:meth:`ModelConfig.of`): weights from the model's
        checkpoint folder, else drawn from the deployment's seed (unless ``source`` is given), the
        initial layout (unless ``layouts`` is given), its transfer options and decode graphs."""
        config = ModelConfig.of(deployment, pages_per_layer=pages_per_layer, layouts=layouts)
        if ctx.world_size != deployment.T:
            raise ValueError(f"deployment {deployment.name!r} is for T = {deployment.T}, the group has {ctx.world_size} ranks")
        return cls(config, RankOps.of(ctx, config, deployment.transfer),
                   source or weight_source(deployment.model, deployment.seed, deployment.keeps_fp8))

    # ---- one step -------------------------------------------------------------------------

    @contextlib.contextmanager
    def scoring(self, rows: np.ndarray | None):
        """Inside, a step's logits are followed by those of its ``rows`` (indices into its rows, in
        batch order; None or empty: none), as every step path (a switch's, a pre-copy's) calls
        :meth:`step`. A step with such rows runs eagerly: they are prompt rows, never a decode step's."""
        self.scored_rows = rows if rows is not None and len(rows) else None
        try:
            yield
        finally:
            self.scored_rows = None

    def step(self, batch: StepBatch, tokens: torch.Tensor, *, layouts: Sequence[Layout] | None = None,
             before_layer: Callable[[int], None] | None = None) -> torch.Tensor:
        """Run ``tokens`` [N] (rows in batch order) through the model; logits [R, V] float32 of each
        request's last row, in batch request order, identical on every rank (inside :meth:`scoring`,
        [R + E, V]: then those of its E rows).

        Two keywords serve live switching (:mod:`splash_core.runtime.switch`): ``layouts`` (one per
        layer) are the layouts the layers compute in by the time they run, so the step's new pages
        are reserved in those instead of the layers' current layouts; ``before_layer(i)`` is called
        before layer i computes (the executor lands layer i's state there and starts the next
        layer's transfer). Without them a step is exactly as before, and a decode step replays its
        captured graph where the model has decode graphs."""
        replayed = self._begin(batch, tokens, layouts, before_layer)
        if replayed is not None:
            logits, failed = replayed.logits(), replayed.failed()
        else:
            logits, nan_scores = self._eager(batch, tokens, before_layer)
            failed = torch.stack(nan_scores).any() if nan_scores else None
        if failed is not None and bool(failed):  # one wait a step, only where indexers scored
            raise ValueError(NAN_SCORES)
        return logits

    def step_tokens(self, batch: StepBatch, tokens: torch.Tensor, pick=None, report=None) -> StepTokens:
        """:meth:`step`, plus each request's next token chosen on the device and copied to pinned
        host memory behind an event: the host reads them (:meth:`StepTokens.host`) once the
        device got there, without draining anything else, and ``tokens`` may be the previous
        step's device tokens (they never visit the host). The token is the greedy one (chosen
        inside the captured graph where the step replays one), or ``pick(greedy, logits)``'s
        [R] device tensor where given (the engine's sampled rows). ``report(tokens, logits)``, where
        given, is a device tensor copied to the host with the tokens (rank 0's logprobs); its
        ``logits`` are [R + E, V] inside :meth:`scoring`, :meth:`StepTokens.logits` [R, V] always."""
        replayed = self._begin(batch, tokens, None, None)
        if replayed is not None:
            greedy, logits, every = replayed.tokens(), replayed.logits, replayed.logits
            failed = replayed.failed()
        else:
            out, nan_scores = self._eager(batch, tokens)
            last = out[: len(batch)]
            greedy, logits, every = last.argmax(dim=-1), (lambda: last), (lambda: out)
            failed = torch.stack(nan_scores).any() if nan_scores else None
        chosen = greedy if pick is None else pick(greedy, logits())
        extra = None if report is None else report(chosen, every())
        return StepTokens.start(chosen, logits, self.streams, extra, failed, NAN_SCORES)

    def _begin(self, batch: StepBatch, tokens: torch.Tensor, layouts, before_layer) -> DecodeOutputs | None:
        """Check the batch and reserve its pages; replay it where it is a decode step the graphs take."""
        if batch.page_size != self.page_size or batch.T != self.T:
            raise ValueError(f"batch for T={batch.T}, page {batch.page_size}; model has T={self.T}, page {self.page_size}")
        if tokens.numel() != batch.num_rows:
            raise ValueError(f"{tokens.numel()} tokens for a batch of {batch.num_rows} rows")
        self.reserve(batch, layouts)
        if self.graphs is None or layouts is not None or before_layer is not None or self.scored_rows is not None:
            return None
        return self.graphs.run(batch, tokens)

    def _eager(self, batch: StepBatch, tokens: torch.Tensor, before_layer=None) -> tuple[torch.Tensor, list]:
        """(logits, the step's NaN-score flags, unread: :attr:`StepContext.nan_scores`)."""
        step = StepContext(batch, self.rank, self.device, self.collectives, self.kernels)
        if self.scored_rows is not None:  # the rows whose logits are wanted (a cached property, set here)
            step.last_rows = to_device(np.concatenate([batch.last_rows, self.scored_rows]), self.device, torch.int64)
        return self.forward(step, tokens.to(self.device).long(), before_layer), step.nan_scores

    def forward(self, step: StepContext, tokens: torch.Tensor, before_layer=None) -> torch.Tensor:
        """Logits [R, V] float32 of ``step``'s rows of tokens ``tokens`` [N] (device int64): of each
        request's last row, or of every row where ``step.last_rows`` is None. Device work only,
        given a step context that makes none on the host (what a captured graph records)."""
        eps, fused = self.profile.rms_norm_eps, self.fused
        h = self.embed.index_select(0, tokens)
        normed = fused.add_rms_norm(h, None, self.norms[0][0], eps)[0] if self.layers else None
        for i, (layer, (_, post_norm), mlp) in enumerate(zip(self.layers, self.norms, self.mlps)):
            if before_layer is not None:
                before_layer(i)
            if self._dispatches(layer, mlp, step):
                h = self._owned_block(layer, mlp, normed, h, post_norm, step)
                if i + 1 < len(self.layers):
                    normed = fused.add_rms_norm(h, None, self.norms[i + 1][0], eps)[0]
                continue
            out = layer.forward(normed, step)
            if mlp is not None:
                x, h = fused.add_rms_norm(out, h, post_norm, eps)
                out = mlp.forward(x, self.collectives, step.host_reads)
            if i + 1 < len(self.layers):  # this block's residual add and the next block's norm
                normed, h = fused.add_rms_norm(out, h, self.norms[i + 1][0], eps)
            else:
                h = h + out
        if step.last_rows is not None:
            h = h.index_select(0, step.last_rows)
        last, _ = fused.add_rms_norm(h, None, self.final_norm, eps)
        local = last @ self.lm_head.t()  # [R, ceil(V/T)]
        out = local.new_empty(self.T * local.shape[0], local.shape[1])
        self.collectives.all_gather_into(out, local.contiguous())
        logits = out.view(self.T, -1, local.shape[1]).transpose(0, 1).reshape(local.shape[0], -1)
        return logits[:, : self.profile.vocab_size].float()

    def _dispatches(self, layer, mlp, step: StepContext) -> bool:
        """Whether this step's MoE layer after ``layer`` takes the all-to-all path (the same on every rank)."""
        return (isinstance(mlp, MoE) and isinstance(layer, MLALayer) and step.host_reads
                and self.config.moe_dispatch.by_all_to_all(layer.layout, step.batch.num_rows))

    def _owned_block(self, layer: MLALayer, mlp: MoE, normed, h, post_norm, step: StepContext) -> torch.Tensor:
        """The residual stream after this block on every rank, each row computed by its owner (attention
        left there, the MoE by all-to-all), then gathered, as DP and CP gather attention's output."""
        x, own = self.fused.add_rms_norm(layer.forward(normed, step, owned=True), h[step.own_rows], post_norm,
                                         self.profile.rms_norm_eps)
        return exchange.gather_rows(step, own + mlp.forward_owned(x, self.collectives))

    # ---- pages ----------------------------------------------------------------------------

    def new_pages(self, batch: StepBatch, layouts: Sequence[Layout] | None = None):
        """{layer: [(request id, logical pages this rank must add)]} for the step's new tokens, placed
        by ``layouts`` (one per layer of the model; default: each layer's current layout)."""
        first, end = batch.new_pages()
        placed = {layer.index: layer.layout for layer in self.layers} if layouts is None else \
            {layer.index: Layout(l) for layer, l in zip(self.layers, layouts)}
        opening = np.flatnonzero(end > first)
        by_layout: dict[Layout, list] = {}  # layers of one layout place the new pages alike
        out = {}
        for layer in self.paged_layers:
            layout = placed[layer.index]
            if layout not in by_layout:
                by_layout[layout] = [
                    (int(batch.ids[i]), held_pages(layout, int(batch.ids[i]), int(batch.owners[i]),
                                                   np.arange(first[i], end[i]), self.rank, self.T))
                    for i in opening]
            out[layer.index] = by_layout[layout]
        return out

    def reserve(self, batch: StepBatch, layouts: Sequence[Layout] | None = None) -> None:
        """Allocate the pages this step's new tokens need in every layer (placed by ``layouts``, as
        in :meth:`new_pages`), or raise :class:`PoolFullError` on every rank with nothing allocated
        (a collective when the batch opens a page: on the host collectives where the model has them)."""
        if not batch.opens_pages:
            return
        plan = self.new_pages(batch, layouts)
        paged = self.paged_layers
        need = np.array([sum(p.size for _, p in plan[layer.index]) for layer in paged], dtype=np.int64)
        free = np.array([layer.kv.free_pages for layer in paged], dtype=np.int64)
        table = np.zeros((2, self.T, len(paged)), dtype=np.int64)
        table[0, self.rank], table[1, self.rank] = need, free
        if self.host_collectives is not None:
            table = torch.from_numpy(table)
            self.host_collectives.all_reduce(table)
        else:
            table = to_device(table, self.device, torch.int64)
            self.collectives.all_reduce(table)  # then read back: a wait for the device
        need_all, free_all = table.cpu().numpy()
        short = np.argwhere(need_all > free_all)
        if short.size:
            r, i = short[0]
            raise PoolFullError(f"KV pool full: rank {r} layer {paged[i].index} needs {need_all[r, i]} "
                                f"new pages, {free_all[r, i]} free ({len(short)} rank-layer pairs short); nothing was written")
        keys: dict[int, PageKeys] = {}  # layers of one layout place the new pages alike: one key set each
        for layer in paged:
            new = plan[layer.index]
            if id(new) not in keys:
                keys[id(new)] = PageKeys.of(np.concatenate(
                    [np.stack([np.full(p.size, rid, dtype=np.int64), p], axis=1) for rid, p in new]
                    or [np.zeros((0, 2), np.int64)]))
            layer.kv.alloc_keys(keys[id(new)])

    @property
    def paged_layers(self) -> list[MLALayer]:
        """The MLA layers (the ones with KV pages)."""
        return [layer for layer in self.layers if isinstance(layer, MLALayer)]

    def release(self, request_id: int) -> None:
        """Free a finished request's pages and recurrent state in every layer (call on every rank)."""
        self.pool.release(request_id)
        self.recurrent.release(request_id)
        if self.graphs is not None:
            self.graphs.release(request_id)

    def check_placement(self, batch: StepBatch) -> None:
        """Raise unless every layer holds exactly the pages (MLA) or recurrent heads (KDA) its layout
        assigns this rank for ``batch``'s contexts (after the step), and nothing for other requests."""
        ids = set(int(i) for i in batch.ids)
        for layer in self.layers:
            if isinstance(layer, KDALayer):
                _check_recurrent(layer, batch, ids)
                continue
            for rid, owner, ctx in zip(batch.ids, batch.owners, batch.contexts):
                pages = np.arange(-(-int(ctx) // self.page_size))
                want = held_pages(layer.layout, int(rid), int(owner), pages, self.rank, self.T)
                have, _ = layer.kv.pages_of(int(rid))
                if not np.array_equal(np.sort(have), want):
                    raise AssertionError(f"rank {self.rank} layer {layer.index} ({layer.layout}) request {rid}: "
                                         f"holds pages {have.tolist()}, the layout assigns {want.tolist()}")
            stray = set(layer.kv.requests) - ids
            if stray:
                raise AssertionError(f"rank {self.rank} layer {layer.index} holds pages of requests {sorted(stray)} not in the batch")

    # ---- memory ---------------------------------------------------------------------------

    def nbytes(self) -> dict[str, int]:
        """Bytes this rank holds, per state of the ownership model: 'weights' (Q-B, KV-B, O of every
        MLA layer, and the head-indexed KDA tensors: W_A or W_A/T), 'kv' and 'indexer' (pages in
        use), 'recurrent' (KDA state and conv caches held); what never moves in a switch:
        'experts' (the routed experts held here), 'mlp' (dense MLP and shared-expert shards,
        routers) and 'other' (embedding, norms, Q-A/KV-A, KDA gate down-projections and conv
        taps, LM head shard)."""
        size = lambda t: t.numel() * t.element_size()  # noqa: E731
        out = {"weights": 0, "kv": 0, "indexer": 0, "recurrent": 0, "experts": 0, "mlp": 0, "other": 0}
        for layer, norms, mlp in zip(self.layers, self.norms, self.mlps):
            w = layer.weights.nbytes()
            out["weights"] += w["projections"]
            out["other"] += w["replicated"] + sum(map(size, norms))
            for part, n in (mlp.nbytes() if mlp is not None else {}).items():
                out[part] += n
        out.update(self.pool.nbytes())
        out.update(self.recurrent.nbytes())
        out["other"] += size(self.embed) + size(self.final_norm) + size(self.lm_head)
        return out


def _check_recurrent(layer: KDALayer, batch: StepBatch, ids: set[int]) -> None:
    for rid, owner in zip(batch.ids, batch.owners):
        want, have = layer.held_heads(int(owner)), layer.state.heads_of(int(rid))
        if want != have:
            raise AssertionError(f"rank {layer.rank} layer {layer.index} ({layer.layout}) request {rid}: holds "
                                 f"recurrent heads {have}, the layout assigns {want}")
    stray = set(layer.state.requests) - ids
    if stray:
        raise AssertionError(f"rank {layer.rank} layer {layer.index} holds recurrent state of requests "
                             f"{sorted(stray)} not in the batch")


@dataclasses.dataclass(frozen=True)
class _Weights:
    """The model's tensors from ``source``, in their shapes, on the rank's device and format."""

    source: WeightSource
    shapes: dict
    device: Any
    dtype: torch.dtype

    def get(self, name: str, **cut) -> torch.Tensor:
        return self.source.get(name, self.shapes[name], **cut, device=self.device, dtype=self.dtype)
