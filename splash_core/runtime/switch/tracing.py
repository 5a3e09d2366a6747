"""What a switch executor lets an observer see: a benchmark's way in, so none patches the product.

A :class:`SwitchTracer` given to :class:`~.executor.SwitchExecutor` (``tracer=``) is called at
fixed points of every step and switch the executor runs; this base class does nothing at each,
and the executor calls it only when one is given, so serving pays nothing.

- ``span(name)``: a context manager around the executor's host work, outermost first:
  ``prepare`` (planning and the checks before anything moves), then per layer ``start`` (its
  transfer issued) and ``land`` (waited for and landed); inside those ``issue`` (a collective
  issued), ``wait`` (waited for), ``pull`` (pages pulled out of a peer's pool), ``pack`` and
  ``unpack`` (the page kernels).
- ``layer(pos)``: a context manager around the executor's work at the boundary before model
  layer position ``pos`` computes, in every mode (in ``ready`` and ``blocking`` there is none:
  the boundary alone).
- ``step_end()``: once the step's last layer and LM head are issued, before the executor waits
  for the step.
"""

from __future__ import annotations

import contextlib


class SwitchTracer:
    """Observer of a switch executor (see the module docstring); every hook is a no-op here."""

    def span(self, name: str):
        return contextlib.nullcontext()

    def layer(self, pos: int):
        return contextlib.nullcontext()

    def step_end(self) -> None:
        return None


QUIET = SwitchTracer()  # what transfers report to when no one observes them
