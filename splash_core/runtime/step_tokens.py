"""A step's greedy tokens on their way to the host, without the host waiting for the device.

``logits.argmax().cpu()`` makes the host wait until the device has run everything queued, then
copy. Here the tokens are chosen on the device (inside the captured graph where the step
replays one), copied asynchronously into pinned host memory, and an event recorded behind the
copy: the host may prepare the next step meanwhile and reads the tokens when it needs them,
waiting only for that event (issue 22 §3). The device tokens themselves can feed the next step
(:meth:`Model.step_tokens <splash_core.runtime.model.Model.step_tokens>` takes device tokens)
without a round trip.
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

    @classmethod
    def start(cls, tokens: torch.Tensor, logits: Callable[[], torch.Tensor], streams) -> "StepTokens":
        """Copy ``tokens`` (device) to the host asynchronously and record the event behind it."""
        if tokens.device.type == "cpu":
            pinned = tokens
        else:
            pinned = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            pinned.copy_(tokens, non_blocking=True)
        event = streams.new_event()
        event.record()
        return cls(tokens, pinned, event, logits)

    def ready(self) -> bool:
        """Whether the tokens are on the host already (never waits)."""
        return bool(self.event.query())

    def host(self) -> np.ndarray:
        """The tokens on the host, waiting for this step's event only."""
        self.event.synchronize()
        return self.pinned.numpy()

    def logits(self) -> torch.Tensor:
        """The step's logits [R, V] float32 (for requests that sample rather than take the argmax).
        Ask before the model's next step: a replayed step's logits live in its graph's buffers,
        which the next replay rewrites (the tokens are a copy and stay)."""
        return self._logits()
