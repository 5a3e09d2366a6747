"""Single-process reference of the runtime's model: the oracle every layout is tested against.

Deliberately a different computation from :class:`~splash_core.runtime.model.Model`: no pages,
no kernels, no weight absorption, no collectives. Each request keeps a dense history of
normalised latents and rotated rotary keys per layer; attention expands them per head with
W_UK and W_UV (DeepSeek's naive MLA form) and applies an explicit causal mask; with a DSA
indexer and ``sparse`` each request also keeps its indexer keys, and the mask keeps only each
query's top-k keys (a mask over dense scores, not a gather of the selected entries); a
shared-indexer layer (GLM-5) keeps the mask of the full layer before it, as transformers passes it on. KDA layers keep
each request's whole history of pre-convolution inputs (convolved with ``F.conv1d`` over the
full sequence, not from a cache) and its state, updated token by token in the transition form
``S <- (I - beta k kᵀ) diag(exp g) S + beta k vᵀ`` (not the kernels' delta form). MoE layers run
every expert on every row and combine them with a dense [rows, experts] matrix of the routing
weights (not the runtime's grouped, expert-parallel path). Only RMSNorm, RoPE, the router, the DSA
indexer's scores and top-k (:mod:`~splash_core.model.dsa`) and the weight source are shared with the runtime.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..dtypes import torch_dtype
from ..model.dsa import IndexerWeights, index_scores, select
from ..model.experts import route
from ..model.fp8_cache import round_trip
from ..model.kv_format import indexer_layout, scaled_layout
from ..model.ops import rms_norm
from ..model.rotary import Rotary, rope, softmax_scale
from ..model.weights import WeightSource, layer_prefix, tensor_shapes
from ..profiles.model import LayerKind, ModelProfile
from .step_batch import StepBatch


class ReferenceModel:
    """The whole model on one device, all heads, every history kept densely."""

    def __init__(self, profile: ModelProfile, source: WeightSource, device="cpu", dtype=torch.float32,
                 num_layers: int | None = None, kv_dtype: torch.dtype | None = None, sparse: bool = False):
        """``kv_dtype``: the format the runtime's KV pool stores (None: ``dtype``); each new latent
        and rotary key is rounded to it, as a write into the pool rounds it: through the
        scaled-fp8 format where the profile's cache has scales (``kv_dtype`` is then its latent's).
        Indexer keys are always rounded to the profile's stored format.
        ``sparse``: attend over the DSA indexer's top-k keys only, the model's real function
        (transformers'); without it attention is dense, as the runtime's layers attend unless
        their :class:`~splash_core.runtime.model_config.ModelConfig` asks for ``sparse_attention``."""
        if sparse and profile.indexer is None:
            raise ValueError(f"sparse attention needs a DSA indexer; model {profile.name!r} has none")
        self.profile, self.dtype, self.kv_dtype, self.sparse = profile, dtype, kv_dtype, sparse
        self.scaled = scaled_layout(profile) if kv_dtype is not None else None
        count = profile.num_layers if num_layers is None else num_layers
        self.kinds = profile.layer_kinds[:count]
        shapes = tensor_shapes(profile, count)
        self.w = {name: source.get(name, shape, device=device, dtype=dtype) for name, shape in shapes.items()}
        self.count = count
        self.cache: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = [{} for _ in range(count)]
        self.index_keys: list[dict[int, torch.Tensor]] = [{} for _ in range(count)]  # DSA indexer keys [T, D]
        self._chosen: torch.Tensor | None = None  # the last full DSA layer's mask, within one forward

    def release(self, request_id: int) -> None:
        for layer in self.cache + self.index_keys:
            layer.pop(request_id, None)

    def step(self, batch: StepBatch, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [R, V] float32 of each request's last row, in batch request order."""
        tokens = tokens.to(self.w["model.embed_tokens.weight"].device).long()
        return torch.cat([self.logits(self.forward(req.id, req.start, tokens[lo:hi])[-1:])
                          for req, lo, hi in zip(batch.requests, batch.row_offsets, batch.row_offsets[1:])])

    def forward(self, request: int, start: int, tokens: torch.Tensor,
                watch: Callable[[str, torch.Tensor], None] | None = None) -> torch.Tensor:
        """The residual stream [n, d] after the last block for ``tokens`` of ``request`` at
        positions ``start``..; appends to the request's histories. ``watch`` (if given) sees the
        residual stream after every sub-step, named ("layer 3 attention", ...)."""
        w, eps = self.w, self.profile.rms_norm_eps
        seen = watch or (lambda step, h: None)
        pos = torch.arange(start, start + tokens.numel(), device=tokens.device)
        h = w["model.embed_tokens.weight"][tokens]
        seen("the embedding", h)
        self._chosen = None
        for layer in range(self.count):
            pre = layer_prefix(layer)
            kda = self.kinds[layer] is LayerKind.KDA
            attention = self._kda if kda else self._attention
            h = h + attention(layer, request, start, rms_norm(h, w[f"{pre}.input_layernorm.weight"], eps), pos)
            seen(f"layer {layer} {'KDA' if kda else 'attention'}", h)
            x = rms_norm(h, w[f"{pre}.post_attention_layernorm.weight"], eps)
            if self.profile.runtime_moe_layer(layer):
                h = h + self._moe(layer, x, pos)
                seen(f"layer {layer} MoE", h)
            elif self.profile.intermediate_size:
                h = h + self._mlp(f"{pre}.mlp", x)
                seen(f"layer {layer} MLP", h)
        return h

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Float32 logits [n, V] of residual rows ``h``."""
        return (rms_norm(h, self.w["model.norm.weight"], self.profile.rms_norm_eps) @ self.w["lm_head.weight"].t()).float()

    def _mlp(self, prefix: str, x: torch.Tensor) -> torch.Tensor:
        w = self.w
        gate = torch.nn.functional.silu(x @ w[f"{prefix}.gate_proj.weight"].t())
        return (gate * (x @ w[f"{prefix}.up_proj.weight"].t())) @ w[f"{prefix}.down_proj.weight"].t()

    def _route(self, layer: int, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, experts) of rows ``x`` at positions ``pos`` in MoE layer ``layer``."""
        p = f"{layer_prefix(layer)}.mlp"
        return route(x, self.w[f"{p}.gate.weight"], self.w.get(f"{p}.gate.e_score_correction_bias"), self.profile.moe)

    def _moe(self, layer: int, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        moe, p = self.profile.moe, f"{layer_prefix(layer)}.mlp"
        weights, experts = self._route(layer, x, pos)
        combine = torch.zeros(x.shape[0], moe.n_routed_experts, device=x.device).scatter_add_(1, experts, weights)
        out = sum(combine[:, j, None] * self._mlp(f"{p}.experts.{j}", x).float() for j in range(moe.n_routed_experts))
        if moe.n_shared_experts:
            out = out + self._mlp(f"{p}.shared_experts", x).float()
        return out.to(x.dtype)

    def _attention(self, layer: int, request: int, start: int, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        m, w = self.profile.mla, self.w
        a = f"{layer_prefix(layer)}.self_attn"
        eps, theta, scaling = m.latent_norm_eps, self.profile.rope_theta, self.profile.rope_scaling
        H, dn, dr, dv, dc = m.heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank
        if m.q_lora_rank:
            q_in = rms_norm(x @ w[f"{a}.q_a_proj.weight"].t(), w[f"{a}.q_a_layernorm.weight"], eps)
            q = q_in @ w[f"{a}.q_b_proj.weight"].t()
        else:
            q_in = x
            q = x @ w[f"{a}.q_proj.weight"].t()
        q = q.view(-1, H, dn + dr)
        rotate = (lambda t: rope(t, pos, theta, scaling)) if self.profile.mla_rope else (lambda t: t)  # noqa: E731
        q_nope, q_rope = q[..., :dn], rotate(q[..., dn:])
        kv = x @ w[f"{a}.kv_a_proj_with_mqa.weight"].t()
        c_new = rms_norm(kv[:, :dc], w[f"{a}.kv_a_layernorm.weight"], eps)
        k_rope_new = rotate(kv[:, dc:])
        if self.scaled is not None:
            c_new, k_rope_new = round_trip(torch.cat([c_new, k_rope_new], dim=1), self.scaled).split([dc, dr], dim=1)
        elif self.kv_dtype is not None:
            c_new, k_rope_new = (t.to(self.kv_dtype).to(t.dtype) for t in (c_new, k_rope_new))
        c_old, k_old = self.cache[layer].get(request, (c_new[:0], k_rope_new[:0]))
        if c_old.shape[0] != start:
            raise ValueError(f"request {request} layer {layer}: history holds {c_old.shape[0]} tokens, step starts at {start}")
        c, k_rope = torch.cat([c_old, c_new]), torch.cat([k_old, k_rope_new])
        self.cache[layer][request] = (c, k_rope)
        kv_b = w[f"{a}.kv_b_proj.weight"].view(H, dn + dv, dc)
        k_nope = torch.einsum("sc,hdc->shd", c, kv_b[:, :dn])
        v = torch.einsum("sc,hvc->shv", c, kv_b[:, dn:])
        scores = (torch.einsum("nhd,shd->nhs", q_nope, k_nope)
                  + torch.einsum("nhr,sr->nhs", q_rope, k_rope)) * softmax_scale(self.profile)
        visible = torch.arange(c.shape[0], device=c.device)[None, :] <= pos[:, None]
        if self.sparse:
            visible = self._selected(layer, request, x, q_in, pos, visible)
        probs = torch.softmax(scores.float().masked_fill(~visible[:, None, :], float("-inf")), dim=-1)
        out = torch.einsum("nhs,shv->nhv", probs.to(v.dtype), v).reshape(-1, H * dv)
        return out @ w[f"{a}.o_proj.weight"].t()

    def _selected(self, layer: int, request: int, x: torch.Tensor, q_in: torch.Tensor, pos: torch.Tensor,
                  visible: torch.Tensor) -> torch.Tensor:
        """DSA: of the ``visible`` [n, T] keys, those the indexer selects for each query (its top-k);
        appends the new rows' indexer keys to the request's history of them."""
        if not self.profile.indexer.selects(layer):
            if self._chosen is None:
                raise ValueError(f"layer {layer} shares the top-k of a full DSA layer, but none ran before it")
            return self._chosen
        a, w = f"{layer_prefix(layer)}.self_attn.indexer", self.w
        iw = IndexerWeights(w[f"{a}.wq_b.weight"], w[f"{a}.wk.weight"], w[f"{a}.k_norm.weight"],
                            w[f"{a}.k_norm.bias"], w[f"{a}.weights_proj.weight"], self.profile.indexer.rope_interleave)
        rotary = Rotary.at(pos, self.profile.mla.qk_rope_head_dim, self.profile.rope_theta, self.profile.rope_scaling)
        new = self._stored_index_keys(iw.keys(x, rotary))
        keys = torch.cat([self.index_keys[layer].get(request, new[:0]), new])
        self.index_keys[layer][request] = keys
        scores = index_scores(iw.queries(q_in, rotary), iw.head_weights(x), keys, visible)
        indices, valid = select(scores, self.profile.indexer.topk)
        self._chosen = torch.zeros_like(visible).scatter_(1, indices, valid) & visible
        return self._chosen

    def _stored_index_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """Indexer keys as the pool gives them back: through the scaled-fp8 key format, or rounded to
        the keys' element format (the profile's, whatever the compute format: what selects is what
        the runtime stored)."""
        layout = indexer_layout(self.profile)
        if layout is not None:
            return round_trip(keys, layout)
        return keys.to(torch_dtype(self.profile.indexer.dtype)).to(keys.dtype)

    def _kda(self, layer: int, request: int, start: int, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        kda, w, eps = self.profile.kda, self.w, self.profile.rms_norm_eps
        a = f"{layer_prefix(layer)}.self_attn"
        H, K, n = kda.heads, kda.head_dim, x.shape[0]
        new = torch.stack([x @ w[f"{a}.{p}_proj.weight"].t() for p in "qkv"])  # [3, n, H K]
        old, S = self.cache[layer].get(request, (new[:, :0], torch.zeros(H, K, K, device=x.device)))
        if old.shape[1] != start:
            raise ValueError(f"request {request} layer {layer}: history holds {old.shape[1]} tokens, step starts at {start}")
        seq = torch.cat([old, new], dim=1)
        qkv = []
        for j, p in enumerate("qkv"):  # causal depthwise conv over the whole history, then SiLU
            taps = w[f"{a}.{p}_conv1d.weight"]
            full = F.conv1d(seq[j].t()[None].float(), taps.float(), padding=kda.conv_size - 1, groups=H * K)
            qkv.append(F.silu(full[0, :, start: start + n].t()).view(n, H, K))
        l2 = lambda t: t * torch.rsqrt((t * t).sum(-1, keepdim=True) + 1e-6)  # noqa: E731
        q, k, v = l2(qkv[0]), l2(qkv[1]), qkv[2]
        f = (x @ w[f"{a}.f_a_proj.weight"].t()) @ w[f"{a}.f_b_proj.weight"].t() + w[f"{a}.dt_bias"]
        g = -w[f"{a}.A_log"].float().reshape(H, 1).exp() * F.softplus(f.float().view(n, H, K))
        beta = torch.sigmoid((x @ w[f"{a}.b_proj.weight"].t()).float())
        eye = torch.eye(K, device=x.device)
        out = torch.empty(n, H, K, device=x.device)
        for t in range(n):
            kt = k[t].float()
            transition = eye - beta[t][:, None, None] * torch.einsum("hi,hj->hij", kt, kt)
            S = transition @ (g[t].exp()[:, :, None] * S) + beta[t][:, None, None] * torch.einsum("hk,hv->hkv", kt, v[t])
            out[t] = torch.einsum("hkv,hk->hv", S, q[t].float()) * K ** -0.5
        self.cache[layer][request] = (seq, S)
        gate = torch.sigmoid(((x @ w[f"{a}.g_a_proj.weight"].t()) @ w[f"{a}.g_b_proj.weight"].t()).float().view(n, H, K))
        o = rms_norm(out, w[f"{a}.o_norm.weight"], eps).float() * gate
        return o.to(x.dtype).reshape(n, H * K) @ w[f"{a}.o_proj.weight"].t()
