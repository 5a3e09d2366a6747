"""FlashMLA's dense decode (the ``sgl-flash-mla`` wheel, an optional dependency) as an MLA
decode kernel of the Hopper backend.

FlashMLA reads a request's keys from its block table in order and attends to the first
``cache_seqlens`` of them. SPLASH's block tables list the pages a request holds on this rank,
ascending by position and -1 padded (every layout, CP's every-T-th page included), and in a
decode step only the request's last page can be partly written, so the keys a row may see are
exactly the first ``sum over its pages of clamp(row_pos + 1 - page * page_size, 0, page_size)``.
Attention is a sum over keys, so the pages' positions need not be consecutive.

FlashMLA serves bf16 caches of 64-token pages with 576-wide keys (512 latent + 64 rotary) and
one query row per request; any other call goes to the fallback (the Triton kernel).

Scaled-fp8 caches (uint8 pages of 656-byte entries: DeepSeek-V3.2's format, which is FlashMLA's
own) go to FlashMLA's fp8 decode, which FlashMLA offers only as sparse attention: each row gets
as its "top-k" the flat cache slot (page * 64 + offset) of every key it sees, -1 for the rest
(:func:`visible_slots`), so it attends to exactly the keys the dense call would. That kernel
is built for 64 and 128 query heads; other head counts go to the fallback.

FlashMLA schedules a call's work from its rows' key counts (a small kernel of its own, and the
counts are a few more): every layer of a step passes the same row tensors, and in one layout every
layer holds the same positions of each request, so the counts and the schedule are made by the
first layer of a step and reused by the others (FlashMLA documents reusing a schedule across calls
of equal shapes and lengths; SGLang makes one per batch).

DeepSeek Sparse Attention (:func:`sparse`): bf16 caches go to FlashMLA's sparse prefill kernel,
scaled-fp8 caches to the same fp8 sparse decode in decode steps and to the sparse prefill kernel on
a bf16 copy of their pages in prefill, each row's indexer-selected slots as its indices.
"""

from __future__ import annotations

import importlib.util

import torch

from splash_core.kernels.tensor_memo import TensorMemo

PAGE = 64
KEY_WIDTH, VALUE_WIDTH = 576, 512
FP8_TOKEN_BYTES = 656  # 512 e4m3 + 4 float32 scales + 64 bf16
FP8_HEADS = (64, 128)


def missing_reason() -> str | None:
    """None when the wheel can be imported here, else why not (cheap: no import)."""
    if importlib.util.find_spec("flash_mla") is None:
        return "sgl-flash-mla is not installed (pip install 'splash-backend-hopper[flashmla]')"
    return None


def serves(q, kv_cache, v_dim: int) -> bool:
    """Whether FlashMLA's dense decode can take this call."""
    return (q.dtype == torch.bfloat16 and kv_cache.dtype == torch.bfloat16 and kv_cache.shape[1] == PAGE
            and kv_cache.shape[2] == KEY_WIDTH and q.shape[-1] == KEY_WIDTH and v_dim == VALUE_WIDTH
            and q.shape[1] <= 128)


def serves_fp8(q, kv_cache, v_dim: int) -> bool:
    """Whether FlashMLA's fp8 (sparse) decode can take this call on a scaled-fp8 cache."""
    return (q.dtype == torch.bfloat16 and kv_cache.dtype == torch.uint8 and kv_cache.shape[1] == PAGE
            and kv_cache.shape[2] == FP8_TOKEN_BYTES and q.shape[-1] == KEY_WIDTH and v_dim == VALUE_WIDTH
            and q.shape[1] in FP8_HEADS)


def visible_slots(block_table, page_index, row_pos, page_size: int) -> torch.Tensor:
    """Per row, the flat cache slot of each listed key it sees, -1 for the others (``int32``
    [N, P * page_size]): FlashMLA's sparse ``indices`` for a dense call."""
    offsets = torch.arange(page_size, device=block_table.device)
    seen = (row_pos[:, None].long() + 1 - page_index.long() * page_size).clamp(0, page_size)  # [N, P]
    visible = (offsets < seen[..., None]) & (block_table >= 0)[..., None]
    slots = block_table.long()[..., None] * page_size + offsets
    return torch.where(visible, slots, -1).reshape(block_table.shape[0], -1).to(torch.int32)


def visible_keys(block_table, page_index, row_pos, page_size: int) -> torch.Tensor:
    """Per row, how many of its listed keys it sees (``int32``), as FlashMLA's ``cache_seqlens``."""
    seen = (row_pos[:, None].long() + 1 - page_index.long() * page_size).clamp(0, page_size)
    return torch.where(block_table >= 0, seen, 0).sum(dim=1).to(torch.int32)


