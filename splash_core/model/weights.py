"""Model weights: where they come from (a seed or a safetensors checkpoint) and the slices a
rank keeps.

Tensor names follow DeepSeek's Hugging Face checkpoints (``nn.Linear`` weights are
``[out_features, in_features]``)::

    model.embed_tokens.weight                              [V, d]
    model.layers.{i}.input_layernorm.weight                [d]
    model.layers.{i}.self_attn.q_a_proj.weight             [r_q, d]         (q_lora_rank > 0)
    model.layers.{i}.self_attn.q_a_layernorm.weight        [r_q]
    model.layers.{i}.self_attn.q_b_proj.weight             [H (d_n + d_r), r_q]
    model.layers.{i}.self_attn.q_proj.weight               [H (d_n + d_r), d]  (q_lora_rank = 0)
    model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight   [d_c + d_r, d]
    model.layers.{i}.self_attn.kv_a_layernorm.weight       [d_c]
    model.layers.{i}.self_attn.kv_b_proj.weight            [H (d_n + d_v), d_c]
    model.layers.{i}.self_attn.o_proj.weight               [d, H d_v]
    model.layers.{i}.self_attn.indexer.wk.weight           [indexer_dim, d]  (indexer models)
    KDA layers (Kimi-Linear naming; H heads, K = V = head_dim, c conv width):
    model.layers.{i}.self_attn.{q,k}_proj.weight           [H K, d]
    model.layers.{i}.self_attn.v_proj.weight               [H V, d]
    model.layers.{i}.self_attn.{q,k,v}_conv1d.weight       [H K, 1, c]  (depthwise short conv)
    model.layers.{i}.self_attn.f_a_proj.weight             [K, d]
    model.layers.{i}.self_attn.f_b_proj.weight             [H K, K]
    model.layers.{i}.self_attn.dt_bias                     [H K]
    model.layers.{i}.self_attn.A_log                       [1, 1, H, 1]
    model.layers.{i}.self_attn.b_proj.weight               [H, d]
    model.layers.{i}.self_attn.g_a_proj.weight             [V, d]
    model.layers.{i}.self_attn.g_b_proj.weight             [H V, V]
    model.layers.{i}.self_attn.o_norm.weight               [V]
    model.layers.{i}.self_attn.o_proj.weight               [d, H V]
    model.layers.{i}.post_attention_layernorm.weight       [d]
    model.layers.{i}.mlp.{gate,up}_proj.weight             [I, d]     (dense layers)
    model.layers.{i}.mlp.down_proj.weight                  [d, I]
    MoE layers (E routed experts of width I_e, S shared ones):
    model.layers.{i}.mlp.gate.weight                       [E, d]     (router)
    model.layers.{i}.mlp.gate.e_score_correction_bias      [E]        (noaux_tc routing)
    model.layers.{i}.mlp.experts.{j}.{gate,up}_proj.weight [I_e, d]
    model.layers.{i}.mlp.experts.{j}.down_proj.weight      [d, I_e]
    model.layers.{i}.mlp.shared_experts.{gate,up}_proj.weight  [S I_e, d]
    model.layers.{i}.mlp.shared_experts.down_proj.weight       [d, S I_e]
    model.norm.weight [d],  lm_head.weight [V, d]

Head h owns rows ``h (d_n + d_r) ..`` of Q-B, rows ``h (d_n + d_v) ..`` of KV-B (first d_n the
key up-projection W_UK, then d_v the value up-projection W_UV) and columns ``h d_v ..`` of O.
In a KDA layer head h owns rows ``h K ..`` of every [H K, ...] tensor, row h of ``b_proj``,
entry h of ``A_log`` and columns ``h V ..`` of ``o_proj``.
Hugging Face checkpoint folders (FP8 block scales, interleaved rotary channels, sharded
files) are read by :class:`~splash_core.checkpoint.source.CheckpointWeights`.

:class:`SeededWeights` makes every tensor a pure function of ``(seed, name)``, generated on
the rank's device, so each rank builds exactly its own shard without a broadcast and without
depending on T (it generates the full tensor, which on an accelerator costs milliseconds, and
keeps its slice). :class:`SafetensorsWeights` reads only the slice asked for.
"""

from __future__ import annotations

