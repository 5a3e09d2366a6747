"""Hook implementations of the reference backend (entry point ``splash = reference``)."""

from __future__ import annotations

import torch

from .. import __version__
from ..model import ops as fused
from ..platform.collectives import DistCollectives
from ..platform.hookspecs import hookimpl
from ..platform.interfaces import BackendInfo, KDAKernels, MLAKernels
from . import dsa, expanded, kda, mla
from .streams import HostStreamOps


@hookimpl
def splash_backend_info():
    return BackendInfo(
        name="reference",
        version=__version__,
        summary="torch ops + gloo on CPU: the executable spec every backend is tested against",
        device_type="cpu",
        accelerator=False,
    )


@hookimpl
def splash_backend_check():
    return None  # CPU and gloo are always there


@hookimpl
def splash_device(local_rank):
    return torch.device("cpu")


@hookimpl
def splash_process_group_backend():
    return "gloo"


@hookimpl
def splash_make_collectives(group, device):
    return DistCollectives(group, device)


@hookimpl
def splash_peer_memory(collectives, device):
    from . import peer_memory

    # Host files serve host ranks only (an accelerator's backend brings its own). On the host a
    # pull is a copy like gloo's, plus a host collective per layer: the executable spec of
    # pulls, not a speed-up (deployments ask for pulls with transfer.peer_pulls).
    if torch.device(device).type != "cpu" or not peer_memory.available():
        return None
    return peer_memory.HostPeerMemory(collectives)


@hookimpl
def splash_stream_ops(device):
    return HostStreamOps()


@hookimpl
def splash_mla_kernels(device, dtype):
    return MLAKernels(
        decode=mla.attention, extend=mla.attention, merge=mla.merge, pack=mla.pack,
        unpack=mla.unpack, name="reference", expanded=expanded.expanded_attention,
        index_scores=dsa.index_scores, sparse=dsa.sparse_attention,
    )


@hookimpl
def splash_fp8_linear_kernels(device, dtype):
    from . import fp8_linear

    return fp8_linear.KERNELS


@hookimpl
def splash_fused_kernels(device, dtype):
    return fused.KERNELS


@hookimpl
def splash_kda_kernels(device, dtype):
    return KDAKernels(chunk=kda.recurrent, step=kda.recurrent, name="reference")


@hookimpl
def splash_hardware_profile():
    return "cpu"