def decode(fallback):
    """An ``MLAKernels.decode`` that runs FlashMLA where :func:`serves` says it can, else ``fallback``."""
    from flash_mla import flash_mla_with_kvcache, get_mla_metadata

    step = TensorMemo()  # what the step's row tensors decide: row indices, key counts, schedule

    def dense_plan(block_table, page_index, row_req, row_pos, page_size: int):
        req = row_req.long()
        seqlens = visible_keys(block_table[req], page_index[req], row_pos, page_size)
        return req, seqlens, (seqlens == 0)[:, None], get_mla_metadata()[0]

    def run(q, kv_cache, block_table, page_index, row_req, row_pos, scale, v_dim):
        if serves_fp8(q, kv_cache, v_dim):
            return fp8(q, kv_cache, block_table, page_index, row_req, row_pos, scale, v_dim)
        if not serves(q, kv_cache, v_dim):
            return fallback(q, kv_cache, block_table, page_index, row_req, row_pos, scale, v_dim)
        req, seqlens, empty, schedule = step.get(
            (row_req, row_pos), ("dense", q.shape[1], kv_cache.shape[1], block_table.shape[1]),
            lambda: dense_plan(block_table, page_index, row_req, row_pos, kv_cache.shape[1]))
        out, lse = flash_mla_with_kvcache(
            q.unsqueeze(1).contiguous(), kv_cache.unsqueeze(2), block_table[req].clamp_(min=0), seqlens, v_dim,
            schedule, softmax_scale=scale, causal=False, use_legacy=True)
        out, lse = out[:, 0], lse[:, :, 0].float()
        # no visible key: out 0 and lse -inf, as the contract says
        return out.masked_fill(empty[..., None], 0), lse.masked_fill(empty, float("-inf"))

    def fp8(q, kv_cache, block_table, page_index, row_req, row_pos, scale, v_dim):
        req, schedule = step.get((row_req, row_pos), ("fp8", q.shape[1], block_table.shape[1]),
                                 lambda: (row_req.long(), get_mla_metadata()[0]))
        slots = visible_slots(block_table[req], page_index[req], row_pos, kv_cache.shape[1])
        out, lse = flash_mla_with_kvcache(
            q.unsqueeze(1).contiguous(), kv_cache.view(torch.float8_e4m3fn).unsqueeze(2), None, None, v_dim,
            schedule, softmax_scale=scale, causal=False, is_fp8_kvcache=True,
            indices=slots.unsqueeze(1).contiguous(), use_legacy=True, kv_format="V32")
        out, lse = out[:, 0], lse[:, :, 0].float()
        empty = (slots < 0).all(dim=1)[:, None]
        return out.masked_fill(empty[..., None], 0), lse.masked_fill(empty, float("-inf"))

    return run


SPARSE_TOPK_MULTIPLE = 64  # FlashMLA's sparse kernels take the top-k axis in blocks of 64


def flat_slots(block_table, row_req, slots, page_size: int) -> torch.Tensor:
    """SPLASH's per-request key ``slots`` [N, K] (table slot * page_size + offset, -1 pads) as
    FlashMLA's flat cache indices (physical page * page_size + offset, -1 where none), the top-k
    axis padded with -1 to a multiple of :data:`SPARSE_TOPK_MULTIPLE` (``int32`` [N, K'])."""
    table_slot = slots.long() // page_size
    listed = (slots >= 0) & (table_slot < block_table.shape[1])
    page = block_table.long()[row_req.long()[:, None], torch.where(listed, table_slot, 0)]
    flat = torch.where(listed & (page >= 0), page * page_size + slots.long() % page_size, -1).to(torch.int32)
    pad = -flat.shape[1] % SPARSE_TOPK_MULTIPLE
    return torch.nn.functional.pad(flat, (0, pad), value=-1) if pad or flat.shape[1] == 0 else flat


def serves_sparse(q, kv_cache, v_dim: int) -> bool:
    """Whether FlashMLA's sparse prefill kernel can take this call on a bf16 cache (any page size:
    it reads the cache as one flat key axis)."""
    return (q.dtype == torch.bfloat16 and kv_cache.dtype == torch.bfloat16 and kv_cache.shape[2] == KEY_WIDTH
            and q.shape[-1] == KEY_WIDTH and v_dim == VALUE_WIDTH and q.shape[1] in FP8_HEADS)


def sparse(fallback):
    """An ``MLAKernels.sparse`` on FlashMLA: bf16 caches through its sparse prefill kernel (decode
    rows are prefill rows of one token), scaled-fp8 caches of 64-token pages through its fp8
    sparse decode in decode steps and, in prefill, its sparse prefill kernel on a bf16 copy of the
    call's pages (:mod:`splash_core.kernels.dsa_dequantized`); any other call goes to ``fallback``
    (the Triton kernel)."""
    from flash_mla import flash_mla_sparse_fwd, flash_mla_with_kvcache, get_mla_metadata

    from splash_core.kernels.dsa_dequantized import prefill_on_dequantized

    step = TensorMemo()  # the fp8 decode's schedule: it depends on the shapes alone

    def run(q, kv_cache, block_table, row_req, slots, scale, v_dim):
        fp8 = serves_fp8(q, kv_cache, v_dim)
        if not (fp8 or serves_sparse(q, kv_cache, v_dim)) or q.shape[0] == 0:
            return fallback(q, kv_cache, block_table, row_req, slots, scale, v_dim)
        flat = flat_slots(block_table, row_req, slots, kv_cache.shape[1])
        if fp8:
            schedule = step.get((row_req,), (q.shape[1], flat.shape[1]), lambda: get_mla_metadata()[0])
            out, lse = flash_mla_with_kvcache(
                q.unsqueeze(1).contiguous(), kv_cache.view(torch.float8_e4m3fn).unsqueeze(2), None, None, v_dim,
                schedule, softmax_scale=scale, causal=False, is_fp8_kvcache=True,
                indices=flat.unsqueeze(1).contiguous(), use_legacy=True, kv_format="V32")
            out, lse = out[:, 0], lse[:, :, 0].float()
        else:
            # the legacy build holds the sm_90 sparse prefill kernel (the current one is sm_100 only)
            out, _, lse = flash_mla_sparse_fwd(q.contiguous(), kv_cache.view(-1, 1, KEY_WIDTH), flat.unsqueeze(1),
                                               scale, v_dim, use_legacy=True)
            lse = lse.float()
        empty = (flat < 0).all(dim=1)[:, None]  # nothing selected: out 0 and lse -inf, as the contract says
        return out.masked_fill(empty[..., None], 0), lse.masked_fill(empty, float("-inf"))

    return prefill_on_dequantized(run)
