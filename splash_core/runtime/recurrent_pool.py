"""Per-request recurrent state of the KDA layers on one rank (paper §2's ``recurrent`` state).

A request's state in one KDA layer is the delta-rule state ``[h, K, V]`` and the short-conv cache
``[c - 1, h, 3, K]`` (its last c - 1 pre-convolution q/k/v inputs, time-major) of the heads
this rank holds: TP splits it by head shard like the projections, DP, DOP and CP keep all heads
on the request's owner (:func:`held_heads`, the rules of :mod:`splash_core.planning.ownership`). Bytes
per request and layer are :attr:`ModelProfile.recurrent_bytes_per_request_layer` (times h/H).

State is allocated (zeros) when a request is admitted to a layer (its first step, in the layout
the layer computes in), replaced after every step the request takes, and freed when it
finishes. After a step a request's tensors are views of that step's batched result (no copy
per request; the batch tensor goes once every request of it moved on);
:meth:`LayerRecurrent.get` returns copies.

Switch API (used by :class:`~splash_core.runtime.switch.recurrent.RecurrentMover`; nothing
changes the layer unless it succeeds):

- ``heads_of(request)``: the head range held, or None.
- ``get(request, heads)`` -> :class:`RequestState`, contiguous copies of a held head range.
- ``put(request, part)``: install a state (or None: remove it), returning the one it replaced.
- ``pack_shards(request, shards, T)`` -> uint8 ``[n, shard_bytes(T)]`` for the manifest's keys
  ``(request_id, shard)`` (shard s = heads ``head_shard(H, s, T)``), state and conv cache as raw
  bytes so one all-to-all moves both; ``assemble(request, shards, T, received)`` builds the
  destination state of adjacent shards from received rows and the shards kept here.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping, Sequence

import torch

from ..layouts import Layout
from ..model.weights import head_shard


def held_heads(layout: Layout, owner: int, rank: int, T: int, heads: int) -> range | None:
    """The heads of a request's recurrent state ``rank`` holds in ``layout`` (None: nothing)."""
    if layout is Layout.TP:
        return head_shard(heads, rank, T)
    return range(heads) if owner == rank else None


@dataclasses.dataclass(frozen=True)
class RecurrentFormat:
    """Shapes and storage format of one KDA layer's per-request state."""

    heads: int  # H of the layer (all shards)
    key_dim: int  # K
    value_dim: int  # V
    conv_taps: int  # cached inputs per channel: conv_size - 1
    dtype: torch.dtype  # the model's state_dtype

    def state_shape(self, h: int) -> tuple[int, ...]:
        return (h, self.key_dim, self.value_dim)

    def conv_shape(self, h: int) -> tuple[int, ...]:
        return (self.conv_taps, h, 3, self.key_dim)

    @property
    def head_bytes(self) -> int:
        """Bytes of one head of one request: state plus conv cache."""
        per = self.key_dim * self.value_dim + self.conv_taps * 3 * self.key_dim
        return per * torch.empty((), dtype=self.dtype).element_size()

    def shard_bytes(self, T: int) -> int:
        return self.head_bytes * len(head_shard(self.heads, 0, T))


@dataclasses.dataclass
class RequestState:
    """One request's state for a contiguous range of heads."""

    heads: range
    state: torch.Tensor  # [h, K, V]
    conv: torch.Tensor  # [c - 1, h, 3, K]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.state, self.conv))

    def narrow(self, heads: range) -> "RequestState":
        """Contiguous copies of ``heads`` (a sub-range of the held heads)."""
        if not (self.heads.start <= heads.start and heads.stop <= self.heads.stop and len(heads)):
            raise KeyError(f"heads {_fmt(heads)} are not within the held heads {_fmt(self.heads)}")
        lo, hi = heads.start - self.heads.start, heads.stop - self.heads.start
        return RequestState(heads, self.state[lo:hi].clone(), self.conv[:, lo:hi].clone())


def _fmt(heads: range | None) -> str:
    return "none" if heads is None else f"[{heads.start}, {heads.stop})"


