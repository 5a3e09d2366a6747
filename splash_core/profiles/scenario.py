"""Scenario profiles: the paper's illustrative timing law (Eq 11-12) and KV residency study
(appendix B) for one figure, as data.

A scenario pairs a timing law, whose formulas are expressions in the file, with the
capacity assumptions that mark where each layout's KV no longer fits. ``splash crossovers``
and ``splash capacity`` read it; nothing in code knows the paper's coefficients.
"""

from __future__ import annotations

import dataclasses
import types

from ..layouts import Layout, pool_from_budget
from .expressions import Expression, ExpressionError, check_names
from .hardware import GIB
from .schema import Problem, field, fraction, non_negative, positive

_EMPTY = types.MappingProxyType({})


@dataclasses.dataclass(frozen=True)
class TimingLawSpec:
    """τ_ℓ of Eq 11 and the normalization of Eq 12, written as expressions.

    Expressions may use numbers, + - * / **, pos(v) = [v]+, min, max, abs, sqrt, log, exp,
    the constants, ``L`` (argument only), ``x`` and earlier definitions."""

    constants: dict[str, float] = field("named numbers the expressions use (e.g. alpha of Eq 12)")
    argument: str = field("x as an expression over the nominal input length L and the constants")
    layouts: dict[Layout, str] = field("τ_ℓ(x) per layout")
    definitions: dict[str, str] = field("helper quantities over x, in order (e.g. a: 0.05*x + ...)",
                                        default_factory=lambda: _EMPTY)
    normalize_layout: Layout = field("layout whose cost at normalize_tokens divides every curve", default=Layout.TP)
    normalize_tokens: float = field("nominal length L of the normalizing point", default=1024.0, checks=[positive])

    def problems(self):
        compiled = {}
        for path, text in [("argument", self.argument), *((f"definitions.{k}", v) for k, v in self.definitions.items()),
                           *((f"layouts.{k}", v) for k, v in self.layouts.items())]:
            try:
                compiled[path] = Expression(text)
            except ExpressionError as exc:
                yield Problem(path, str(exc), text)
                return
        clash = {"L", "x"} & (set(self.constants) | set(self.definitions))
        if clash:
            yield Problem("constants", f"{sorted(clash)[0]!r} is reserved for the length and the argument")
            return
        definitions = {k: compiled[f"definitions.{k}"] for k in self.definitions}
        costs = {k: compiled[f"layouts.{k}"] for k in self.layouts}
        for path, reason in check_names(self.constants, compiled["argument"], definitions, costs):
            yield Problem(path, reason, self._text_at(path))
        if self.normalize_layout not in self.layouts:
            yield Problem("normalize_layout", "has no cost expression in layouts", str(self.normalize_layout))

    def _text_at(self, path: str) -> str:
        section, _, key = path.partition(".")
        if section == "argument":
            return self.argument
        table = self.definitions if section == "definitions" else {str(k): v for k, v in self.layouts.items()}
        return table[key]


@dataclasses.dataclass(frozen=True)
class MemoryBudget:
    """A per-rank budget that attention weights and KV share (the DCU reference of appendix B)."""

    attention_budget_gib: float = field("GiB per rank for attention weights plus KV", checks=[positive])
    attention_weights_gib: float = field("GiB of the full attention projections W_A (TP/DOP hold 1/T)",
                                         checks=[non_negative])
    kv_bytes_per_token: float = field("KV bytes per token over all cache-bearing layers", checks=[positive])
    reserve_gib: float = field(
        "transient reserve kept outside attention_budget_gib (not subtracted from it; shown for the total)",
        default=0.0, checks=[non_negative])


