"""CP's attention traffic in one MLA layer, in bytes each rank receives (the cost model's
:meth:`~splash_core.planning.costmodel.CostModel._communication` turns them into time).

- decode rows: every rank attends each row over the keys it holds; the partial outputs and
  log-sum-exps are all-gathered, (T − 1)·N_dec·H·(d_z·b + 4);
- prefill rows: the cheaper of gathering the remote history (KV and indexer keys) and passing
  the queries around the ring, merging (T − 1) partial outputs by LSE;
- sparse attention (DSA) where some row sees more than k keys: a row attended over the keys each
  rank holds (decode rows; prefill rows that take the ring) needs a global top-k, so every rank
  all-gathers each rank's local top-k candidates of those rows, k (score, position) float32 pairs
  (:mod:`~splash_core.runtime.sparse_attention`): (T − 1)·N·2k·4, before attention can start. A
  rank that gathered the remote history holds every key and selects alone.
"""

from __future__ import annotations

import numpy as np

LSE_BYTES = 4  # one fp32 log-sum-exp per row and head
CANDIDATE_BYTES = 8  # one top-k candidate: a float32 score and a float32 position


def merge_bytes(T: int, decode_rows: float, heads: int, width_from_owner: int, act_bytes: int) -> float:
    """Partial outputs and LSEs of the decode rows each rank receives."""
    return (T - 1) * decode_rows * heads * (width_from_owner * act_bytes + LSE_BYTES)


def prefill_exchange_bytes(remote_tokens, stored_bytes_token: float, T: int, chunk_rows, heads: int,
                           width_to_owner: int, width_from_owner: int, act_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """([T] history, [T] ring): bytes each rank would receive for its prefill rows' attention by
    gathering the remote history, or by passing its ``chunk_rows`` queries around the ring for
    partial outputs; the cost model takes the cheaper (also what the rank buffers, Eq 6's A)."""
    history = np.asarray(remote_tokens) * stored_bytes_token
    ring = (T - 1) * np.asarray(chunk_rows) * heads * ((width_to_owner + width_from_owner) * act_bytes + LSE_BYTES)
    return history, ring


def candidate_bytes(T: int, rows: float, topk: int | None, longest_context: int) -> float:
    """Bytes each rank receives making sparse attention's top-k global over ``rows`` query rows of
    one layer, each attended over the keys every rank holds: none without sparse attention, on one
    rank, or where no context exceeds k (every visible key is selected, and the runtime exchanges
    nothing)."""
    if topk is None or T == 1 or longest_context <= topk:
        return 0.0
    return (T - 1) * rows * topk * CANDIDATE_BYTES
