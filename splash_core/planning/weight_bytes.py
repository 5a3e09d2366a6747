"""Weight transfer accounting (paper appendix A, Eq 9): the attention projections whose
placement changes between layouts, per layer kind, in a transfer format.

Only head-indexed projections change placement: TP and DOP hold head shard r of each on rank
r, DP and CP hold all of them. Everything replicated in every layout (Q-A, KV-A, the rotary
key rows, norms, KDA's low-rank gate down-projections and its short-convolution taps) is left
out, as appendix A says. The q/k/v convolution taps (3 H K c parameters, 0.05% of a
GLM-5.3-Flash KDA layer) are replicated because DOP's owner convolves every head of its rows with the conv cache
it holds, which needs the taps of every head.

The projections themselves (names, shapes) are :mod:`splash_core.profiles.projections`.
Sizes are parameters times the transfer format's bytes. Quantization scales (S_meta of Eq 9) are
counted where the weights are kept FP8 block-scaled and the block is given (``scale_block``:
the checkpoint's, e.g. DeepSeek's 128 x 128; what a deployment with ``attention_weights: fp8``
moves, codes and scales, equal to the runtime's received bytes); without it they are not (model
profiles do not describe them): a profile whose weight_dtype is fp8 is then counted at one byte
per parameter, while a deployment holding attention in its compute format moves that format.
"""

from __future__ import annotations

import dataclasses

from ..profiles.model import LayerKind, ModelProfile
from ..profiles.projections import Projection, check_divides, projections

MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class LayerWeights:
    """Eq 9 for one layer kind at group size T."""

    kind: LayerKind
    layers: int  # how many layers of this kind the model has
    projections: tuple[Projection, ...]
    T: int

    @property
    def layer_bytes(self) -> int:
        return sum(p.bytes for p in self.projections)

    @property
    def shard_bytes(self) -> int:
        """What a sharded layout (TP, DOP) holds per rank per layer."""
        return sum(p.shard_bytes(self.T) for p in self.projections)

    @property
    def received_per_rank(self) -> int:
        """(1 - 1/T) S: what one rank receives per layer in a sharded→replicated switch (the T - 1
        other shards; kept FP8, each with the scale blocks of the shard touching the most)."""
        return (self.T - 1) * self.shard_bytes

    @property
    def received_by_group(self) -> int:
        """Every rank's receive counted once (appendix A's aggregate V_sum)."""
        return self.T * self.received_per_rank


@dataclasses.dataclass(frozen=True)
class WeightReport:
    """Eq 9 for every layer kind of a model: what ``splash weights`` prints."""

    model: str
    T: int
    dtype: str
    kinds: tuple[LayerWeights, ...]
    notes: str

    @property
    def model_bytes(self) -> int:
        """W_A: all head-indexed projections of all layers (what DP and CP hold per rank)."""
        return sum(k.layers * k.layer_bytes for k in self.kinds)

    @property
    def received_per_rank(self) -> int:
        """All layers of one sharded→replicated switch, per rank."""
        return sum(k.layers * k.received_per_rank for k in self.kinds)

    @property
    def received_by_group(self) -> int:
        return self.T * self.received_per_rank


def weight_report(model: ModelProfile, T: int, dtype: str | None = None,
                  scale_block: tuple[int, int] | None = None) -> WeightReport:
    """Eq 9 accounting of ``model`` at group size ``T`` in ``dtype`` (default: the model's);
    ``scale_block``: MLA projections kept FP8 in blocks of (rows, cols), their scales counted."""
    dtype = dtype or model.weight_dtype
    kinds = []
    for kind in LayerKind:
        projs = projections(model, kind, dtype, scale_block)
        count = model.count(kind)
        if projs and count:
            check_divides(T, projs[0].heads, f"{kind} heads")
            kinds.append(LayerWeights(kind, count, projs, T))
    return WeightReport(model.name, T, dtype, tuple(kinds), model.notes)
