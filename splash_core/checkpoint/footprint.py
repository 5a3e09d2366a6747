"""What one rank holds of a model's weights, derived from the tensors the runtime reads, as stored.

The tensor list is :func:`~splash_core.model.weights.tensor_shapes` (what the runtime's model
loads); how each is stored comes from the checkpoint's safetensors headers where the folder has
weights (dtype, shape and the ``weight_scale_inv`` grid; no tensor data is read), else from its
config.json alone, by DeepSeek's published FP8 rule: with a ``quantization_config``, the linear
weights of attention (the DSA indexer's ``wq_b`` and ``wk`` included), dense MLPs, shared and routed
experts are e4m3 with one float32 scale per block; embeddings, the LM head, norms, the router and
the indexer's ``weights_proj`` are not.

A rank's slice of each tensor follows the runtime's placement rules:

- head-indexed attention projections (Q-B, KV-B, O; KDA's per-head tensors but its convolution
  taps): head shard r of T in TP and DOP, all heads in DP and CP (:mod:`splash_core.runtime.model`);
- the rest of attention (Q-A, KV-A, the indexer, norms, KDA's taps): whole on every rank;
- dense MLPs and shared experts: rows (gate, up) and columns (down) ``even_shard(width, r, T)``
  (shared experts whole where the deployment's MoE layers dispatch by all-to-all);
- routed experts: whole experts ``even_shard(E, r, T)`` (expert parallel);
- router weight and bias: whole, in float32 whatever the compute format;
- embedding: whole; LM head: ``ceil(V / T)`` rows (the last shard padded with zeros).

Each slice is counted twice: as the runtime holds it today (dequantized to the compute format)
and as a runtime that keeps FP8 tensors FP8 would (codes plus the scale blocks the slice touches).
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
from pathlib import Path

from .. import dtypes
from ..layouts import Layout, Placement
from ..model.fp8_blocks import BLOCK
from ..model.weights import even_shard, tensor_shapes
from ..profiles.checkpoint_config import profile_fields
from ..profiles.checkpoint_family import CheckpointError
from ..profiles.model import ModelProfile
from .fp8 import stored_fp8
from .tiny import ensure_written

HEAD_INDEXED = "attention (head-indexed)"  # the projections layouts shard or replicate (W_A of Eq 1)
PARTS = (HEAD_INDEXED, "attention (replicated)", "experts", "mlp", "embed/head", "norms")
FP8 = "F8_E4M3"
_EXPERT = re.compile(r"model\.layers\.\d+\.mlp\.experts\.(\d+)\.")
_HEADS_ROWS = re.compile(r".*\.self_attn\.(q_b_proj|q_proj|kv_b_proj|[qkv]_proj|f_b_proj|g_b_proj|b_proj)"
                         r"\.weight|.*\.self_attn\.dt_bias")
_HEADS_COLS = re.compile(r".*\.self_attn\.o_proj\.weight")
_WIDTH = re.compile(r".*\.mlp\.(shared_experts\.)?(gate|up|down)_proj\.weight")
_ROUTER = re.compile(r".*\.mlp\.gate\.(weight|e_score_correction_bias)")


@dataclasses.dataclass(frozen=True)
class StoredTensor:
    """How a checkpoint stores one tensor: safetensors dtype code, full shape, FP8 block (or None)."""

    dtype: str
    shape: tuple[int, ...]
    block: tuple[int, int] | None = None


def _read_header(file: Path) -> dict:
    """A safetensors file's header (name -> dtype, shape, offsets), read without its data."""
    try:
        with file.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
    except (OSError, ValueError, struct.error) as exc:
        raise CheckpointError(str(file), "(header)", f"cannot read a safetensors header: {exc}") from None
    header.pop("__metadata__", None)
    return header


def _headers(folder: Path) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(_read_header(file))
    return out


