"""Hook specifications every SPLASH backend plugin implements (project name ``splash``).

A backend is one plugin object (usually a module) registered under the entry-point group
``splash``. The core never calls these hooks on every plugin at once except
``splash_backend_info`` and ``splash_backend_check``: the selected backend's hooks are called
through :class:`splash_core.platform.backend.Backend`, and a hook a backend leaves unimplemented (or
answers with None) falls back to the backend it ``specializes``, then to the reference
backend. Hooks marked firstresult stop at the first non-None result.

docs/plugins.md is checked against this file by the test suite, so the two never drift.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("splash")
hookimpl = pluggy.HookimplMarker("splash")


@hookspec
def splash_backend_info():
    """Describe this backend.

    Called once per plugin when plugins load and by ``splash backends``; must be cheap and
    must not touch a device.

    :returns: :class:`splash_core.platform.interfaces.BackendInfo` (name, version, summary,
        device_type, accelerator, specializes). Every backend plugin answers for itself
        (not firstresult).
    """


@hookspec(firstresult=True)
def splash_backend_check():
    """Say whether this backend can run on this machine.

    Called when listing backends and before selecting one; must not raise and must not
    initialise a process group or compile kernels.

    :returns: None when usable, else a one-line reason (``"no accelerator device"``,
        ``"needs compute capability 9.0, found 10.0"``). firstresult.
    """


@hookspec(firstresult=True)
def splash_device(local_rank):
    """The torch device rank ``local_rank`` of this host computes on.

    Called once per rank before the process group is created.

    :param int local_rank: rank within the host.
    :returns: ``torch.device``. firstresult.
    """


@hookspec(firstresult=True)
def splash_process_group_backend():
    """Name of the torch.distributed backend to create groups with.

    Called before ``torch.distributed.init_process_group`` and for every side communicator.

    :returns: a torch.distributed backend name, e.g. ``"gloo"``. firstresult.
    """


@hookspec(firstresult=True)
def splash_side_group_options(transfer):
    """Options for the side communicator, the one a switch moves state over while the compute
    stream runs (passed as ``pg_options`` to ``torch.distributed.new_group``).

    Called once per rank, when the first switch creates that communicator. Use it to give the
    transfers what lets them run beside computation, e.g. a high-priority stream for the
    collective kernels, so they start as soon as processors free up on every rank instead of
    waiting behind the compute kernels queued before them (and their peers waiting for them).

    :param transfer: the deployment's :class:`splash_core.profiles.transfer.TransferConfig`
        (e.g. ``transfer.copy_engines``). Implementations may leave this parameter out.
    :returns: the process-group options object of :func:`splash_process_group_backend`'s
        backend, or None for its defaults. firstresult.
    """


@hookspec(firstresult=True)
def splash_make_collectives(group, device, side, transfer):
    """Collectives over an initialised process group.

    Called once per group (the main one and each side communicator a switch uses).

    :param group: a ``torch.distributed.ProcessGroup`` made with this backend's
        :func:`splash_process_group_backend`.
    :param device: the rank's ``torch.device``.
    :param side: True for the side communicator (made with :func:`splash_side_group_options`).
        Its collectives may have ``transfer_buffers`` (a
        :class:`splash_core.platform.collectives.TransferBuffers`): buffers that its all-gathers move
        without processors (e.g. memory registered with the communicator, for copy engines),
        where ``transfer.copy_engines`` allows. Implementations may leave this parameter out.
    :param transfer: the deployment's :class:`splash_core.profiles.transfer.TransferConfig`
        for the side communicator (the defaults for the main one). Implementations may leave
        this parameter out.
    :returns: an object satisfying :class:`splash_core.platform.interfaces.Collectives` (uneven
        all-to-all and zero-row ranks included). firstresult.
    """


@hookspec(firstresult=True)
def splash_peer_memory(collectives, device):
    """Memory the group's ranks read from each other directly, for KV pools that a switch pulls
    pages out of, rank to rank, on copy engines (no packing kernels, staging buffers or
    collectives carry the pages).

    Called once per rank when a model allocates its KV pool, where the deployment's
    ``transfer.peer_pulls`` asks for pulls (an experimental option, off by default).

    :param collectives: host collectives of the group (``RankContext.host_collectives()``:
        for exchanging handles; they never wait for the device).
    :param device: the rank's ``torch.device``.
    :returns: :class:`splash_core.platform.interfaces.PeerMemory`, or None where this device has none
        (switches then move pages by collectives). firstresult.
    """


@hookspec(firstresult=True)
def splash_stream_ops(device):
    """Streams and events used to overlap a switch's transfers with compute.

    :param device: the rank's ``torch.device``.
    :returns: :class:`splash_core.platform.interfaces.StreamOps`. firstresult.
    """


@hookspec(firstresult=True)
def splash_graph_ops(device):
    """Capture and replay of device work (a device's graphs), for decode steps replayed from
    persistent buffers instead of launched op by op.

    Called once per rank when a model enables decode graphs (``deployment.graphs``).

    :param device: the rank's ``torch.device``.
    :returns: :class:`splash_core.platform.interfaces.GraphOps`, or None where the device cannot
        capture (the model then runs the same static-buffer step eagerly, or its plain step).
        firstresult.
    """


@hookspec(firstresult=True)
def splash_mla_kernels(device, dtype):
    """MLA attention kernels for this device and compute dtype.

    Called once per runtime; may choose tuned configs for the device it finds.

    :param device: ``torch.device`` the cache lives on.
    :param dtype: ``torch.dtype`` of queries and cache.
    :returns: :class:`splash_core.platform.interfaces.MLAKernels`, or None to fall back. firstresult.
    """


@hookspec(firstresult=True)
def splash_fused_kernels(device, dtype):
    """Fused small ops of a step (residual add + RMSNorm, RoPE with the latent-cache write,
    SiLU·mul, optionally the queries' RoPE) for this device and compute dtype.

    Called once per runtime.

    :param device: ``torch.device``.
    :param dtype: ``torch.dtype`` of activations.
    :returns: :class:`splash_core.platform.interfaces.FusedKernels`, or None to fall back. firstresult.
    """


@hookspec(firstresult=True)
def splash_kda_kernels(device, dtype):
    """KDA (gated delta rule) kernels for this device and compute dtype.

    :param device: ``torch.device``.
    :param dtype: ``torch.dtype`` of activations.
    :returns: :class:`splash_core.platform.interfaces.KDAKernels`, or None to fall back. firstresult.
    """


@hookspec(firstresult=True)
def splash_fp8_linear_kernels(device, dtype):
    """GEMMs against FP8 block-scaled weights kept as stored, for this device and compute dtype.

    Called once per runtime, only for a model whose feed-forward weights stay FP8
    (``ffn_weights: fp8``).

    :param device: ``torch.device``.
    :param dtype: ``torch.dtype`` of activations.
    :returns: :class:`splash_core.platform.interfaces.FP8LinearKernels`, or None: the model then
        dequantizes the weights at each use (exactly the dequantize-at-load model, as float32 runs
        always do). firstresult.
    """


@hookspec(firstresult=True)
def splash_hardware_profile():
    """The hardware profile this backend ships for the machine it runs on.

    Called by ``splash calibrate`` to find the profile to start from (its numbers stay
    where calibration measures none), by the conformance suite to check it against the
    profile schema, and by benchmarks to name their results folder.

    :returns: a profile name or path (str), or None. firstresult.
    """


@hookspec(firstresult=True)
def splash_calibrate(collectives, device, options):
    """Measure θ on this machine.

    Called on every rank of a group by ``splash calibrate``; the core writes rank 0's answer
    into a hardware profile, each number marked ``measured`` with date, machine and command.

    :param collectives: :class:`splash_core.platform.interfaces.Collectives` of the group.
    :param device: the rank's ``torch.device``.
    :param dict options: ``{"quick": bool, "dtype": torch.dtype}``; quick runs fewer sizes
        and repeats, dtype is the compute dtype to measure in.
    :returns: dict of profile key -> float (``matmul_tflops``, ``weight_read_gbps``,
        ``kv_read_gbps``, ``all_gather_gbps``, ``all_to_all_gbps``, ``all_reduce_gbps``,
        ``collective_latency_us``, ``memory_gib`` ...) plus optional ``"collective_samples"``
        (list of dicts op/ranks/bytes/seconds) and ``"methods"`` (key -> how it was measured,
        written as the number's ``ref``), or None to use the core's generic measurement
        (:func:`splash_core.studies.calibrate.measure`, which a backend may call and extend).
        firstresult.
    """
