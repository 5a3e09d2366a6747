"""How decode steps replay captured device graphs: the deployment profile's ``graphs:`` section.

A decode step of ``b`` or fewer query rows per owner rank runs from persistent buffers padded to
``b`` rows per owner (the smallest bucket that holds the step), so its shapes, and with them one
captured graph per (layout, bucket), stay fixed while requests come and go
(:mod:`splash_core.runtime.decode_graphs`).

Whether a model's decode steps can be captured at all is one rule, :func:`decode_capturable`,
which the runtime obeys and the cost model charges (replayed host time, re-capture in a switch,
graph memory).
"""

from __future__ import annotations

import dataclasses

from .schema import Problem, field, one_of, positive

MODES = ("auto", "static", "off")


@dataclasses.dataclass(frozen=True)
class GraphConfig:
    """Options of the captured decode step (issue 22 §1)."""

    mode: str = field(
        "auto: decode steps replay graphs where the backend captures them (GPUs), else run as before; "
        "static: decode steps run from the padded persistent buffers everywhere, replayed where the "
        "backend captures, eagerly otherwise (what CPU tests run); off: never", default="auto",
        checks=[one_of(*MODES)])
    buckets: tuple[int, ...] = field(
        "query rows per owner rank a decode step is padded to (the smallest that holds it); steps "
        "with more rows per owner run eagerly", default=(1, 2, 4, 8, 16, 32, 64, 128))
    min_table_pages: int = field(
        "narrowest block table captured, in pages; tables widen by powers of two as contexts grow "
        "(each widening captures again)", default=16, checks=[positive])
    warmup: int = field("eager runs of a step before it is captured", default=2, checks=[positive])

    def problems(self):
        if not self.buckets or any(b < 1 for b in self.buckets) or list(self.buckets) != sorted(set(self.buckets)):
            yield Problem("buckets", "must be rising positive row counts", list(self.buckets))

    def bucket(self, rows_per_owner: int) -> int | None:
        """The bucket a step of ``rows_per_owner`` rows on its busiest owner is padded to (None: too big)."""
        return bucket_of(self.buckets, rows_per_owner)


def bucket_of(buckets, rows_per_owner: int) -> int | None:
    """The smallest of ``buckets`` holding ``rows_per_owner`` rows (None: none does)."""
    return next((b for b in buckets if b >= rows_per_owner), None)


def decode_capturable(*, kda: bool) -> bool:
    """Whether a model's pure decode steps may run from captured graphs: not where it has KDA
    layers (``kda``: per-request host loops). Sparse attention (DSA) captures: a bucket has one graph
    where no context exceeds k (dense attention, as the eager step) and one where some does (indexer
    scores, top-k and sparse attention over the tables' fixed width), the host choosing per step by
    the longest context as the eager step does. The runtime captures only where this holds; the
    cost model charges replayed steps only there."""
    return not kda