def stored_tensors(profile: ModelProfile, layers: int | None = None, compute_dtype: str = "bf16",
                   seeded_fp8: bool = False) -> tuple[dict[str, StoredTensor], str]:
    """(runtime tensor name -> how it is stored, where that came from in words) for every tensor
    the runtime reads for the first ``layers`` layers. A profile without a checkpoint folder
    stores them by the FP8 rule where its ``weight_dtype`` is fp8 or the deployment keeps weights
    FP8 (``seeded_fp8``: its seeded source then draws them so), else in the compute format."""
    shapes = tensor_shapes(profile, layers)
    written = ensure_written(profile)  # a builtin checkpoint is written on first use, as for its readers
    folder = Path(written).expanduser() if written else None
    if folder is None:  # a profile's weight_dtype fp8 means DeepSeek's FP8 format (128 x 128 blocks)
        stand_in = ("; its MoE layers run a dense MLP stand-in (runtime_experts: false): pass --model DIR "
                    "(a config.json is enough) for the real experts") if profile.moe and not profile.runtime_experts \
            else ""
        fp8 = seeded_fp8 or profile.weight_dtype == "fp8"
        return (_by_rule(shapes, (BLOCK, BLOCK) if fp8 else None, compute_dtype),
                f"model profile {profile.name!r} (no checkpoint: weights {profile.weight_dtype}{stand_in})")
    _, facts = profile_fields(folder)
    block, rename = facts["fp8_block"], facts["stored_name"]
    headers = _headers(folder)
    if not headers:  # config.json alone: the tensors the loader would read, by the FP8 rule
        rule = "FP8 by DeepSeek's rule" if block else profile.weight_dtype
        return _by_rule(shapes, block, profile.weight_dtype), f"{folder / 'config.json'} (no safetensors: {rule})"
    out = {}
    for name, shape in shapes.items():
        stored = rename(name)
        if stored not in headers and name == "lm_head.weight" and facts["tie_word_embeddings"]:
            stored = rename("model.embed_tokens.weight")
        if stored not in headers:
            raise CheckpointError(str(folder), stored, "tensor missing from the checkpoint's safetensors headers")
        head = headers[stored]
        if tuple(head["shape"]) != tuple(shape):
            raise CheckpointError(str(folder), stored, f"shape {head['shape']} disagrees with config.json, "
                                  f"which implies {list(shape)}")
        quantized = head["dtype"] == FP8 and block is not None and f"{stored}_scale_inv" in headers
        out[name] = StoredTensor(head["dtype"], tuple(shape), block if quantized else None)
    return out, f"safetensors headers in {folder}"


def _by_rule(shapes: dict, block: tuple[int, int] | None, other: str) -> dict[str, StoredTensor]:
    """Stored formats by the FP8 rule (``block`` None: nothing quantized), the rest in ``other``."""
    code = {"fp32": "F32", "fp16": "F16"}.get(other, "BF16")
    return {n: StoredTensor(FP8, s, block) if block and stored_fp8(n) else StoredTensor(code, s)
            for n, s in shapes.items()}


@dataclasses.dataclass(frozen=True)
class Held:
    """Bytes of one part on one rank: as the runtime holds them today, and FP8-kept."""

    runtime: int = 0
    fp8: int = 0

    def __add__(self, other: "Held") -> "Held":
        return Held(self.runtime + other.runtime, self.fp8 + other.fp8)


