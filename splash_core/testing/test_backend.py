"""The backend describes itself, says it is usable, and hands out a device, a process-group
backend, streams and a hardware profile that follow the contracts."""

from __future__ import annotations

import torch
import torch.distributed as dist

from splash_core.platform.interfaces import BackendInfo, StreamOps
from splash_core.profiles import loader
from splash_core.profiles.hardware import HardwareProfile


def test_info_names_the_backend(conformance_backend):
    info = conformance_backend.info
    assert isinstance(info, BackendInfo)
    assert info.name == conformance_backend.name
    assert info.version and info.summary and info.device_type
    if info.specializes is not None:
        assert info.specializes != info.name


def test_check_says_usable(conformance_backend):
    assert conformance_backend.registry.check(conformance_backend.name) is None


def test_device_has_the_declared_type(conformance_backend, conformance_device):
    assert isinstance(conformance_device, torch.device)
    assert conformance_device.type == conformance_backend.info.device_type


def test_process_group_backend_exists(conformance_backend):
    name = conformance_backend.process_group_backend()
    assert isinstance(name, str) and dist.is_backend_available(name), f"{name!r} is not a torch.distributed backend"


def test_hardware_profile_loads_and_follows_the_schema(conformance_backend):
    ref = conformance_backend.hardware_profile()
    if ref is None:
        return  # a backend may ship no profile (calibrate writes one)
    profile = loader.load("hardware", ref)
    assert isinstance(profile, HardwareProfile)
    assert profile.platform and profile.device
    for key, quantity in profile.quantities().items():
        assert quantity.value >= 0, key
        if quantity.source == "measured":
            assert quantity.date and quantity.machine and quantity.command, key
    for sample in profile.collective_samples:
        assert sample.seconds > 0 and sample.bytes > 0


def test_streams_overlap_and_time(conformance_backend, conformance_device):
    ops = conformance_backend.stream_ops(conformance_device)
    assert isinstance(ops, StreamOps)
    start, end, made, ready = (ops.new_event(timing=True), ops.new_event(timing=True), ops.new_event(),
                               ops.new_event())
    side = ops.new_stream()
    start.record()
    x = torch.arange(1 << 16, dtype=torch.float32, device=conformance_device)
    made.record()
    with ops.use_stream(side):
        made.wait()  # the side stream waits for x
        y = x * 2
        ready.record()
    ready.wait()  # the current stream waits for the side stream's work
    z = y + 1
    end.record()
    end.synchronize()
    ops.synchronize()
    assert ready.query() and end.query()
    assert start.elapsed_time(end) >= 0
    assert torch.equal(z, x * 2 + 1)
    assert ops.current_stream() is not None