import math
import zlib
from pathlib import Path
from typing import Protocol, Sequence

import torch

from ..layouts import Layout, Placement
from ..profiles.model import LayerKind, ModelProfile
from .fp8_blocks import BlockScaledFP8


def layer_prefix(layer: int) -> str:
    return f"model.layers.{layer}"


def tensor_shapes(profile: ModelProfile, layers: int | None = None) -> dict[str, tuple[int, ...]]:
    """Every tensor the runtime's model reads for the first ``layers`` layers, with its full shape."""
    d = profile.hidden_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (profile.vocab_size, d)}
    for i in range(profile.num_layers if layers is None else layers):
        shapes.update(layer_tensor_shapes(profile, i))
    shapes["model.norm.weight"] = (d,)
    shapes["lm_head.weight"] = (profile.vocab_size, d)
    return shapes


def layer_tensor_shapes(profile: ModelProfile, layer: int) -> dict[str, tuple[int, ...]]:
    """The tensors of layer ``layer`` the runtime's model reads, with their full shapes."""
    d, m = profile.hidden_size, profile.mla
    p = layer_prefix(layer)
    shapes = {f"{p}.input_layernorm.weight": (d,), f"{p}.post_attention_layernorm.weight": (d,)}
    kind = profile.layer_kinds[layer]
    if kind is LayerKind.MLA:
        a = f"{p}.self_attn"
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            shapes[f"{a}.q_a_proj.weight"] = (m.q_lora_rank, d)
            shapes[f"{a}.q_a_layernorm.weight"] = (m.q_lora_rank,)
            shapes[f"{a}.q_b_proj.weight"] = (m.heads * qk, m.q_lora_rank)
        else:
            shapes[f"{a}.q_proj.weight"] = (m.heads * qk, d)
        shapes[f"{a}.kv_a_proj_with_mqa.weight"] = (m.kv_lora_rank + m.qk_rope_head_dim, d)
        shapes[f"{a}.kv_a_layernorm.weight"] = (m.kv_lora_rank,)
        shapes[f"{a}.kv_b_proj.weight"] = (m.heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank)
        shapes[f"{a}.o_proj.weight"] = (d, m.heads * m.v_head_dim)
        if profile.indexer is not None and profile.indexer.selects(layer):
            shapes.update(indexer_tensor_shapes(profile, a))
    elif kind is LayerKind.KDA:
        shapes.update(kda_tensor_shapes(profile, layer))
    if profile.runtime_moe_layer(layer):
        shapes.update(moe_tensor_shapes(profile, layer))
    elif profile.intermediate_size:
        shapes.update(mlp_shapes(f"{p}.mlp", profile.intermediate_size, d))
    return shapes


def is_ffn_weight(name: str) -> bool:
    """Whether ``name`` is a feed-forward projection weight (of a routed or shared expert or a
    dense MLP): what a model with FFN weights kept FP8 reads as stored."""
    return ".mlp." in name and name.endswith("_proj.weight")


def ffn_weight_names(profile: ModelProfile, layers: int | None = None) -> list[str]:
    """The feed-forward projection weights (:func:`is_ffn_weight`) of the first ``layers`` layers."""
    return [n for n in tensor_shapes(profile, layers) if is_ffn_weight(n)]


def indexer_tensor_shapes(profile: ModelProfile, attention: str) -> dict[str, tuple[int, ...]]:
    """The DSA indexer's tensors under attention prefix ``attention`` (its queries read Q-A's output)."""
    idx, d = profile.indexer, profile.hidden_size
    i = f"{attention}.indexer"
    queries_from = profile.mla.q_lora_rank or d
    return {f"{i}.wk.weight": (idx.head_dim, d), f"{i}.wq_b.weight": (idx.heads * idx.head_dim, queries_from),
            f"{i}.k_norm.weight": (idx.head_dim,), f"{i}.k_norm.bias": (idx.head_dim,),
            f"{i}.weights_proj.weight": (idx.heads, d)}


def mlp_shapes(prefix: str, width: int, d: int) -> dict[str, tuple[int, ...]]:
    """A SiLU-gated MLP of intermediate ``width``: gate and up [width, d], down [d, width]."""
    return {f"{prefix}.gate_proj.weight": (width, d), f"{prefix}.up_proj.weight": (width, d),
            f"{prefix}.down_proj.weight": (d, width)}


