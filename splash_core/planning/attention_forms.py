"""Which form a request's prefill rows attend in: absorbed (MQA over the latent) or expanded
(MHA over keys expanded through kv_b), chosen per request by work, as serving engines choose
for long prefills.

Absorbed attention costs 2(2 d_c + d_r) FLOPs per (query, key, head) plus the absorption of
each query row and of its output through kv_b (2 d_c (d_n + d_v) per row and head). Expanded
attention costs 2(d_n + d_r + d_v) per (query, key, head) plus the expansion of every visible
key through kv_b (2 d_c (d_n + d_v) per key and head). With DeepSeek-V3's dims (d_c 512, d_r 64,
d_n = d_v = 128) a pair costs 2,176 FLOPs absorbed and 640 expanded, and expanding a key costs as
much as absorbing a row: a fresh prompt's chunk (as many keys as rows) attends cheaper expanded
from two rows on, a chunk after a long history from about 170 rows, a decode row never. Pure: no torch, shared by the runtime and the cost model.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..profiles.deployment import FORMS


@dataclasses.dataclass(frozen=True)
class MLADims:
    """The widths that price the two forms (per head: the latent, the rotary key, the no-RoPE key, the value)."""

    d_c: int
    d_r: int
    d_n: int
    d_v: int

    @classmethod
    def of(cls, mla) -> "MLADims":
        """From a model profile's ``mla`` section."""
        return cls(mla.kv_lora_rank, mla.qk_rope_head_dim, mla.qk_nope_head_dim, mla.v_head_dim)


def pair_flops(dims: MLADims, rows: np.ndarray, contexts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(absorbed, expanded) FLOPs per head of each request's query-key pairs alone (scores and
    values, what an attention kernel computes): ``rows`` query rows at the end of a history of
    ``contexts`` tokens (this step's rows included), every row seeing the keys up to its own position."""
    rows = np.asarray(rows, dtype=np.float64)
    contexts = np.asarray(contexts, dtype=np.float64)
    pairs = rows * (contexts - (rows - 1) / 2)  # causal: row i of the chunk sees contexts - rows + i + 1 keys
    return pairs * 2 * (2 * dims.d_c + dims.d_r), pairs * 2 * (dims.d_n + dims.d_r + dims.d_v)


def form_flops(dims: MLADims, rows: np.ndarray, contexts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(absorbed, expanded) FLOPs per head of each request's attention: :func:`pair_flops` plus kv_b's
    work, absorbing each query row (absorbed) or expanding each visible key (expanded)."""
    absorbed, expanded = pair_flops(dims, rows, contexts)
    through_kv_b = 2.0 * dims.d_c * (dims.d_n + dims.d_v)
    return (absorbed + np.asarray(rows, dtype=np.float64) * through_kv_b,
            expanded + np.asarray(contexts, dtype=np.float64) * through_kv_b)


def expanded_requests(form: str, dims: MLADims, rows, contexts) -> np.ndarray:
    """Which requests attend expanded [R] bool: every request with rows under ``expanded``, none
    under ``absorbed``, and under ``auto`` those whose expanded form takes fewer FLOPs. Requests
    without rows never do."""
    if form not in FORMS:
        raise ValueError(f"attention form must be one of {', '.join(FORMS)} (got {form!r})")
    rows = np.asarray(rows)
    has_rows = rows > 0
    if form == "absorbed":
        return np.zeros(rows.shape, dtype=bool)
    if form == "expanded":
        return has_rows
    absorbed, expanded = form_flops(dims, rows, contexts)
    return has_rows & (expanded < absorbed)
