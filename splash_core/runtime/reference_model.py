"""Single-process reference of the runtime's model: the oracle every layout is tested against.

Deliberately a different computation from :class:`~splash_core.runtime.model.Model`: no pages,
no kernels, no weight absorption, no collectives. Each request keeps a dense history of
normalised latents and rotated rotary keys per layer; attention expands them per head with
W_UK and W_UV (DeepSeek's naive MLA form) and applies an explicit causal mask. KDA layers keep
each request's whole history of pre-convolution inputs (convolved with ``F.conv1d`` over the
full sequence, not from a cache) and its state, updated token by token in the transition form
``S <- (I - beta k kᵀ) diag(exp g) S + beta k vᵀ`` (not the kernels' delta form). Only RMSNorm,
RoPE and the weight source are shared with the runtime.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..profiles.model import LayerKind, ModelProfile
from .mla import rms_norm, rope
from .step_batch import StepBatch
from .weights import WeightSource, layer_prefix, tensor_shapes


class ReferenceModel:
    """The whole model on one device, all heads, every history kept densely."""

    def __init__(self, profile: ModelProfile, source: WeightSource, device="cpu", dtype=torch.float32,
                 num_layers: int | None = None, kv_dtype: torch.dtype | None = None):
        """``kv_dtype``: the format the runtime's KV pool stores (None: ``dtype``); each new latent
        and rotary key is rounded to it, as a write into the pool rounds it."""
        self.profile, self.dtype, self.kv_dtype = profile, dtype, kv_dtype
        count = profile.num_layers if num_layers is None else num_layers
        self.kinds = profile.layer_kinds[:count]
        shapes = tensor_shapes(profile, count)
        self.w = {name: source.get(name, shape, device=device, dtype=dtype) for name, shape in shapes.items()}
        self.count = count
        self.cache: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = [{} for _ in range(count)]

    def release(self, request_id: int) -> None:
        for layer in self.cache:
            layer.pop(request_id, None)

    def step(self, batch: StepBatch, tokens: torch.Tensor) -> torch.Tensor:
        """Logits [R, V] float32 of each request's last row, in batch request order."""
        p, w = self.profile, self.w
        eps = p.rms_norm_eps
        device = w["model.embed_tokens.weight"].device
        tokens = tokens.to(device).long()
        logits = []
        for i, req in enumerate(batch.requests):
            lo, hi = batch.row_offsets[i], batch.row_offsets[i + 1]
            pos = torch.arange(req.start, req.start + req.rows, device=device)
            h = w["model.embed_tokens.weight"][tokens[lo:hi]]
            for layer in range(self.count):
                pre = layer_prefix(layer)
                x = rms_norm(h, w[f"{pre}.input_layernorm.weight"], eps)
                attention = self._kda if self.kinds[layer] is LayerKind.KDA else self._attention
                h = h + attention(layer, req.id, req.start, x, pos)
                if p.intermediate_size:
                    x = rms_norm(h, w[f"{pre}.post_attention_layernorm.weight"], eps)
                    gate = torch.nn.functional.silu(x @ w[f"{pre}.mlp.gate_proj.weight"].t())
                    h = h + (gate * (x @ w[f"{pre}.mlp.up_proj.weight"].t())) @ w[f"{pre}.mlp.down_proj.weight"].t()
            last = rms_norm(h[-1:], w["model.norm.weight"], eps)
            logits.append((last @ w["lm_head.weight"].t()).float())
        return torch.cat(logits)

    def _attention(self, layer: int, request: int, start: int, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        m, w = self.profile.mla, self.w
        a = f"{layer_prefix(layer)}.self_attn"
        eps, theta = self.profile.rms_norm_eps, self.profile.rope_theta
        H, dn, dr, dv, dc = m.heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank
        if m.q_lora_rank:
            q = rms_norm(x @ w[f"{a}.q_a_proj.weight"].t(), w[f"{a}.q_a_layernorm.weight"], eps) @ w[f"{a}.q_b_proj.weight"].t()
        else:
            q = x @ w[f"{a}.q_proj.weight"].t()
        q = q.view(-1, H, dn + dr)
        q_nope, q_rope = q[..., :dn], rope(q[..., dn:], pos, theta)
        kv = x @ w[f"{a}.kv_a_proj_with_mqa.weight"].t()
        c_new = rms_norm(kv[:, :dc], w[f"{a}.kv_a_layernorm.weight"], eps)
        k_rope_new = rope(kv[:, dc:], pos, theta)
        if self.kv_dtype is not None:
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
                  + torch.einsum("nhr,sr->nhs", q_rope, k_rope)) / (dn + dr) ** 0.5
        visible = torch.arange(c.shape[0], device=c.device)[None, :] <= pos[:, None]
        probs = torch.softmax(scores.float().masked_fill(~visible[:, None, :], float("-inf")), dim=-1)
        out = torch.einsum("nhs,shv->nhv", probs.to(v.dtype), v).reshape(-1, H * dv)
        return out @ w[f"{a}.o_proj.weight"].t()

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