class LayerRecurrent:
    """Recurrent state and conv caches of one KDA layer on this rank, per request."""

    def __init__(self, layer: int, fmt: RecurrentFormat, device):
        self.layer, self.format, self.device = layer, fmt, device
        self._held: dict[int, RequestState] = {}

    @property
    def requests(self) -> list[int]:
        return list(self._held)

    def heads_of(self, request: int) -> range | None:
        part = self._held.get(request)
        return None if part is None else part.heads

    def nbytes(self) -> dict[str, int]:
        return {"recurrent": sum(p.nbytes() for p in self._held.values())}

    # ---- serving -------------------------------------------------------------------------

    def admit(self, request: int, heads: range) -> None:
        """Zero state for a request that starts (position 0) in this layer."""
        if request in self._held:
            raise ValueError(f"layer {self.layer}: request {request} starts but already holds heads "
                             f"{_fmt(self._held[request].heads)}")
        f, kw = self.format, dict(dtype=self.format.dtype, device=self.device)
        self._held[request] = RequestState(heads, torch.zeros(f.state_shape(len(heads)), **kw),
                                           torch.zeros(f.conv_shape(len(heads)), **kw))

    def free(self, request: int) -> None:
        """Forget a request's state here (nothing held is fine)."""
        self._held.pop(request, None)

    def gather(self, requests: Sequence[int], heads: range) -> tuple[torch.Tensor, torch.Tensor]:
        """(state [B, h, K, V] float32, conv [B, c - 1, h, 3, K]) of ``requests``, each of which
        must hold exactly ``heads``."""
        parts = []
        for rid in requests:
            part = self._held.get(rid)
            if part is None or part.heads != heads:
                raise KeyError(f"layer {self.layer}: request {rid} holds heads {_fmt(self.heads_of(rid))}, "
                               f"the step needs {_fmt(heads)}")
            parts.append(part)
        f, h = self.format, len(heads)
        if not parts:
            return (torch.zeros((0, *f.state_shape(h)), dtype=torch.float32, device=self.device),
                    torch.zeros((0, *f.conv_shape(h)), dtype=f.dtype, device=self.device))
        return (torch.stack([p.state for p in parts]).float(), torch.stack([p.conv for p in parts]))

    def scatter(self, requests: Sequence[int], state: torch.Tensor, conv: torch.Tensor) -> None:
        """Store the states after a step (``gather``'s shapes); the requests keep their heads."""
        state, conv = state.to(self.format.dtype), conv.to(self.format.dtype)
        for i, rid in enumerate(requests):
            part = self._held[rid]
            part.state, part.conv = state[i], conv[i]

    # ---- switching -----------------------------------------------------------------------

    def get(self, request: int, heads: range | None = None) -> RequestState:
        """Contiguous copies of ``heads`` (default: all held) of a request's state."""
        part = self._held.get(request)
        if part is None:
            raise KeyError(f"layer {self.layer}: request {request} holds no recurrent state here")
        return part.narrow(part.heads if heads is None else heads)

    def put(self, request: int, part: RequestState | None) -> RequestState | None:
        """Make ``part`` the request's state here (None: hold nothing); returns what it replaced,
        so a caller can put that back. Checks shapes first."""
        if part is not None:
            f, h = self.format, len(part.heads)
            if tuple(part.state.shape) != f.state_shape(h) or tuple(part.conv.shape) != f.conv_shape(h):
                raise ValueError(f"layer {self.layer} request {request}: heads {_fmt(part.heads)} came with state "
                                 f"{list(part.state.shape)} and conv {list(part.conv.shape)}, expected "
                                 f"{list(f.state_shape(h))} and {list(f.conv_shape(h))}")
        old = self._held.pop(request, None)
        if part is not None:
            self._held[request] = part
        return old

    # ---- the manifest's (request, shard) blocks, as bytes ----------------------------------

    def pack_shards(self, request: int, shards: Sequence[int], T: int) -> torch.Tensor:
        """uint8 [len(shards), shard_bytes(T)]: each shard's state then conv cache, raw bytes."""
        rows = [_as_bytes(self.get(request, head_shard(self.format.heads, s, T))) for s in shards]
        if not rows:
            return torch.empty(0, self.format.shard_bytes(T), dtype=torch.uint8, device=self.device)
        return torch.stack(rows)

    def assemble(self, request: int, shards: Sequence[int], T: int,
                 received: Mapping[int, torch.Tensor]) -> RequestState | None:
        """A new state (fresh tensors; nothing here changes) of the adjacent ``shards``: those in
        ``received`` (shard -> a :meth:`pack_shards` row) from the rows, the others copied from
        what the request holds here. None for no shards."""
        f = self.format
        if not len(shards):
            return None
        shards = sorted(shards)
        if shards != list(range(shards[0], shards[0] + len(shards))):
            raise ValueError(f"layer {self.layer} request {request}: shards {shards} are not adjacent")
        h = len(head_shard(f.heads, 0, T))
        split = h * f.key_dim * f.value_dim * torch.empty((), dtype=f.dtype).element_size()
        parts = []
        for s in shards:
            row = received.get(s)
            if row is None:
                parts.append(self.get(request, head_shard(f.heads, s, T)))
                continue
            if tuple(row.shape) != (f.shard_bytes(T),) or row.dtype != torch.uint8:
                raise ValueError(f"layer {self.layer} request {request} shard {s}: expected {f.shard_bytes(T)} "
                                 f"bytes, got {row.dtype} {list(row.shape)}")
            parts.append(RequestState(head_shard(f.heads, s, T),
                                      row[:split].contiguous().view(f.dtype).view(f.state_shape(h)),
                                      row[split:].contiguous().view(f.dtype).view(f.conv_shape(h))))
        heads = range(parts[0].heads.start, parts[-1].heads.stop)
        return RequestState(heads, torch.cat([p.state for p in parts]), torch.cat([p.conv for p in parts], dim=1))


def _as_bytes(part: RequestState) -> torch.Tensor:
    return torch.cat([part.state.reshape(-1).view(torch.uint8), part.conv.reshape(-1).view(torch.uint8)])


class RecurrentPool:
    """The :class:`LayerRecurrent` of every KDA layer on this rank."""

    def __init__(self, layers: Iterable[int], fmt: RecurrentFormat, device):
        self.format = fmt
        self.layers = {int(i): LayerRecurrent(int(i), fmt, device) for i in layers}

    def __getitem__(self, layer: int) -> LayerRecurrent:
        try:
            return self.layers[layer]
        except KeyError:
            raise KeyError(f"layer {layer} has no recurrent state (KDA layers: {sorted(self.layers)})") from None

    def nbytes(self) -> dict[str, int]:
        return {"recurrent": sum(layer.nbytes()["recurrent"] for layer in self.layers.values())}

    def release(self, request: int) -> None:
        """Free a finished request's state in every KDA layer."""
        for layer in self.layers.values():
            layer.free(request)
