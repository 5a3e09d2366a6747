"""The cuda, hopper and dcu backends: unavailable here with a clear reason, and selected
correctly on faked NVIDIA (sm_90, sm_100) and ROCm machines (no such machine exists here)."""

from __future__ import annotations

import json
import types

import pytest
import torch

from splash_core.cli.main import main
from splash_core.platform import plugins
from splash_core.platform.backend import Backend
from splash_core.profiles.transfer import TransferConfig

GIB = 1 << 30


def _fake_device(monkeypatch, *, name, capability=(9, 0), hip=None, arch="", processors=132,
                 shared=232448, count=2):
    props = types.SimpleNamespace(name=name, multi_processor_count=processors, total_memory=141 * GIB,
                                  shared_memory_per_block_optin=shared, gcnArchName=arch)
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.version, "cuda", None if hip else "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: name)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=0: props)
    monkeypatch.delenv(plugins.ALLOW_ENV, raising=False)


def _registry():
    return plugins.load(entry_points=True)


def test_unavailable_here_with_reasons(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert main(["backends", "--json"]) == 0
    listed = {b["name"]: b for b in json.loads(capsys.readouterr().out)["backends"]}
    for name in ("cuda", "hopper", "dcu"):
        assert not listed[name]["available"] and listed[name]["reason"], name
    assert "built without CUDA" in listed["cuda"]["reason"]
    assert "not a ROCm/HIP build" in listed["dcu"]["reason"]
    assert listed["hopper"]["specializes"] == "cuda"
    assert main(["backends"]) == 0
    assert "hopper" in capsys.readouterr().out


def test_h200_selects_hopper_which_refines_cuda(monkeypatch):
    _fake_device(monkeypatch, name="NVIDIA H200")
    registry = _registry()
    assert plugins.select(registry, "auto") == "hopper"
    backend = Backend(registry, "hopper")
    assert backend.chain[:2] == ["hopper", "cuda"]
    assert backend.hardware_profile() == "h200"
    assert backend.process_group_backend() == "nccl"
    kernels = backend.mla_kernels(torch.device("cuda", 0), torch.bfloat16)
    from splash_backend_hopper import tuned

    # the measured provider table adds cuDNN's expanded prefill (FlashMLA needs its wheel, absent here)
    assert kernels.name == f"triton:{tuned.load()[0].name}+sdpa-expanded"
    assert kernels.decode.keywords["config"].processors == 132
    monkeypatch.setenv(plugins.ALLOW_ENV, "cuda,reference")
    assert plugins.select(plugins.load(), "auto") == "cuda"  # generic NVIDIA path on the same GPU
    cuda = Backend(plugins.load(), "cuda")
    assert cuda.mla_kernels(torch.device("cuda", 0), torch.bfloat16).name == "triton:cuda-generic"


def test_nccl_multicast_stays_off(monkeypatch):
    _fake_device(monkeypatch, name="NVIDIA H200")
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    Backend(_registry(), "hopper").process_group_backend()
    import os

    assert os.environ["NCCL_NVLS_ENABLE"] == "0"


def test_b200_runs_the_cuda_backend_with_its_tiles(monkeypatch):
    _fake_device(monkeypatch, name="NVIDIA B200", capability=(10, 0), processors=148)
    registry = _registry()
    assert registry.check("hopper") == "needs sm_90 (H100/H200), found sm_100 (NVIDIA B200)"
    assert plugins.select(registry, "auto") == "cuda"
    from splash_backend_cuda import plugin

    config = plugin.kernel_config(torch.device("cuda", 0))
    assert config.name == "b200-untuned" and config.processors == 148
    assert Backend(registry, "cuda").hardware_profile() == "b200"


def test_small_shared_memory_gets_the_small_tiles(monkeypatch):
    _fake_device(monkeypatch, name="NVIDIA T4", capability=(7, 5), processors=40, shared=65536)
    from splash_backend_cuda import plugin

    assert plugin.kernel_config(torch.device("cuda", 0)).name == "cuda-small"
    assert Backend(_registry(), "cuda").hardware_profile() is None


def test_rocm_selects_dcu_and_its_64k_tiles(monkeypatch):
    _fake_device(monkeypatch, name="BW1000", hip="6.3.42131", arch="gfx936:sramecc+:xnack-", processors=80)
    registry = _registry()
    assert "ROCm/HIP build" in registry.check("cuda") and "ROCm/HIP build" in registry.check("hopper")
    assert plugins.select(registry, "auto") == "dcu"
    backend = Backend(registry, "dcu")
    assert backend.hardware_profile() == "dcu-bw1000" and backend.process_group_backend() == "nccl"
    from splash_backend_dcu import plugin

    config = plugin.kernel_config(torch.device("cuda", 0))
    assert config.shared_memory_bytes == 64 * 1024 and config.processors == 80
    for tile in (config.decode, config.extend):
        assert tile.shared_bytes(512, 64, 2) <= 64 * 1024
    assert dict(config.launch_options) == {"waves_per_eu": 1}
    assert plugin.supported_formats().kv == ("bf16", "fp16", "fp8")


def test_rocm_formats_follow_the_architecture():
    from splash_backend_dcu.formats import formats_for

    assert formats_for("gfx942").fp8_torch_dtype == "float8_e4m3fnuz"
    assert "fp8" not in formats_for("gfx90a", "AMD Instinct MI250X").kv
    assert "int8" in formats_for("gfx90a").weights


def test_hip_without_a_device_is_unavailable(monkeypatch):
    _fake_device(monkeypatch, name="BW1000", hip="6.3", arch="gfx936")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert "no HIP device visible" in _registry().check("dcu")


def test_hopper_tuned_config_is_data(tmp_path):
    from splash_backend_hopper import tuned

    config, provenance = tuned.load()
    assert config.validate(512, 64, 2) is config and provenance["source"] in ("default", "measured")
    bad = tmp_path / "h200.json"
    bad.write_text(json.dumps({"config": {"name": "x", "decode": {"keys": 24}}}))
    with pytest.raises(ValueError, match="h200.json: not a tuned kernel config: .*power of two"):
        tuned.load(bad)


@pytest.mark.parametrize("zero_policy", [True, False])
def test_side_communicator_asks_nccl_for_a_high_priority_stream_and_copy_engines(monkeypatch, zero_policy):
    """High priority always; the zero-CTA policy where NCCL has it, unless ``transfer.copy_engines`` is off."""
    import torch.distributed as dist

    class FakeNCCL:  # the CPU build of torch has no NCCL process group
        class Options:
            def __init__(self):
                self.is_high_priority_stream = False
                self.config = types.SimpleNamespace(cta_policy=0)

    if zero_policy:
        FakeNCCL.NCCL_CTA_POLICY_ZERO = 2
    monkeypatch.setattr(dist, "ProcessGroupNCCL", FakeNCCL, raising=False)
    _fake_device(monkeypatch, name="NVIDIA H200")
    registry = _registry()
    off = TransferConfig(copy_engines=False)
    assert Backend(registry, "cuda").side_group_options(off).config.cta_policy == 0  # turned off
    for name in ("hopper", "cuda"):
        options = Backend(registry, name).side_group_options()
        assert options.is_high_priority_stream is True and options.config.cta_policy == (2 if zero_policy else 0)
    assert Backend(registry, "reference").side_group_options() is None  # gloo: its defaults


def test_side_collectives_stage_all_gathers_in_registered_symmetric_memory(monkeypatch):
    """Unless ``transfer.copy_engines`` is off, cuda's side collectives make transfer buffers with NCCL
    symmetric memory, each registered with the group once (a collective) and then reused; the
    main group's have none."""
    import sys

    import torch.distributed as dist
    from splash_backend_cuda import common

    calls = []
    fake = types.ModuleType("torch.distributed._symmetric_memory")
    fake.set_backend = lambda name: calls.append(("backend", name))
    fake.empty = lambda n, dtype, device: calls.append(("empty", n)) or torch.zeros(n, dtype=dtype)
    fake.rendezvous = lambda t, group: calls.append(("rendezvous", t.numel(), group))
    monkeypatch.setitem(sys.modules, "torch.distributed._symmetric_memory", fake)
    monkeypatch.setattr(dist, "_symmetric_memory", fake, raising=False)  # where an import loaded the real one
    monkeypatch.setattr(dist, "get_rank", lambda group: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda group: 2)
    group = types.SimpleNamespace(group_name="side")
    off = TransferConfig(copy_engines=False)
    assert common.collectives(group, torch.device("cpu"), side=True, transfer=off).transfer_buffers is None
    side = common.collectives(group, torch.device("cpu"), side=True, transfer=TransferConfig())
    first = side.transfer_buffers.get(("kv", 0), 1000)
    again = side.transfer_buffers.get(("kv", 0), 3000)
    assert first.numel() == 1000 and again.numel() == 3000 and again.data_ptr() == first.data_ptr()
    assert calls == [("backend", "NCCL"), ("empty", 16 << 20), ("rendezvous", 16 << 20, "side")]
    assert common.collectives(group, torch.device("cpu")).transfer_buffers is None


def test_transfer_buffers_grow_keep_what_they_outgrew_and_release():
    from splash_core.platform.collectives import TransferBuffers

    made = []
    buffers = TransferBuffers(lambda n: made.append(n) or torch.zeros(n, dtype=torch.uint8))
    small = buffers.get("a", 10)
    big = buffers.get("a", (16 << 20) + 1)  # outgrown: a new one, the old kept (work may still use it)
    assert made == [16 << 20, 32 << 20] and big.data_ptr() != small.data_ptr()
    assert buffers.get("b", 5).numel() == 5 and buffers.nbytes == (16 + 32 + 16) << 20
    buffers.release()
    assert buffers.nbytes == 0
