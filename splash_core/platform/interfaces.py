"""What a backend hands the core: descriptions, collectives, streams and kernels.

These are the value types and protocols named by :mod:`splash_core.platform.hookspecs`. The shapes and
meanings written here are the contract every backend is tested against
(:mod:`splash_core.testing`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ContextManager, Protocol, Sequence, runtime_checkable


@dataclasses.dataclass(frozen=True)
class BackendInfo:
    """Who a backend is. ``specializes`` names the backend it refines (a chip-tuned
    backend refines its vendor's generic one): ``auto`` prefers the more specific one and hooks it leaves unanswered fall back to
    the one it refines, then to the reference backend."""

    name: str
    version: str
    summary: str
    device_type: str  # torch device type it computes on ("cpu" or the accelerator's type)
    accelerator: bool  # False only for the CPU reference backend
    specializes: str | None = None


@runtime_checkable
class Work(Protocol):
    """Handle of an asynchronous collective."""

    def wait(self) -> Any: ...


@runtime_checkable
class Collectives(Protocol):
    """Collectives over one process group of ``size`` ranks, this one being ``rank``.

    Every method is a collective: all ranks of the group call it in the same order, ranks
    with nothing to send included (zero-length splits). ``async_op=True`` returns a
    :class:`Work`; otherwise the call returns when the result is ready to use.
    """

    rank: int
    size: int

    def all_gather_into(self, out, inp, async_op: bool = False) -> Work | None:
        """``out`` [size * n, ...] receives every rank's ``inp`` [n, ...] in rank order."""

    def all_to_all(self, out, inp, out_splits: Sequence[int], in_splits: Sequence[int],
                   async_op: bool = False) -> Work | None:
        """Uneven all-to-all over dim 0: rank r sends ``inp`` rows split by ``in_splits`` (one
        count per peer) and receives ``out`` rows split by ``out_splits``."""

    def all_reduce(self, tensor, async_op: bool = False) -> Work | None:
        """In-place sum over the group."""

    def broadcast(self, tensor, src: int, async_op: bool = False) -> Work | None:
        """``tensor`` of rank ``src`` replaces it on every rank."""

    def all_gather_object(self, obj: Any) -> list:
        """Small picklable metadata from every rank, in rank order."""

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s picklable object, on every rank."""

    def barrier(self) -> None: ...


@runtime_checkable
class StreamOps(Protocol):
    """Streams and events for overlapping transfers with compute on one device."""

    def current_stream(self) -> Any: ...

    def new_stream(self) -> Any:
        """A stream whose work may run concurrently with the current stream's."""

    def use_stream(self, stream: Any) -> ContextManager:
        """Context in which launched work goes to ``stream``."""

    def new_event(self, timing: bool = False) -> Any:
        """An event with ``record(stream=None)``, ``wait(stream=None)`` (make a stream wait for
        it), ``synchronize()``, ``query()`` and, when ``timing``, ``elapsed_time(end)`` in ms."""

    def synchronize(self) -> None:
        """Wait for all work on the device."""


@runtime_checkable
class PeerBuffers(Protocol):
    """Every rank's shared buffer as this rank reads it (from :meth:`PeerMemory.share`).

    ``min_run_bytes`` (optional, default 0): the shortest average copy worth a pull; a switch
    moves a layer's pages by collectives instead where they lie in shorter runs (each copy
    costs the host a call and the device a copy's start).

    ``barrier(epoch, timeout_s)`` (optional): a barrier of the group in the order of the current
    stream, through the shared memory itself: once the work queued before it is done, tell
    every rank this one reached ``epoch`` (a write to each rank's memory, fenced behind this
    rank's earlier writes and pulls); then hold the stream until every rank told this one.
    Every rank calls it with the same epochs, rising by one. It takes no processors (on GPUs,
    stream memory operations; a collective's kernel instead holds processors while it waits
    for peers, and the step's kernels beside it lose about that long). Host backends wait on
    the host and raise :class:`PeerMemoryError` naming the late ranks after ``timeout_s``;
    device backends, whose streams cannot be interrupted, end the process with that message
    (as a collective library's watchdog does for a hung collective). Without it, pulls are fenced by one-element
    collectives on the side communicator."""

    def pull(self, peer: int, runs) -> None:
        """Copy bytes of ``peer``'s buffer into this rank's. Each row of ``runs`` ([k, 6] int64) is
        one copy ``(src, dst, row_bytes, rows, src_pitch, dst_pitch)``: for j < ``rows``, bytes
        ``[src + j src_pitch, + row_bytes)`` of the peer's buffer to ``[dst + j dst_pitch,
        + row_bytes)`` of this rank's (``rows = 1``: one plain copy; pitches >= ``row_bytes``;
        a copy of 0 bytes does nothing). Asynchronous, in the order of the current stream, on
        copy engines where the device has them (a pull takes no processors from the computation
        beside it). The peer's bytes must stay as they are until the pull is done: work queued
        on the current stream after the pull (a collective, say) runs after it."""

    def close(self) -> None:
        """Unmap the peers' buffers (no pull may be in flight)."""


@runtime_checkable
class PeerMemory(Protocol):
    """Memory the ranks of a group read from each other directly (one-sided): a switch then copies
    KV pages from the pool of the rank that holds them into the pool of the rank that needs
    them, with no staging buffers, packing kernels or collectives carrying the pages."""

    def allocate(self, nbytes: int):
        """A zero-filled uint8 tensor ``[nbytes]`` on this rank's device that :meth:`share` exposes."""

    def share(self, buffer) -> PeerBuffers:
        """Expose ``buffer`` (from :meth:`allocate`) to the group and map every peer's. A collective:
        every rank calls it with a buffer of the same size. Raises
        :class:`PeerMemoryError` on every rank when any rank cannot export its buffer; a rank
        that cannot map a peer's raises on that rank only (the caller agrees on the outcome)."""


@runtime_checkable
class CapturedGraph(Protocol):
    """Device work recorded once (:meth:`GraphOps.capture`) and launched again by :meth:`replay`.

    ``outputs`` is what the captured function returned at capture time: tensors every replay
    rewrites in place. ``capture_s`` is the host time capture took (warm-up included) and
    ``nbytes`` the device memory the graph holds in its pool (both as measured at capture)."""

    outputs: Any
    capture_s: float
    nbytes: int

    def replay(self) -> None:
        """Launch the recorded work again on the current stream, reading the same addresses."""


@runtime_checkable
class GraphOps(Protocol):
    """Capture and replay of a device's work (graphs recorded once, launched again), for decode steps whose
    host cost would otherwise exceed their device time (issue 22).

    A captured function reads and writes only tensors whose addresses stay fixed (persistent
    buffers refreshed in place before each replay); it may call the group's collectives where
    the backend's collective library can be captured. Every rank of a group captures the same
    functions at the same points (capture runs the function eagerly during warm-up)."""

    def new_pool(self) -> Any:
        """A memory pool handle that graphs captured with it share."""

    def capture(self, fn: Callable[[], Any], pool: Any, warmup: int = 2) -> CapturedGraph:
        """Run ``fn`` ``warmup`` times eagerly (compiles kernels, sizes workspaces), then record
        one more call of it into a graph allocating from ``pool``. The recorded call does not
        execute: the caller replays the graph. ``fn`` must be idempotent (a decode step that
        rewrites the same cache slots with the same values is)."""


class PeerMemoryError(RuntimeError):
    """Peer memory could not be set up (the message names the rank and the cause)."""


@dataclasses.dataclass(frozen=True)
class MLAKernels:
    """Absorbed-MLA attention over a paged latent cache, plus merge and page packing.

    Cache of one layer: ``kv_cache`` [num_pages, page_size, d_c + d_r]; channels [0, d_c) are
    the latent (also the value), [d_c, d_c + d_r) the rotary key. A uint8 cache
    [num_pages, page_size, token_bytes] holds the scaled-fp8 format instead
    (:mod:`splash_core.model.kv_format`: per token the e4m3 latent, float32 scales of its
    channel groups, the bf16 rotary key; :func:`splash_core.model.fp8_cache.dequantize` reads
    it back): keys are the dequantized values.

    ``decode`` and ``extend`` share one signature::

        fn(q, kv_cache, block_table, page_index, row_req, row_pos, scale, v_dim) -> (out, lse)

    - q [N, H, d_c + d_r]: absorbed queries (q_nope · W_UK ++ q_rope), one row per query token
    - block_table [R, P] int32: physical page of each page a request holds here, -1 = none
    - page_index [R, P] int32: which page of the request's history that is (position // page_size)
    - row_req [N] int32: request slot (row of block_table) of each query row
    - row_pos [N] int32: absolute position of each query row; it attends to keys at positions
      ``<= row_pos`` among the pages listed (causal, and exactly the written slots)
    - scale: softmax scale; v_dim: d_c, the leading channels that are also the value
    - out [N, H, d_c] in q's dtype: softmax-weighted latent values over the listed keys
    - lse [N, H] float32: natural log-sum-exp of the scaled scores; rows with no visible key
      give out = 0 and lse = -inf

    ``decode`` may assume one row per request at the request's last position (N == R);
    ``extend`` handles any rows (chunked prefill). ``merge(outs [P, N, H, D], lses [P, N, H])``
    combines partial results by log-sum-exp. ``pack(cache, pages [n], out=None) -> [n, page_size, W]``
    (into ``out``, a contiguous tensor of that shape and the cache's dtype, when given: a
    switch packs straight into its transfer buffer) and ``unpack(cache, pages, buf)`` move
    whole pages to and from contiguous buffers.

    ``expanded`` (optional: None, and prefill always attends absorbed) is attention in the expanded
    form over keys already expanded through kv_b (:mod:`splash_core.planning.attention_forms`)::

        expanded(q, k_nope, k_rope, v, q_req, q_pos, k_start, k_pos, scale) -> (out, lse)

    - q [N, H, d_n + d_r]: q_nope ++ rotated q_rope per query row and head
    - k_nope [M, H, d_n], v [M, H, d_v]: each key's expanded key and value per head (unit last
      stride; they may be views into one [M, H, d_n + d_v] tensor); k_rope [M, d_r]: its rotated
      rotary key, shared by all heads
    - k_start [R + 1] int32: the keys of request r are rows k_start[r]:k_start[r + 1]; k_pos [M]
      int32 their positions
    - q_req [N] int32: each query row's request; q_pos [N] int32 its position: it attends to its
      request's keys at positions ``<= q_pos``
    - out [N, H, d_v] in q's dtype, lse [N, H] float32, as for ``decode`` (no visible key: 0, -inf)

    DeepSeek Sparse Attention (both optional: None, and the torch reference in
    :mod:`splash_core.reference.dsa` serves). A rank names request r's keys by their *slot* in
    its block table row, ``slot * page_size + offset`` (slot order is position order)::

        index_scores(q, weights, index_keys, block_table, page_index, row_req, row_pos, scale) -> scores
        sparse(q, kv_cache, block_table, row_req, slots, scale, v_dim) -> (out, lse)

    - ``index_scores``: the lightning indexer. q [N, H_I, D] indexer queries, weights [N, H_I]
      per-head weights (every factor already in), index_keys [num_pages, page_size, D] (uint8: the
      scaled-fp8 key format without a rotary part); scores [N, P * page_size] float32 =
      ``sum_h weights[n, h] ReLU(scale q[n, h] . key[slot])``, -inf on holes and keys after row_pos
    - ``sparse``: absorbed MLA of row n over only the key slots ``slots[n]`` ([N, K] int32, -1
      pads; slots past the table or on a hole are skipped), otherwise as ``decode``
    """

    decode: Callable
    extend: Callable
    merge: Callable
    pack: Callable
    unpack: Callable
    name: str = "reference"
    expanded: Callable | None = None
    index_scores: Callable | None = None
    sparse: Callable | None = None


@dataclasses.dataclass(frozen=True)
class FusedKernels:
    """Small ops of a serving step fused into one kernel each (issue 22 §2), with the torch
    reference in :mod:`splash_core.model.ops` as their spec. Rows are the leading dim;
    the channel dim must have a unit stride; norms compute in float32 and return the input's
    dtype.

    - ``add_rms_norm(x, residual, weight, eps) -> (normed, summed)``: ``summed = residual + x``
      in x's dtype, ``normed = RMSNorm(summed) * weight``: the residual-add of a block and the
      next norm in one pass (``residual`` None: ``summed`` is ``x``, a plain RMSNorm).
    - ``latent(kv, weight, cos, sin, eps) -> entries [n, d_c + d_r]``: MLA cache entries from
      KV-A's output ``kv`` [n, d_c + d_r] (d_c = ``weight.numel()``): RMSNorm of the latent
      channels, then the rotary channels rotated as
      :class:`~splash_core.model.rotary.Rotary` does (``x cos + swap_halves(x) sin``, with
      ``cos``/``sin`` [n, d_r] float32).
    - ``latent_write(kv, weight, cos, sin, eps, cache, slots) -> None``: ``latent`` written
      straight into the cache [pages, page_size, d_c + d_r] at flat slots ``slots`` [n]
      int64 (page * page_size + offset), in the cache's format: RoPE fused with the cache write
      (a uint8 cache: quantized into the scaled-fp8 format, as
      :func:`splash_core.model.fp8_cache.quantize` does).
    - ``silu_mul(gate_up) -> [n, w]``: ``silu(gate_up[:, :w]) * gate_up[:, w:]``.
    - ``rotate(x, cos, sin, out) -> out`` (optional: None, and the torch reference serves): rows
      ``x`` [n, d_r] or [n, h, d_r] rotated as :class:`~splash_core.model.rotary.Rotary` does,
      written into ``out`` of x's shape (a view into a larger tensor, or ``x`` itself: in place),
      in out's dtype: the queries' RoPE with no float32 temporaries and no concatenation after it.
    """

    add_rms_norm: Callable
    latent: Callable
    latent_write: Callable
    silu_mul: Callable
    name: str = "reference"
    rotate: Callable | None = None


@dataclasses.dataclass(frozen=True)
class FP8LinearKernels:
    """GEMMs against weights kept FP8 as a block-scaled checkpoint stores them (issue 38), W8A8 as
    DeepSeek runs them: the activations are quantized per token in groups of ``w.block[1]``
    channels that follow the weight's column blocks (the first starting ``w.start[1]`` inside one),
    so each (group, block) product takes one activation and one weight scale. Both are checked
    against the dequantized reference ``x @ w.dequantize().T`` by the tolerance-aware check
    (activation rounding makes them differ from it).

    - ``linear(x, w) -> y``: ``x`` [m, k] through one weight slice ``w``
      (:class:`~splash_core.model.fp8_blocks.BlockScaledFP8`, codes [n, k]): ``y`` [m, n] in x's dtype.
    - ``grouped(x, w, counts) -> y``: rows of ``x`` [P, k] sorted by expert, expert g's ``counts[g]``
      rows through ``w``'s expert g (codes [G, n, k]): ``y`` [P, n] in x's dtype; rows past
      ``counts.sum()`` come back undefined (as :func:`~splash_core.model.experts.grouped_linear`).
    - ``providers``: ``(name, linear)`` of each kernel ``linear`` may choose per call (by a measured
      table), each with ``linear``'s contract for the weights it takes (it raises ValueError for the
      others): what the conformance suite checks one by one; empty where ``linear`` is one kernel.
    """

    linear: Callable
    grouped: Callable
    name: str = "reference"
    providers: tuple[tuple[str, Callable], ...] = ()


@dataclasses.dataclass(frozen=True)
class KDAKernels:
    """Kimi delta attention (gated delta rule with per-channel decay), as fla's ``naive_recurrent_kda``.

    ``chunk(q, k, v, g, beta, state, scale) -> (o, state)`` for prefill chunks and
    ``step(q, k, v, g, beta, state, scale) -> (o, state)`` for decode (T = 1):

    - q, k [B, T, H, K], v [B, T, H, V], g [B, T, H, K] (log decay, <= 0), beta [B, T, H]
    - state [B, H, K, V] float32; per token: S <- diag(exp g_t) S, then
      S <- S + β_t k_t (v_t - Sᵀ k_t)ᵀ, and o_t = Sᵀ (scale · q_t)
    - o [B, T, H, V] in v's dtype; the returned state is the one after the last token
    """

    chunk: Callable
    step: Callable
    name: str = "reference"