@dataclasses.dataclass(frozen=True)
class CapacitySpec:
    """Residency assumptions of appendix B: random cohorts and per-rank memory per layout.

    Memory is given either as ``budget`` (every layout's pool derived from it) or as
    ``token_pools`` per layout. ``prescribed_limits_tokens`` holds limits a figure states
    as given boundaries rather than sampled ones; they override sampling for those layouts."""

    batch: int = field("B: requests per cohort", checks=[positive])
    T: int = field("ranks", checks=[positive])
    seed: int = field("PCG64 seed")
    cohorts: int = field("random cohorts per layout", default=200_000, checks=[positive])
    target: float = field("fraction of cohorts that must fit on every rank", default=0.99, checks=[fraction])
    input_low_fraction: float = field("inputs are uniform integers in [floor(f*L), L]; this is f",
                                      default=0.5, checks=[fraction])
    output_tokens: tuple[int, ...] = field("[min, max] of the uniform integer output length", default=(512, 1024))
    budget: MemoryBudget | None = field("per-rank memory budget (or give token_pools)", default=None)
    token_pools: dict[Layout, int] = field("tokens one rank holds, per layout (or give budget)",
                                           default_factory=lambda: _EMPTY)
    prescribed_limits_tokens: dict[Layout, int] = field(
        "limits stated by the source instead of sampled, per layout (tokens)", default_factory=lambda: _EMPTY)
    search_max_tokens: int = field("largest nominal L the search considers", default=1 << 24, checks=[positive])

    def problems(self):
        if len(self.output_tokens) != 2 or not 0 < self.output_tokens[0] <= self.output_tokens[1]:
            yield Problem("output_tokens", "must be [min, max] with 0 < min <= max", list(self.output_tokens))
        if (self.budget is None) == (not self.token_pools):
            yield Problem("budget", "give exactly one of budget and token_pools")
        for layout, pool in self.token_pools.items():
            if pool <= 0:
                yield Problem(f"token_pools.{layout}", "must be > 0", pool)
        for layout, limit in self.prescribed_limits_tokens.items():
            if limit <= 0:
                yield Problem(f"prescribed_limits_tokens.{layout}", "must be > 0", limit)
        if self.budget is not None:
            for layout in Layout:
                if self.pool(layout) <= 0:
                    yield Problem("budget", f"leaves no KV room for {layout}")

    def pool(self, layout: Layout) -> int | None:
        """Tokens one rank holds in ``layout`` (None: no memory given for it)."""
        if self.budget is not None:
            b = self.budget
            return pool_from_budget(layout, b.attention_budget_gib * GIB, b.attention_weights_gib * GIB,
                                    b.kv_bytes_per_token, self.T)
        return self.token_pools.get(layout)


@dataclasses.dataclass(frozen=True)
class PaperValues:
    """Numbers the paper prints for this figure, shown beside the computed ones (1k = 1024 tokens)."""

    crossovers_k: tuple[float, ...] = field("printed crossovers, in k tokens", default=())
    limits_k: dict[Layout, float] = field("printed KV limits per layout, in k tokens", default_factory=lambda: _EMPTY)
    ref: str = field("where they are printed", default="")


@dataclasses.dataclass(frozen=True)
class ScenarioProfile:
    """One illustrative scenario: a figure's timing law and its KV residency assumptions."""

    profile_kind = "scenario"

    name: str = field("profile name")
    title: str = field("plot title, e.g. model, hardware and batch")
    source: str = field("where the scenario comes from (paper section/figure)")
    timing: TimingLawSpec = field("the illustrative timing law (Eq 11-12)")
    capacity: CapacitySpec = field("KV residency assumptions (appendix B)")
    range_tokens: tuple[float, ...] = field("[lo, hi] of nominal L for crossovers and plots", default=(1024.0, 524288.0))
    display_decimals: int = field("decimals of k tokens when printing lengths", default=1, checks=[non_negative])
    paper: PaperValues | None = field("the paper's printed values for comparison (not used to compute)", default=None)
    notes: str = field("caveats and interpretation", default="")

    def problems(self):
        if len(self.range_tokens) != 2 or not 0 < self.range_tokens[0] < self.range_tokens[1]:
            yield Problem("range_tokens", "must be [lo, hi] with 0 < lo < hi", list(self.range_tokens))
