"""DeepSeek Sparse Attention's lightning indexer in Triton: scores of every visible key, then top-k.

Key ``j`` of query row ``i`` scores ``sum_h w[i, h] * ReLU(scale * q[i, h] . k[j])``: ``k`` is the one
indexer key per token, kept in pages beside the latent cache (``[pages, page_size, dim]``, the
same physical pages, so the block table and page index of the MLA kernels find them), ``q``
the per-head indexer queries and ``w`` the per-head weights with every factor the model applies
already in them (DeepSeek-V3.2 multiplies its weight projection by ``heads ** -0.5``; ``scale``
is the indexer's ``head_dim ** -0.5``). A key is visible to a row when its page is held
(not -1) and its position is at or before the row's.

Keys are named by their *slot* in the request's table: ``slot * page_size + offset``, the order
the block table lists them. That is what :mod:`.dsa_attention` gathers by, and it needs no
inverse of the page index, so a CP rank holding every other page, or a table with holes,
scores and selects its own keys exactly as a whole history would. A key's position is
``page_index[req, slot] * page_size + offset`` (:func:`splash_core.model.dsa_slots.key_positions`).

A program scores ``tile.rows`` rows against ``tile.keys`` keys of one request: the key tile is
loaded once and every (rows x head block) dot reads it, so a prefill chunk's rows share their keys
on the matrix units ([rows x heads, dim] x [dim, keys] per head block, the heads then summed per
row). A block of rows spanning two requests takes one pass per request (rows of the others
masked); decode steps (a row per request) take one-row tiles of all heads (:func:`indexer_tile`). A uint8 key cache holds the stored scaled-fp8 indexer format
(:func:`splash_core.model.kv_format.indexer_layout`: e4m3 codes, then float32 group scales, no
rotary part), dequantized right after the load as :mod:`.attention` reads its latent. Selection
is not here: it is :func:`splash_core.model.dsa_slots.top_k_slots` over the score rows (a stable
sort, so equal scores rank by position as on every layout). The score rows are materialized (4
bytes a row and key slot: a 128K history costs 512 KiB a row), so a long prefill chunk is scored
a block of rows at a time by its caller.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..model.kv_format import ScaledFP8
from .attention import _index, _latent_keys
from .config import AttentionTile, block, decode_shaped

DECODE_INDEXER_TILE = AttentionTile(rows=1, heads=64, keys=64, warps=4, stages=2)
PREFILL_INDEXER_TILE = AttentionTile(rows=16, heads=16, keys=64, warps=8, stages=2)


def indexer_tile(rows: int, table_rows: int) -> AttentionTile:
    """The tile of a call of ``rows`` query rows over a table of ``table_rows`` requests: one row a
    program where there is about one row a request (decode), blocks of a chunk's rows otherwise."""
    return DECODE_INDEXER_TILE if decode_shaped(rows, table_rows) else PREFILL_INDEXER_TILE


@triton.jit(do_not_specialize=["heads", "table_width", "num_rows", "s_bt", "s_pi", "s_sn"])
def _indexer_kernel(
    Q, W, K, BlockTable, PageIndex, RowReq, RowPos, Scores,
    scale, heads, table_width, num_rows,
    s_qn, s_qh, s_wn, s_kp, s_kt, s_bt, s_pi, s_sn,
    PAGE_SIZE: tl.constexpr, DIM: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr,
    HEADS: tl.constexpr, KEYS: tl.constexpr, PRECISION: tl.constexpr, SCALE_GROUPS: tl.constexpr,
):
    key = tl.program_id(0) * KEYS + tl.arange(0, KEYS)
    first = tl.program_id(1) * ROWS
    rows = first + tl.arange(0, ROWS)
    row_ok = rows < num_rows
    reqs = tl.load(RowReq + rows, mask=row_ok, other=-1)
    pos = tl.load(RowPos + rows, mask=row_ok, other=-1)
    in_range = key < table_width * PAGE_SIZE
    slot = key // PAGE_SIZE
    offset = key % PAGE_SIZE
    d = tl.arange(0, BLOCK_D)
    lane = tl.arange(0, ROWS * HEADS)  # (row, head) pairs of one head block, row major
    lane_row = first + lane // HEADS
    for i in range(ROWS):  # one pass per request starting in the block (one for a block of one request)
        req = tl.load(RowReq + first + i, mask=first + i < num_rows, other=-1)
        before = tl.load(RowReq + first + i - 1, mask=(i > 0) & (first + i < num_rows), other=-1)
        if (req >= 0) & ((i == 0) | (req != before)):
            mine = row_ok & (reqs == req)
            page = tl.load(BlockTable + req.to(tl.int64) * s_bt + slot, mask=in_range, other=-1)
            key_pos = tl.load(PageIndex + req.to(tl.int64) * s_pi + slot, mask=in_range, other=0) * PAGE_SIZE + offset
            held = in_range & (page >= 0)
            k_base = K + page.to(tl.int64)[:, None] * s_kp + offset.to(tl.int64)[:, None] * s_kt
            keys = _latent_keys(k_base, d, held[:, None] & (d < DIM)[None, :], DIM, SCALE_GROUPS,
                                Q.dtype.element_ty)
            lane_ok = (lane_row < num_rows) & (tl.load(RowReq + lane_row, mask=lane_row < num_rows, other=-1) == req)
            total = tl.zeros([ROWS, KEYS], tl.float32)
            for h0 in range(0, heads, HEADS):
                head = h0 + lane % HEADS
                ok = lane_ok & (head < heads)
                q = tl.load(Q + lane_row.to(tl.int64)[:, None] * s_qn + head.to(tl.int64)[:, None] * s_qh + d[None, :],
                            mask=ok[:, None] & (d < DIM)[None, :], other=0.0)
                w = tl.load(W + lane_row.to(tl.int64) * s_wn + head, mask=ok, other=0.0).to(tl.float32)
                s = tl.dot(q, tl.trans(keys), input_precision=PRECISION)  # [ROWS * HEADS, KEYS]
                total += tl.sum(tl.reshape(tl.maximum(s * scale, 0.0) * w[:, None], [ROWS, HEADS, KEYS]), 1)
            visible = held[None, :] & (key_pos[None, :] <= pos[:, None])
            tl.store(Scores + rows.to(tl.int64)[:, None] * s_sn + key[None, :], tl.where(visible, total, float("-inf")),
                     mask=mine[:, None] & in_range[None, :])