def _slice_held(t: StoredTensor, rows: range, cols: range | None, held_bytes: int) -> Held:
    """One rank's slice ``[rows, cols]`` of ``t`` (cols None: every column, or a 1-D tensor)."""
    n_cols = 1
    for dim in t.shape[1:]:
        n_cols *= dim
    width = n_cols if cols is None else len(cols)
    elements = len(rows) * width
    runtime = elements * held_bytes
    if t.block is None or not elements:  # only FP8 tensors would be kept as stored
        return Held(runtime, runtime)
    b0, b1 = t.block
    cols = range(n_cols) if cols is None else cols
    grid = (-(-rows.stop // b0) - rows.start // b0) * (-(-cols.stop // b1) - cols.start // b1)
    return Held(runtime, elements + 4 * grid)  # e4m3 codes + float32 scales of every block touched


def _part_and_slice(name: str, t: StoredTensor, rank: int, T: int, sharded: bool, shared_whole: bool = False):
    """(part, rows, cols) of tensor ``name`` on ``rank`` (rows empty: the rank holds none of it);
    ``shared_whole``: shared experts whole on every rank (MoE dispatch by all-to-all)."""
    rows_all = range(t.shape[0])
    if name == "model.embed_tokens.weight":
        return "embed/head", rows_all, None
    if name == "lm_head.weight":
        return "embed/head", even_shard(t.shape[0], rank, T), None
    if _ROUTER.fullmatch(name):
        return "mlp", rows_all, None
    if _WIDTH.fullmatch(name) and shared_whole and ".shared_experts." in name:
        return "mlp", rows_all, None
    if _WIDTH.fullmatch(name):
        down = name.endswith("down_proj.weight")
        cut = even_shard(t.shape[1] if down else t.shape[0], rank, T)
        return ("mlp", rows_all, cut) if down else ("mlp", cut, None)
    if "norm" in name.rsplit(".", 2)[-2] and ".indexer." not in name:
        return "norms", rows_all, None
    if _HEADS_COLS.fullmatch(name) or name.endswith(".A_log"):  # O [d, H V]; KDA's A_log [1, 1, H, 1]
        per = (t.shape[-1] if _HEADS_COLS.fullmatch(name) else t.shape[2]) // T
        return "attention (head-indexed)", rows_all, range(rank * per, (rank + 1) * per) if sharded else None
    if _HEADS_ROWS.fullmatch(name):
        per = t.shape[0] // T
        return "attention (head-indexed)", range(rank * per, (rank + 1) * per) if sharded else rows_all, None
    return "attention (replicated)", rows_all, None


class RankWeights:
    """Every rank's weights by part: built once per model (routed experts summed per expert id,
    so a rank's share is a sum over its experts), asked per layout and rank."""

    def __init__(self, profile: ModelProfile, tensors: dict[str, StoredTensor], T: int, compute_dtype: str,
                 shared_whole: bool = False):
        self.profile, self.T, self.compute = profile, T, dtypes.nbytes(compute_dtype)
        self.shared_whole = shared_whole
        experts = profile.moe.n_routed_experts if profile.moe is not None else 0
        self.per_expert = [Held() for _ in range(experts)]
        self.others: list[tuple[str, StoredTensor]] = []
        for name, t in tensors.items():
            expert = _EXPERT.match(name)
            if expert:
                self.per_expert[int(expert.group(1))] += _slice_held(t, range(t.shape[0]), None, self.compute)
            else:
                self.others.append((name, t))
        self.head = tensors.get("lm_head.weight")

    def held(self, layout: Layout, rank: int) -> dict[str, Held]:
        """Bytes per part (:data:`PARTS`) that ``rank`` holds in ``layout``."""
        sharded = layout.placement is Placement.SHARDED
        out = {part: Held() for part in PARTS}
        for j in even_shard(len(self.per_expert), rank, self.T):
            out["experts"] += self.per_expert[j]
        for name, t in self.others:
            part, rows, cols = _part_and_slice(name, t, rank, self.T, sharded, self.shared_whole)
            out[part] += _slice_held(t, rows, cols, 4 if _ROUTER.fullmatch(name) else self.compute)
        if self.head is not None:  # the last shards are padded to ceil(V / T) rows
            v, d = self.head.shape
            pad = (-(-v // self.T) - len(even_shard(v, rank, self.T))) * d * self.compute
            out["embed/head"] += Held(pad, pad)
        return out

    def busiest(self, layout: Layout) -> tuple[int, dict[str, Held]]:
        """(rank, its parts) of the rank holding the most bytes in ``layout`` as the runtime holds them."""
        ranks = [self.held(layout, r) for r in range(self.T)]
        rank = max(range(self.T), key=lambda r: sum(h.runtime for h in ranks[r].values()))
        return rank, ranks[rank]
