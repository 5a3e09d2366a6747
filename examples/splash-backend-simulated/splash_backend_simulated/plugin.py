"""Hook implementations of the simulated device backend (entry point ``simulated``).

Hooks left out here (streams, peer memory, KDA kernels, calibration) fall back to the
reference backend, as they would for a new vendor backend that has not written them yet.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.distributed as dist

from splash_core.platform.collectives import TransferBuffers
from splash_core.platform.hookspecs import hookimpl
from splash_core.platform.interfaces import BackendInfo
from splash_core.reference import plugin as reference

from . import __version__, mla
from .collectives import CountingCollectives

# Shipped in the package: the core's profile names cover only the core's own profiles, so a
# backend hands out its profile by path.
STARTING_PROFILE = Path(__file__).with_name("simulated.yaml")


# accelerator=False: `backend: auto` never picks it; deployments name it.
INFO = BackendInfo("simulated", __version__, "example backend: a simulated device on the CPU (gloo), for developing "
                   "a backend without its hardware", device_type="cpu", accelerator=False)


@hookimpl
def splash_backend_info():
    return INFO


@hookimpl
def splash_backend_check():
    if not (dist.is_available() and dist.is_gloo_available()):
        return "this torch build has no gloo"
    return None


@hookimpl
def splash_device(local_rank):
    return torch.device("cpu")  # every simulated rank is a host process


@hookimpl
def splash_process_group_backend():
    return "gloo"


@hookimpl
def splash_make_collectives(group, device, side, transfer):
    # A device library would gather the side communicator's transfers in memory registered with
    # it, allocated once and reused; plain host tensors stand in for that memory here, so the
    # switch's in-place all-gathers into reused buffers run on the CPU too.
    if side and transfer.copy_engines:
        allocate = lambda nbytes: torch.zeros(nbytes, dtype=torch.uint8, device=device)  # noqa: E731
        return CountingCollectives(group, device, transfer_buffers=TransferBuffers(allocate))
    return CountingCollectives(group, device)


@hookimpl
def splash_mla_kernels(device, dtype):
    # Our own decode; extend, merge, pack and unpack stay the reference's.
    return dataclasses.replace(reference.splash_mla_kernels(device, dtype), decode=mla.decode, name="simulated")


@hookimpl
def splash_fp8_linear_kernels(device, dtype):
    # No FP8 GEMMs of our own: the reference's W8A8 spec (a device plugin returns its kernels here).
    return reference.splash_fp8_linear_kernels(device, dtype)


@hookimpl
def splash_hardware_profile():
    return str(STARTING_PROFILE)