def indexer_scores(q, weights, index_keys, block_table, page_index, row_req, row_pos, scale, *,
                   tile: AttentionTile | None = None):
    """Scores ``[N, table_width * page_size]`` float32 of every key slot for each query row, -inf
    where the key is not visible. ``q`` [N, H, D], ``weights`` [N, H], ``index_keys``
    [pages, page_size, D] (or uint8 scaled-fp8 bytes; unit channel stride), tables and rows as the
    MLA kernels take them; ``tile`` (None: :func:`indexer_tile`)."""
    scaled = index_keys.dtype == torch.uint8
    if q.dim() != 3 or index_keys.dim() != 3 or (q.shape[2] != index_keys.shape[2] and not scaled):
        raise ValueError(f"q [N, H, D] and index_keys [pages, page_size, D] must share D "
                         f"(got {tuple(q.shape)} and {tuple(index_keys.shape)})")
    groups = ScaledFP8.of_width(index_keys.shape[2], q.shape[2], 0).groups if scaled else 0
    if weights.shape != q.shape[:2]:
        raise ValueError(f"weights must be [N, H] = {tuple(q.shape[:2])} (got {tuple(weights.shape)})")
    if index_keys.stride(2) != 1:
        raise ValueError("index_keys needs a unit channel stride")
    tile = tile or indexer_tile(q.shape[0], block_table.shape[0])
    if tile.value_split != 1:
        raise ValueError(f"indexer tile {tile.label()}: no value split")
    block_table = _index(block_table, "block_table", 2)
    page_index = _index(page_index, "page_index", 2)
    row_req, row_pos = _index(row_req, "row_req", 1), _index(row_pos, "row_pos", 1)
    q = q if q.stride(2) == 1 else q.contiguous()
    weights = weights.contiguous()
    rows, heads, dim = q.shape
    table_width = block_table.shape[1]
    page_size = index_keys.shape[1]
    scores = torch.empty(rows, table_width * page_size, dtype=torch.float32, device=q.device)
    if scores.numel() == 0 or heads == 0:
        return scores.fill_(float("-inf"))
    # key tiles first: the programs of one block of rows run together and share its queries in cache
    grid = (triton.cdiv(table_width * page_size, tile.keys), triton.cdiv(rows, tile.rows))
    _indexer_kernel[grid](
        q, weights, index_keys, block_table, page_index, row_req, row_pos, scores,
        float(scale), heads, table_width, rows,
        q.stride(0), q.stride(1), weights.stride(0), index_keys.stride(0), index_keys.stride(1),
        block_table.stride(0), page_index.stride(0), scores.stride(0),
        PAGE_SIZE=page_size, DIM=dim, BLOCK_D=block(dim), ROWS=tile.rows, HEADS=tile.heads, KEYS=tile.keys,
        PRECISION="ieee" if q.dtype == torch.float32 else None, SCALE_GROUPS=groups,
        num_warps=tile.warps, num_stages=tile.stages,
    )
    return scores
