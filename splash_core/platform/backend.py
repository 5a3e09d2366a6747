"""The typed façade the core calls backends through (never raw ``pm.hook``).

A hook the selected backend leaves unanswered falls back along ``specializes`` (a tuned
backend to the generic one it refines) and finally to the reference backend, whose torch code runs on any device.
"""

from __future__ import annotations

from typing import Any

from ..profiles.transfer import TransferConfig
from . import plugins
from .interfaces import (BackendInfo, Collectives, FP8LinearKernels, FusedKernels, GraphOps, KDAKernels, MLAKernels,
                         PeerMemory, StreamOps)


class Backend:
    """One selected backend plugin."""

    def __init__(self, registry: plugins.Registry, name: str):
        self.registry = registry
        self.name = name
        self.info: BackendInfo = registry.info(name)
        self.chain = self._chain(name)

    def _chain(self, name: str) -> list[str]:
        chain, seen = [], set()
        while name and name not in seen and name in self.registry.plugins:
            chain.append(name)
            seen.add(name)
            name = self.registry.info(name).specializes
        if "reference" in self.registry.plugins and "reference" not in chain:
            chain.append("reference")
        return chain

    def _first(self, hook: str, **kwargs) -> Any:
        result = self._first_or_none(hook, **kwargs)
        if result is None:
            raise plugins.BackendError(f"backend {self.name!r} (and its fallbacks {self.chain}) answer no {hook}")
        return result

    def device(self, local_rank: int = 0):
        return self._first("splash_device", local_rank=local_rank)

    def process_group_backend(self) -> str:
        return self._first("splash_process_group_backend")

    def _first_or_none(self, hook: str, **kwargs) -> Any:
        """The first answer along the chain, or None where no backend has one (optional hooks)."""
        for name in self.chain:
            result = plugins._call_one(self.registry, name, hook, **kwargs)
            if result is not None:
                return result
        return None

    def side_group_options(self, transfer: TransferConfig = TransferConfig()) -> Any:
        """The side communicator's process-group options, or None for the defaults."""
        return self._first_or_none("splash_side_group_options", transfer=transfer)

    def collectives(self, group, device, side: bool = False, transfer: TransferConfig = TransferConfig()) -> Collectives:
        return self._first("splash_make_collectives", group=group, device=device, side=side, transfer=transfer)

    def peer_memory(self, collectives, device) -> PeerMemory | None:
        """Memory the group's ranks read from each other, or None where the backend has none."""
        return self._first_or_none("splash_peer_memory", collectives=collectives, device=device)

    def stream_ops(self, device) -> StreamOps:
        return self._first("splash_stream_ops", device=device)

    def graph_ops(self, device) -> GraphOps | None:
        """Capture and replay of device work, or None where the backend has none."""
        return self._first_or_none("splash_graph_ops", device=device)

    def fused_kernels(self, device, dtype) -> FusedKernels:
        return self._first("splash_fused_kernels", device=device, dtype=dtype)

    def mla_kernels(self, device, dtype) -> MLAKernels:
        return self._first("splash_mla_kernels", device=device, dtype=dtype)

    def kda_kernels(self, device, dtype) -> KDAKernels:
        return self._first("splash_kda_kernels", device=device, dtype=dtype)

    def fp8_linear_kernels(self, device, dtype) -> FP8LinearKernels | None:
        """GEMMs against FP8 weights kept as stored, or None where the backend has none."""
        return self._first_or_none("splash_fp8_linear_kernels", device=device, dtype=dtype)

    def hardware_profile(self) -> str | None:
        """The profile of the first backend in the chain that ships one for this device
        type (the reference's host profile never stands in for an accelerator's)."""
        for name in self.chain:
            if self.registry.info(name).device_type != self.info.device_type:
                continue
            result = plugins._call_one(self.registry, name, "splash_hardware_profile")
            if result is not None:
                return result
        return None

    def calibrate(self, collectives, device, options: dict) -> dict | None:
        """The backend's own θ measurement, or None for the core's generic one."""
        return self._first_or_none("splash_calibrate", collectives=collectives, device=device, options=options)

    def __repr__(self) -> str:
        return f"Backend({self.name!r}, chain={self.chain})"


def get_backend(name: str = "auto", registry: plugins.Registry | None = None) -> Backend:
    """Load plugins (unless given a registry) and select ``name`` (or ``auto``)."""
    registry = registry or plugins.load()
    return Backend(registry, plugins.select(registry, name))
