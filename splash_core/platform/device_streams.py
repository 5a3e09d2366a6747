"""StreamOps over a torch accelerator module (streams and events of a GPU-like device).

torch exposes each accelerator family through a module with the same stream API
(``Stream``, ``Event``, ``stream()``, ``current_stream()``, ``synchronize()``); a backend
passes its module and gets :class:`splash_core.platform.interfaces.StreamOps` without repeating this.
"""

from __future__ import annotations

from typing import Any, ContextManager


class DeviceStreamOps:
    """:class:`splash_core.platform.interfaces.StreamOps` for one device of a torch accelerator module."""

    def __init__(self, module: Any, device: Any):
        self.module = module
        self.device = device

    def current_stream(self) -> Any:
        return self.module.current_stream(self.device)

    def new_stream(self) -> Any:
        return self.module.Stream(device=self.device)

    def use_stream(self, stream: Any) -> ContextManager:
        return self.module.stream(stream)

    def new_event(self, timing: bool = False) -> Any:
        return self.module.Event(enable_timing=timing)

    def synchronize(self) -> None:
        self.module.synchronize(self.device)