def moe_tensor_shapes(profile: ModelProfile, layer: int, experts: range | None = None) -> dict[str, tuple[int, ...]]:
    """The router, the routed experts (``experts``; default all) and the shared experts of MoE
    layer ``layer``, DeepSeek's names and full shapes."""
    e, d = profile.moe, profile.hidden_size
    p = f"{layer_prefix(layer)}.mlp"
    shapes = {f"{p}.gate.weight": (e.n_routed_experts, d)}
    if e.topk_method == "noaux_tc":
        shapes[f"{p}.gate.e_score_correction_bias"] = (e.n_routed_experts,)
    for j in range(e.n_routed_experts) if experts is None else experts:
        shapes.update(mlp_shapes(f"{p}.experts.{j}", e.moe_intermediate_size, d))
    if e.n_shared_experts:
        shapes.update(mlp_shapes(f"{p}.shared_experts", e.n_shared_experts * e.moe_intermediate_size, d))
    return shapes


def kda_tensor_shapes(profile: ModelProfile, layer: int) -> dict[str, tuple[int, ...]]:
    """The tensors of KDA layer ``layer`` (Kimi-Linear's ``KimiDeltaAttention``), full shapes."""
    d, k = profile.hidden_size, profile.kda
    H, K, c = k.heads, k.head_dim, k.conv_size
    a = f"{layer_prefix(layer)}.self_attn"
    shapes = {f"{a}.{n}_proj.weight": (H * K, d) for n in ("q", "k", "v")}
    shapes.update({f"{a}.{n}_conv1d.weight": (H * K, 1, c) for n in ("q", "k", "v")})
    shapes.update({
        f"{a}.f_a_proj.weight": (K, d), f"{a}.f_b_proj.weight": (H * K, K), f"{a}.dt_bias": (H * K,),
        f"{a}.A_log": (1, 1, H, 1), f"{a}.b_proj.weight": (H, d),
        f"{a}.g_a_proj.weight": (K, d), f"{a}.g_b_proj.weight": (H * K, K),
        f"{a}.o_norm.weight": (K,), f"{a}.o_proj.weight": (d, H * K),
    })
    return shapes


class WeightSource(Protocol):
    """Where weights come from. ``get`` returns ``name``'s slice ``[rows, cols]`` of a tensor whose
    full shape is ``shape``, on ``device`` in ``dtype`` (cols only for 2-D tensors)."""

    def get(self, name: str, shape: Sequence[int], *, rows: slice | None = None,
            cols: slice | None = None, device=None, dtype=None) -> torch.Tensor: ...


class BlockScaledSource(WeightSource, Protocol):
    """A source that can also hand out FP8 block-scaled weights as stored: ``get_block_scaled``
    returns ``name``'s slice ``[rows, cols]`` (full shape ``shape``) as its e4m3 codes and the scale
    blocks covering it (:class:`~splash_core.model.fp8_blocks.BlockScaledFP8`), on ``device``."""

    def get_block_scaled(self, name: str, shape: Sequence[int], *, rows: slice | None = None,
                         cols: slice | None = None, device=None) -> BlockScaledFP8: ...


def _take(t: torch.Tensor, rows: slice | None, cols: slice | None) -> torch.Tensor:
    if rows is not None:
        t = t[rows]
    if cols is not None:
        t = t[:, cols]
    return t


class SeededWeights:
    """Weights drawn from ``seed``: each tensor from its own generator seeded by (seed, name).

    Linear weights are N(0, 1/fan_in) so activations keep unit scale through the stack; norm
    weights are 1 + N(0, 0.1²) so a missing norm weight shows in the output; the embedding is
    N(0, 1)."""

    def __init__(self, seed: int = 0):
        self.seed = int(seed)

    def get(self, name, shape, *, rows=None, cols=None, device=None, dtype=None):
        device = torch.device(device or "cpu")
        gen = torch.Generator(device=device)
        gen.manual_seed(zlib.crc32(f"{self.seed}:{name}".encode()))
        full = torch.randn(tuple(shape), generator=gen, device=device, dtype=torch.float32)
        if "norm" in name:
            full = 1.0 + 0.1 * full
        elif len(shape) == 2 and "embed_tokens" not in name:
            full = full / math.sqrt(shape[1])
        return _take(full, rows, cols).to(dtype or torch.float32).contiguous()


