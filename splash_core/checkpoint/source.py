"""A checkpoint folder as the runtime's weight source (the slice-reading interface of
:class:`~splash_core.model.weights.WeightSource`).

Tensors are found through ``model.safetensors.index.json`` when the folder has one, else in
every ``*.safetensors`` file (headers only are read to list them). ``get`` reads exactly the
slice asked for through safetensors' lazy ``safe_open(...).get_slice``, so a rank streams only
its shard (its heads of Q-B, KV-B and O, its experts, its part of the MLP and LM head), and
presents it as the runtime computes with it:

- FP8 block-scaled weights (:mod:`~splash_core.checkpoint.fp8`) are read with the scale blocks
  that cover the slice and dequantized on the target device, in the requested format;
- with ``rope_interleave`` the rotary rows of Q-B (or Q) and KV-A are permuted from DeepSeek's
  interleaved pairs (x0, x1), (x2, x3), ... into rotate-half order (x0, x2, ..., x1, x3, ...):
  query and key rotate alike, so their dot products, and so the model, are unchanged;
- with ``tie_word_embeddings`` and no ``lm_head.weight`` the LM head reads the embedding.

Every stored tensor must be one the model reads (or its FP8 scale), an ignored MTP layer's, or one
its family declares inert; any other is refused by name at construction, never dropped silently.

``bytes_read`` and ``seconds`` count what was read from the files, for load reports.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from ..model.fp8_blocks import BlockScaledFP8
from ..profiles.checkpoint_config import CheckpointError, profile_fields, profile_from_checkpoint
from ..profiles.checkpoint_family import COMMON_INERT_TENSORS
from . import fp8
from .fp8_blocks import read_block_scaled
from .tiny import ensure_written

_NOT_BLOCK_SCALED = ("not stored FP8 block-scaled (no weight_scale_inv, or config.json lacks quantization_config): "
                     "FFN weights kept FP8 (ffn_weights: fp8) need an FP8 checkpoint")



class CheckpointWeights:
    """Weights read lazily from a Hugging Face checkpoint folder of the DeepSeek MLA family."""

    def __init__(self, folder: str | Path, profile=None):
        from safetensors import safe_open

        self.folder = Path(folder).expanduser()
        self.profile = profile or profile_from_checkpoint(self.folder)
        _, facts = profile_fields(self.folder)
        self.block, self.tied = facts["fp8_block"], facts["tie_word_embeddings"]
        self._mtp_layers, self._inert = facts["mtp_layers"], (*COMMON_INERT_TENSORS, *facts["inert_tensors"])
        self._rename = facts["stored_name"]  # the family's tensor names (e.g. Kimi's block_sparse_moe)
        index = self.folder / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (OSError, ValueError, KeyError) as exc:
                raise CheckpointError(str(index), "weight_map", f"cannot read: {exc}") from None
            self._where = {name: str(self.folder / f) for name, f in weight_map.items()}
        else:
            files = sorted(self.folder.glob("*.safetensors"))
            if not files:
                raise CheckpointError(str(self.folder), "*.safetensors", "no weights in the checkpoint folder")
            self._where = {}
            for f in files:
                with _opened(safe_open, str(f)) as handle:
                    self._where.update(dict.fromkeys(handle.keys(), str(f)))
        self._open = safe_open
        self._handles: dict = {}
        self.bytes_read, self.seconds = 0, 0.0
        self._refuse_unmapped()

    def _refuse_unmapped(self) -> None:
        """Raise :class:`CheckpointError` naming the first stored tensor nothing maps."""
        from ..model.weights import tensor_shapes

        mapped = set(map(self._rename, tensor_shapes(self.profile)))
        mapped |= {fp8.scale_name(n) for n in mapped}
        mtp = tuple(f"model.layers.{i}." for i in self._mtp_layers)
        for name in sorted(self._where):
            if name in mapped or (mtp and name.startswith(mtp)) or any(p.fullmatch(name) for p in self._inert):
                continue
            raise CheckpointError(self._where[name], name, "tensor SPLASH does not map (refused rather than "
                                  "ignored: it may change outputs)")

    # ---- what is there ------------------------------------------------------------------

    def _slice(self, name: str):
        file = self._where.get(name)
        if file is None:
            raise CheckpointError(str(self.folder), name, "tensor missing from the checkpoint")
        if file not in self._handles:
            if not Path(file).is_file():
                raise CheckpointError(file, name, "the index names this file, which is missing")
            self._handles[file] = _opened(self._open, file)
        return self._handles[file].get_slice(name)

    def _stored(self, name: str) -> str:
        if name == "lm_head.weight" and name not in self._where and self.tied:
            return "model.embed_tokens.weight"
        return self._rename(name)

    def _quantized(self, name: str) -> bool:
        return self.block is not None and fp8.scale_name(self._stored(name)) in self._where

    def check(self, shapes: dict) -> None:
        """Raise :class:`CheckpointError` for the first tensor of ``shapes`` (name -> full shape,
        what the model reads) that is missing or whose shape disagrees (headers only)."""
        for name, shape in shapes.items():
            part = self._slice(self._stored(name))
            got = tuple(part.get_shape())
            if got != tuple(shape):
                raise CheckpointError(self._where[self._stored(name)], name,
                                      f"shape {list(got)} disagrees with config.json, which implies {list(shape)}")
            if self._quantized(name):
                grid = [-(-n // b) for n, b in zip(shape, self.block)]
                scale_name = fp8.scale_name(self._stored(name))
                scale = tuple(self._slice(scale_name).get_shape())
                if scale != tuple(grid):
                    raise CheckpointError(self._where[scale_name], scale_name,
                                          f"shape {list(scale)} is not the {self.block[0]}x{self.block[1]} block grid "
                                          f"{grid} of the weight")
            elif part.get_dtype() == "F8_E4M3":
                raise CheckpointError(self._where[self._stored(name)], name, "FP8 weight without weight_scale_inv "
                                      "(or config.json lacks quantization_config)")

    def check_block_scaled(self, names) -> None:
        """Raise :class:`CheckpointError` for the first tensor of ``names`` not stored FP8 block-scaled
        (what weights kept FP8 need; headers only)."""
        for name in names:
            if not self._quantized(name):
                raise CheckpointError(self._where.get(self._stored(name), str(self.folder)), name,
                                      _NOT_BLOCK_SCALED)

    # ---- reading ------------------------------------------------------------------------

    def _rotary_order(self, name: str, rows: int) -> np.ndarray | None:
        """Stored row of each row the runtime sees, for tensors with rotary rows when interleaved."""
        p = self.profile
        if not p.rope_interleave or p.mla is None:
            return None
        m = p.mla
        d_r = m.qk_rope_head_dim
        half = np.concatenate([np.arange(0, d_r, 2), np.arange(1, d_r, 2)])
        order = np.arange(rows)
        if name.endswith(("self_attn.q_b_proj.weight", "self_attn.q_proj.weight")):
            qk = m.qk_nope_head_dim + d_r
            for h in range(rows // qk):
                order[h * qk + m.qk_nope_head_dim: (h + 1) * qk] = h * qk + m.qk_nope_head_dim + half
            return order
        if name.endswith("self_attn.kv_a_proj_with_mqa.weight"):
            order[m.kv_lora_rank:] = m.kv_lora_rank + half
            return order
        return None

    def get(self, name, shape, *, rows=None, cols=None, device=None, dtype=None):
        t0 = time.perf_counter()
        stored = self._stored(name)
        part = self._slice(stored)
        full = tuple(part.get_shape())
        if full != tuple(shape):
            raise CheckpointError(self._where[stored], name,
                                  f"shape {list(full)} disagrees with config.json, which implies {list(shape)}")
        rows = slice(*(rows or slice(None)).indices(full[0]))
        order = self._rotary_order(name, full[0])
        pick = None
        if order is not None:
            wanted = order[rows]
            rows = slice(int(wanted.min()), int(wanted.max()) + 1) if wanted.size else slice(rows.start, rows.start)
            pick = torch.from_numpy(wanted - rows.start)
        device = torch.device(device or "cpu")
        if len(full) == 1:
            t = part[rows]
        else:
            cols = slice(*(cols or slice(None)).indices(full[1]))
            t = part[rows, cols]
        self.bytes_read += t.numel() * t.element_size()
        if self._quantized(name):
            scale = self._slice(fp8.scale_name(stored))[fp8.scale_rows(rows, self.block[0]),
                                                        fp8.scale_rows(cols, self.block[1])]
            self.bytes_read += scale.numel() * scale.element_size()
            t = fp8.dequantize(t.to(device), scale.to(device), rows, cols, self.block)
        if pick is not None:
            t = t.index_select(0, pick.to(t.device))
        out = t.to(device=device, dtype=dtype or t.dtype).contiguous()
        self.seconds += time.perf_counter() - t0
        return out

    def get_block_scaled(self, name, shape, *, rows=None, cols=None, device=None) -> BlockScaledFP8:
        """``name``'s slice [rows, cols] kept FP8 as stored: its e4m3 codes and the scale blocks that
        cover it, on ``device`` (``bytes_read`` counts both). A tensor the checkpoint does not store
        FP8 block-scaled is a :class:`CheckpointError` naming it."""
        t0 = time.perf_counter()
        stored = self._stored(name)
        full = tuple(self._slice(stored).get_shape())
        file = self._where[stored]
        if full != tuple(shape):
            raise CheckpointError(file, name, f"shape {list(full)} disagrees with config.json, which implies "
                                              f"{list(shape)}")
        if not self._quantized(name):
            raise CheckpointError(file, name, _NOT_BLOCK_SCALED)
        weight = read_block_scaled(self._handles[file], stored, rows, cols, self.block, where=file)
        self.bytes_read += weight.stored_bytes
        order = self._rotary_order(name, full[0])
        if order is not None:  # rotary rows in the runtime's order, as get gives them (inside their scale blocks)
            rows = slice(*(rows or slice(None)).indices(full[0]))
            weight = weight.rows_reordered(torch.from_numpy(order[rows] - rows.start))
        weight = weight.to(torch.device(device or "cpu"))
        self.seconds += time.perf_counter() - t0
        return weight


def _opened(safe_open, file: str):
    """``safe_open(file)``; a file that is not whole safetensors (truncated, damaged, unreadable)
    is a :class:`CheckpointError` naming it."""
    from safetensors import SafetensorError

    try:
        return safe_open(file, framework="pt")
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(file, "(file)", f"not a readable safetensors file (truncated or damaged?): "
                                              f"{exc}") from None


def weight_source(profile, seed: int = 0, keep_fp8: bool = False):
    """The weights of ``profile``: its checkpoint folder's, else drawn from ``seed`` (with
    ``keep_fp8``, the deployment keeping weights FP8, as an FP8 checkpoint would store them)."""
    folder = ensure_written(profile)
    if folder is not None:
        return CheckpointWeights(folder, profile)
    if keep_fp8:
        from .seeded_fp8 import SeededFP8Weights

        return SeededFP8Weights(seed)
    from ..model.weights import SeededWeights

    return SeededWeights(seed)
