"""A step's greedy tokens on their way to the host, without the host waiting for the device.

``logits.argmax().cpu()`` makes the host wait until the device has run everything queued, then
copy. Here the tokens are chosen on the device (inside the captured graph where the step
replays one), copied asynchronously into pinned host memory, and an event recorded behind the
copy: the host may prepare the next step meanwhile and reads the tokens when it needs them,
waiting only for that event (issue 22 §3). The device tokens themselves can feed the next step
(:meth:`Model.step_tokens <splash_core.runtime.model.Model.step_tokens>` takes device tokens)
without a round trip. Rank 0's logprobs of the step (:meth:`StepTokens.start`'s ``extra``) travel
the same way, behind the same event, and so does a device flag of a fault found during the step
(NaN indexer scores): :meth:`StepTokens.host` raises its message instead of returning tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np
import torch


@dataclasses.dataclass
class StepTokens:
    """One step's greedy tokens [R] in batch order: on the device at once, on the host once
    :attr:`event` has completed."""

    device: torch.Tensor  # [R] int64 on the step's device
    pinned: torch.Tensor  # [R] int64 host memory the copy lands in
    event: Any  # recorded behind the copy (StreamOps.new_event)
    _logits: Callable[[], torch.Tensor]
    extra: torch.Tensor | None = None  # host memory the ``extra`` copy lands in
    failed: torch.Tensor | None = None  # host memory the fault flag's copy lands in
    fault: str = ""  # what a set flag means

    @classmethod
    def start(cls, tokens: torch.Tensor, logits: Callable[[], torch.Tensor], streams,
              extra: torch.Tensor | None = None, failed: torch.Tensor | None = None, fault: str = "") -> "StepTokens":
        """Copy ``tokens`` (device), and ``extra`` and the bool flag ``failed`` (``fault``: its
        message) where given, to the host asynchronously and record the event behind them."""
        event = streams.new_event()
        host = lambda t: None if t is None else _to_host(t)  # noqa: E731
        out = cls(tokens, _to_host(tokens), event, logits, host(extra), host(failed), fault)
        event.record()
        return out

    def ready(self) -> bool:
        """Whether the tokens are on the host already (never waits)."""
        return bool(self.event.query())

    def host(self) -> np.ndarray:
        """The tokens on the host, waiting for this step's event only; ValueError (the fault's
        message) where the step's fault flag is set."""
        self.event.synchronize()
        if self.failed is not None and bool(self.failed):
            raise ValueError(self.fault)
        return self.pinned.numpy()

    def extra_host(self) -> np.ndarray | None:
        """The ``extra`` tensor on the host (after :meth:`host`, or waiting for the event likewise)."""
        if self.extra is None:
            return None
        self.event.synchronize()
        return self.extra.numpy()

    def logits(self) -> torch.Tensor:
        """The step's logits [R, V] float32 (for requests that sample rather than take the argmax).
        Ask before the model's next step: a replayed step's logits live in its graph's buffers,
        which the next replay rewrites (the tokens are a copy and stay)."""
        return self._logits()


def _to_host(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself on the host, else a copy into pinned host memory that does not wait."""
    if tensor.device.type == "cpu":
        return tensor
    pinned = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    pinned.copy_(tensor, non_blocking=True)
    return pinned
