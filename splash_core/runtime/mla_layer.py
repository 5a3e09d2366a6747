"""One MLA layer on one rank, computing in its own current layout (paper §2, §3, appendix E).

The layout is a property of the layer, not of the model: during a live switch layer i already
computes in the destination layout while layer i+1 still holds the source's state. A layer
therefore owns its ``layout``, its ``weights`` (all heads, or this rank's head shard) and its
pages (``kv``, a :class:`~splash_core.runtime.kv_pool.LayerKV`). The switch executor changes
them through :meth:`MLALayer.set_layout` (which checks the weights fit the layout) and the
``LayerKV`` API; :meth:`~splash_core.runtime.model.Model.check_placement` checks the pages.

Contract of :meth:`MLALayer.forward`: input ``x`` [N, d] is the normalised hidden state of all
rows of the step, the same on every rank; the output [N, d] is the attention output of all
rows, the same on every rank. In between, per layout:

- TP: this rank's heads for all rows; every rank stores every new token; O partials all-reduced.
- DP: all heads for the owner's rows only; no attention communication; the owners' outputs are
  all-gathered (the gather DP-attention engines do before the dense part).
- DOP: this rank's heads for all rows; a variable all-to-all sends query rows to their owners
  (all heads), which attend over the request's whole history; the reverse all-to-all returns
  head slices; sharded W_UV and O; an all-reduce sums the O partials of all rows before each
  owner selects its rows for the next layer (appendix E).
- CP: all heads for the owner's rows; queries and new cache entries are all-gathered; each rank
  attends every row over the pages it holds (page p of request i on rank (p + i) mod T) and
  sends its partial (out, lse) to the row's owner, which merges them by log-sum-exp, applies
  W_UV and O and all-gathers. A rank holding none of a row's keys returns lse = -inf.

With ``owned`` (a MoE layer dispatching by all-to-all: :mod:`splash_core.planning.moe_dispatch`),
DP, CP and DOP return their own rows only [N_r, d]: DP and CP without the gather, DOP reducing the
O partials to the rows' owners (an all-to-all) instead of to every rank.

With DeepSeek Sparse Attention (an ``indexer``) the pages store each token's indexer key as the
indexer uses it (normalised, rotated), and the rank attending for a row attends over the row's
top-k keys only (:mod:`~splash_core.runtime.sparse_attention`): in TP, DP and DOP it holds the
whole history; in CP the ranks all-gather their local top-k candidates to select globally. A
shared-indexer layer (GLM-5: no indexer, no indexer keys written) attends over the keys the
previous full layer selected, which that layer leaves on the step (``StepContext.selection``).

New tokens' cache entries are written before attention, so a row attends to itself and to the
earlier rows of its chunk (causal by position).
"""

from __future__ import annotations

import torch

from ..layouts import Layout
from ..model.dsa import IndexerWeights
from ..model.mla import MLAMath, MLAWeights
from ..model.weights import HeadShardedLayer
from . import exchange
from .expanded_attention import attend_expanded
from .kv_pool import LayerKV
from .sparse_attention import POSITION_LIMIT, KeptKeys, attend_selected, select_slots, slots_of_positions
from .step_context import AttentionView, StepContext