class RoundedWeights:
    """Another source's weights rounded to the compute format ``dtype``, so a float32 reference
    computes with exactly the weights a low-precision model holds and only the arithmetic differs."""

    def __init__(self, source: WeightSource, dtype: torch.dtype):
        self.source, self.dtype = source, dtype

    def get(self, name, shape, *, rows=None, cols=None, device=None, dtype=None):
        t = self.source.get(name, shape, rows=rows, cols=cols, device=device, dtype=self.dtype)
        return t.to(dtype or torch.float32)


class SafetensorsWeights:
    """Weights read lazily from one or more ``.safetensors`` files (a file or a directory)."""

    def __init__(self, path: str | Path):
        from safetensors import safe_open

        path = Path(path)
        files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
        if not files or not all(f.is_file() for f in files):
            raise FileNotFoundError(f"no safetensors checkpoint at {path}")
        self._handles = {}
        self._where: dict[str, str] = {}
        for f in files:
            handle = safe_open(str(f), framework="pt")
            self._handles[str(f)] = handle
            for key in handle.keys():
                self._where[key] = str(f)

    def get(self, name, shape, *, rows=None, cols=None, device=None, dtype=None):
        if name not in self._where:
            raise KeyError(f"checkpoint has no tensor {name!r} ({len(self._where)} tensors)")
        part = self._handles[self._where[name]].get_slice(name)
        got = tuple(part.get_shape())
        if got != tuple(shape):
            raise ValueError(f"checkpoint tensor {name!r} has shape {list(got)}, the model profile expects {list(shape)}")
        if rows is None and cols is None:
            t = part[:]
        elif cols is None:
            t = part[rows]
        else:
            t = part[rows or slice(None), cols]
        return t.to(device=device or "cpu", dtype=dtype or t.dtype).contiguous()


def save_checkpoint(source: WeightSource, profile: ModelProfile, path: str | Path,
                    layers: int | None = None, dtype=torch.float32) -> Path:
    """Write every tensor of the first ``layers`` layers from ``source`` to one safetensors file."""
    from safetensors.torch import save_file

    tensors = {name: source.get(name, shape, dtype=dtype) for name, shape in tensor_shapes(profile, layers).items()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))
    return path


def head_shard(heads: int, rank: int, T: int) -> range:
    """Heads of rank ``rank`` in a sharded layout: ``[rank H/T, (rank + 1) H/T)``."""
    if heads % T:
        raise ValueError(f"{heads} heads do not split over T = {T} ranks")
    per = heads // T
    return range(rank * per, (rank + 1) * per)


class HeadShardedLayer:
    """What every attention layer kind shares: ``index``, ``rank``, ``T``, ``layout`` and
    ``weights`` (an object with ``heads`` and ``total_heads``), and taking a new layout."""

    index: int
    rank: int
    T: int
    layout: Layout
    weights: object

    weights_version: int = 0  # bumped whenever the layer takes other weights (captured graphs read their addresses)

    def set_layout(self, layout: Layout, weights=None) -> None:
        """Compute in ``layout`` from now on, with ``weights`` (or the current ones) checked to
        fit its placement: this rank's head shard when sharded, all heads when replicated
        (ValueError otherwise)."""
        weights = self.weights if weights is None else weights
        want = (head_shard(weights.total_heads, self.rank, self.T) if layout.placement is Placement.SHARDED
                else range(weights.total_heads))
        if weights.heads != want:
            raise ValueError(f"layer {self.index}: {layout} on rank {self.rank} needs heads {want}, "
                             f"the weights hold {weights.heads}")
        if weights is not getattr(self, "weights", None):
            self.weights_version += 1
        self.layout, self.weights = layout, weights


def even_shard(size: int, rank: int, T: int) -> range:
    """Rank ``rank``'s part of ``size`` rows split into shards of ceil(size / T) (the last ones
    short or empty): the LM head's vocabulary and the dense MLP's intermediate width."""
    per = -(-size // T)
    return range(min(rank * per, size), min((rank + 1) * per, size))
