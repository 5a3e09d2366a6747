"""The vocabulary of layouts: a layout is a pair (placement, ownership).

Paper §2: placement says where the large attention projections (Q-B, KV-B, O) live,
ownership says which ranks hold each request's KV history.
"""

from __future__ import annotations

import enum
import itertools


class Placement(str, enum.Enum):
    """Where attention projections live."""

    SHARDED = "sharded"  # split by heads over the group (TP, DOP)
    REPLICATED = "replicated"  # whole copy on every rank (DP, CP)


class Ownership(str, enum.Enum):
    """Who holds a request's KV history."""

    ALL = "all"  # every rank holds every history (TP)
    OWNER = "owner"  # one owner rank per request (DP, DOP)
    POSITIONS = "positions"  # positions split over ranks (CP)


class Layout(str, enum.Enum):
    """The four attention layouts SPLASH switches among."""

    TP = "TP"
    CP = "CP"
    DP = "DP"
    DOP = "DOP"

    @property
    def placement(self) -> Placement:
        return _PAIRS[self][0]

    @property
    def ownership(self) -> Ownership:
        return _PAIRS[self][1]

    @classmethod
    def parse(cls, text: str) -> "Layout":
        """Accept 'TP', 'tp', 'DP-attention', 'dp_attention' ...; raise ValueError naming the choices."""
        key = str(text).strip().upper().replace("_", "-")
        key = _ALIASES.get(key, key)
        try:
            return cls(key)
        except ValueError:
            raise ValueError(
                f"unknown layout {text!r}; expected one of {', '.join(l.value for l in cls)}"
            ) from None

    def __str__(self) -> str:  # so f-strings print 'TP', not 'Layout.TP'
        return self.value


_PAIRS = {
    Layout.TP: (Placement.SHARDED, Ownership.ALL),
    Layout.CP: (Placement.REPLICATED, Ownership.POSITIONS),
    Layout.DP: (Placement.REPLICATED, Ownership.OWNER),
    Layout.DOP: (Placement.SHARDED, Ownership.OWNER),
}
_ALIASES = {"DP-ATTENTION": "DP", "DP-ATTN": "DP", "DPA": "DP"}


class State(str, enum.Enum):
    """What a switch moves, per layer."""

    WEIGHTS = "weights"  # attention projections (Q-B, KV-B, O; KDA q/k/v/o ...)
    KV = "kv"  # MLA latent + rotary key per token
    INDEXER = "indexer"  # sparse-attention indexer keys per token
    RECURRENT = "recurrent"  # KDA recurrent state and short-conv caches per request

    def __str__(self) -> str:
        return self.value


class Primitive(str, enum.Enum):
    """How missing state arrives (paper Figure 3, right)."""

    DISCARD = "discard"  # keep a subset, free the rest; no network
    ALL_GATHER = "all_gather"
    ALL_TO_ALL = "all_to_all"

    def __str__(self) -> str:
        return self.value


LAYOUTS: tuple[Layout, ...] = tuple(Layout)
DIRECTIONS: tuple[tuple[Layout, Layout], ...] = tuple(
    (a, b) for a, b in itertools.permutations(LAYOUTS, 2)
)


def weight_share(layout: Layout, T: int) -> float:
    """Fraction of the attention projections each rank holds: 1/T sharded, 1 replicated."""
    return 1.0 / T if layout.placement is Placement.SHARDED else 1.0


def pool_from_budget(layout: Layout, budget_bytes: float, attention_weights_bytes: float,
                     kv_bytes_per_token: float, T: int) -> int:
    """Tokens one rank holds when ``budget_bytes`` covers its attention weights (whole, or a 1/T
    shard in sharded layouts) and its KV."""
    weights = attention_weights_bytes * weight_share(layout, T)
    return max(0, int((budget_bytes - weights) // kv_bytes_per_token))