class MLALayer(HeadShardedLayer):
    """Layout, weights and pages of one MLA layer on one rank."""

    def __init__(self, index: int, layout: Layout, weights: MLAWeights, kv: LayerKV, math: MLAMath,
                 rank: int, T: int, indexer: IndexerWeights | None = None, index_topk: int = 0,
                 shares_selection: bool = False):
        """``indexer``: DeepSeek Sparse Attention's indexer (None: dense attention), each row
        attending to its ``index_topk`` selected keys; needs the pool to store indexer keys.
        ``shares_selection``: no indexer of its own, the previous full layer's selection (GLM-5)."""
        if shares_selection and indexer is not None:
            raise ValueError(f"layer {index}: a layer sharing the previous top-k has no indexer of its own")
        self.index = index
        self.indexer, self.index_topk, self.shares_selection = indexer, index_topk, shares_selection
        self.sparse = indexer is not None or shares_selection
        self.math = math
        self.kv = kv
        self.rank, self.T = rank, T
        self.layout: Layout
        self.weights: MLAWeights
        self.set_layout(layout, weights)

    def nbytes(self) -> dict[str, int]:
        return {**self.weights.nbytes(), **self.kv.nbytes()}

    # ---- forward --------------------------------------------------------------------------

    def forward(self, x: torch.Tensor, step: StepContext, owned: bool = False) -> torch.Tensor:
        """The attention output of every row [N, d], on every rank; ``owned`` (DP, CP, DOP): of this
        rank's own rows only [N_r, d], before the gather (or, in DOP, the all-reduce) that would give
        every rank all of them."""
        if owned and self.layout is Layout.TP:
            raise ValueError("a TP layer's rows have no owners to leave them with")
        return _FORWARD[self.layout](self, x, step, owned)

    def _write(self, step: StepContext, kv, rot, keys) -> None:
        """Write the cache entries of KV-A's output ``kv`` (and indexer ``keys``) of exactly the rows
        this rank holds (TP: all rows; owner layouts: its own), RoPE fused with the write."""
        if kv.shape[0] == 0:
            return
        slots = step.write_slots(self.kv, self.layout)
        self.math.write_latent(self.weights, kv, rot, self.kv.kv, slots)
        if keys is not None:
            self.kv.write(slots, None, keys if self.indexer is None else self.indexer.finish_keys(keys, rot))

    def _store(self, step: StepContext, entries, keys) -> None:
        """CP: write, of the cache entries ``entries`` (and ``keys``) of all rows, the rows whose
        page this rank holds."""
        rows = step.holder_rows(self.layout)
        if rows.size == 0:
            return
        if rows.size != step.batch.num_rows:
            index = step.holder_index(self.layout)
            entries = entries.index_select(0, index)
            keys = None if keys is None else keys.index_select(0, index)
        self.kv.write(step.write_slots(self.kv, self.layout), entries, keys)

    def _index(self, x, q_in, rot):
        """(indexer queries [n, H, D], head weights [n, H]) of hidden rows ``x`` with query input
        ``q_in`` and RoPE ``rot``; None without an indexer."""
        return None if self.indexer is None else (self.indexer.queries(q_in, rot), self.indexer.head_weights(x))

    def _attend(self, q: torch.Tensor, step: StepContext, index=None):
        """(out, lse) of absorbed queries ``q``; with an indexer, over each row's selected keys,
        ``index`` being :meth:`_index` of the rows attended for; sharing a full layer's selection,
        over the keys it kept. Where no context exceeds k, every visible key: dense attention."""
        view = step.attention_view(self.kv, self.layout)
        m, kernels = self.math, step.kernels
        all_rows = self.layout in (Layout.TP, Layout.CP)  # the rows this rank attends for
        if self.shares_selection:
            if not isinstance(step.selection, KeptKeys):
                raise ValueError(f"layer {self.index} shares the top-k of a full DSA layer, but none ran before it")
            kept = step.selection.rows(step, all_rows)
            if kept is not None:
                slots = slots_of_positions(kept, view, self.kv.kv.shape[1], step.longest_context())
                return attend_selected(kernels, q, self.kv, view, slots, m.scale, m.d_c)
        elif self.indexer is not None:
            if not step.attends_sparsely(self.index_topk):
                step.selection = KeptKeys(None, all_rows)
            else:
                longest = step.longest_context()
                if self.layout is Layout.CP and longest >= POSITION_LIMIT:
                    raise ValueError(f"CP's sparse attention exchanges positions below {POSITION_LIMIT} "
                                     f"(a context of {longest})")
                # CP holds keys split by position: its top-k is global
                across = (lambda local: _from_every_rank(step, local)) if self.layout is Layout.CP else None
                slots, kept = select_slots(kernels, *index, self.kv, view, self.index_topk, across,
                                           step.nan_scores)
                step.selection = KeptKeys(kept, all_rows)
                return attend_selected(kernels, q, self.kv, view, slots, m.scale, m.d_c)
        return step.attend(q, self.kv, view, m.scale, m.d_c)

    def _attend_values(self, q_in, rot, step: StepContext, x):
        """(values [n, h, d_v], lse [n, h]) of the rows this rank attends for, from their hidden
        rows ``x``, query input ``q_in`` and RoPE ``rot``: absorbed (always with sparse attention),
        or, for the rows of requests that attend expanded (:meth:`StepContext.form_rows`), expanded."""
        m, w = self.math, self.weights
        rows = None if self.sparse else step.form_rows(self.layout, m.attention_form, m.dims)
        if rows is None:
            out, lse = self._attend(m.queries(w, q_in, rot), step, self._index(x, q_in, rot))
            return m.values(w, out), lse
        return self._mixed_forms(m.head_queries(w, q_in, rot), rows, step)

    def _mixed_forms(self, q, rows, step: StepContext):
        """(values, lse) of per-head queries ``q`` [n, h, d_n + d_r] split by form ``rows``."""
        m, w = self.math, self.weights
        n, heads, _ = q.shape
        keys = step.expanded_keys(self.kv, self.layout, rows)
        out, part = attend_expanded(step.kernels, rows.take(q, expanded=True), self.kv, keys, rows,
                                    w.kv_b_weight, m.d_n, m.scale)
        if rows.absorbed.numel() == 0:  # every row expanded, in order
            return out.to(q.dtype), part
        values = q.new_empty(n, heads, m.d_v)
        lse = torch.empty(n, heads, dtype=torch.float32, device=q.device)
        rows.put(values, out.to(values.dtype), expanded=True)
        rows.put(lse, part, expanded=True)
        full = step.attention_view(self.kv, self.layout)
        view = AttentionView(full.block_table, full.page_index, rows.absorbed_req, rows.absorbed_pos)
        q_abs = rows.take(q, expanded=False)
        out, part = step.attend(m.absorb(w, q_abs[..., : m.d_n], q_abs[..., m.d_n:]), self.kv, view, m.scale, m.d_c)
        rows.put(values, m.values(w, out).to(values.dtype), expanded=False)
        rows.put(lse, part, expanded=False)
        return values, lse

    def _rotary(self, step: StepContext, own: bool):
        return step.rotary(self.math.d_r, self.math.theta, own, self.math.rope_scaling, rotates=self.math.rotates)

    def _tp(self, x, step, owned=False):
        m, w = self.math, self.weights
        rot = self._rotary(step, own=False)
        q_in, kv, keys = m.project(w, x)
        self._write(step, kv, rot, keys)
        values, _ = self._attend_values(q_in, rot, step, x)
        o = m.project_values(w, values)
        step.collectives.all_reduce(o)
        return o

    def _owner_rows(self, x, step):
        """(query input, RoPE, KV-A output, indexer keys) of this rank's own rows."""
        rot = self._rotary(step, own=True)
        q_in, kv, keys = self.math.project(self.weights, x[step.own_rows])
        return q_in, rot, kv, keys

    def _dp(self, x, step, owned=False):
        m, w = self.math, self.weights
        q_in, rot, kv, keys = self._owner_rows(x, step)
        self._write(step, kv, rot, keys)
        values, _ = self._attend_values(q_in, rot, step, x[step.own_rows])
        return _rows(step, m.project_values(w, values), owned)

    def _dop(self, x, step, owned=False):
        m, w = self.math, self.weights
        q_in, kv, keys = m.project(w, x, kv_rows=step.own_rows)
        q = m.queries(w, q_in, self._rotary(step, own=False))  # [N, H/T, W]: this rank's heads, all rows
        rot_own = self._rotary(step, own=True)
        self._write(step, kv, rot_own, keys)
        own = step.own_rows
        out_own, _ = self._attend(exchange.rows_to_owners(step, q), step, self._index(x[own], q_in[own], rot_own))
        o = m.output(w, exchange.owners_to_rows(step, out_own))
        if owned:
            return exchange.reduce_to_owners(step, o)
        step.collectives.all_reduce(o)
        return o

    def _cp(self, x, step, owned=False):
        m, w = self.math, self.weights
        q_in, rot, kv, keys = self._owner_rows(x, step)
        entries = m.latent(w, kv, rot)
        forms = None if self.sparse else step.form_rows(self.layout, m.attention_form, m.dims)
        index = self._index(x[step.own_rows], q_in, rot)  # travels with the queries: CP attends every row
        if index is not None:
            keys = self.indexer.finish_keys(keys, rot)
        # Expanded rows travel as per-head queries (d_n + d_r wide), so every row does then.
        q_own = m.queries(w, q_in, rot) if forms is None else m.head_queries(w, q_in, rot)
        n, heads, width = q_own.shape
        parts = [q_own.reshape(n, heads * width), entries] + ([keys] if keys is not None else [])
        if index is not None:
            parts += [index[0].flatten(1), index[1].to(entries.dtype)]
        gathered = exchange.gather_rows(step, torch.cat(parts, dim=1))
        # Views into the gathered rows: the kernels need only a unit channel stride, the cache
        # write copies anyway.
        q = gathered[:, : heads * width].view(-1, heads, width)
        all_entries = gathered[:, heads * width: heads * width + m.kv_width]
        end = heads * width + m.kv_width + (keys.shape[1] if keys is not None else 0)
        all_keys = gathered[:, heads * width + m.kv_width: end] if keys is not None else None
        if index is not None:
            idx_heads, idx_dim = index[0].shape[1:]
            index = (gathered[:, end: end + idx_heads * idx_dim].reshape(-1, idx_heads, idx_dim),
                     gathered[:, end + idx_heads * idx_dim:].float())
        self._store(step, all_entries, all_keys)
        if forms is None:
            out, lse = self._attend(q, step, index)
            outs, lses = exchange.partials_to_owners(step, out, lse)
            merged, _ = step.kernels.merge(outs, lses)
            return _rows(step, m.output(w, merged), owned)
        # partials in value space: W_UV is linear, so merging values equals W_UV of merged latents
        values, lse = self._mixed_forms(q, forms, step)
        outs, lses = exchange.partials_to_owners(step, values, lse)
        merged, _ = step.kernels.merge(outs, lses)
        return _rows(step, m.project_values(w, merged), owned)


def _rows(step: StepContext, own: torch.Tensor, owned: bool) -> torch.Tensor:
    """An owner layout's output of its own rows: as is where ``owned``, else gathered to every rank."""
    return own if owned else exchange.gather_rows(step, own)


def _from_every_rank(step: StepContext, local: torch.Tensor) -> torch.Tensor:
    """All ranks' equal-shaped ``local`` [n, k] stacked [T, n, k], on every rank (an all-gather)."""
    out = local.new_empty(step.T * local.shape[0], local.shape[1])
    step.collectives.all_gather_into(out, local.contiguous())
    return out.view(step.T, *local.shape)


_FORWARD = {Layout.TP: MLALayer._tp, Layout.DP: MLALayer._dp, Layout.DOP: MLALayer._dop, Layout.CP: MLALayer._cp}
