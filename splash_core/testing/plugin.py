"""pytest plugin of the conformance suite: options and fixtures (entry point ``pytest11``).

Only the suite's own tests use these fixtures; loading the plugin into another test session
adds three options and nothing else. Importing it is cheap (no torch until a fixture runs).
"""

from __future__ import annotations

import pytest

DTYPES = ("bf16", "fp16", "fp32")


def pytest_addoption(parser):
    group = parser.getgroup("splash", "SPLASH backend conformance (splash_core.testing)")
    group.addoption("--splash-backend", default=None, help="backend the conformance suite checks (default: reference)")
    group.addoption("--splash-ranks", type=int, default=2, help="ranks for the collective checks (default: 2)")
    group.addoption("--splash-dtype", choices=DTYPES, default=None,
                    help="compute dtype of the kernel checks (default: bf16 on accelerators, fp32 on the host)")


@pytest.fixture(scope="session")
def conformance_backend(request):
    """The :class:`~splash_core.platform.backend.Backend` under test; fails every test with the
    reason if it is not usable here."""
    from splash_core.platform.backend import get_backend
    from splash_core.platform.plugins import BackendError

    name = request.config.getoption("splash_backend") or "reference"
    try:
        return get_backend(name)
    except BackendError as exc:
        pytest.fail(f"backend {name!r} cannot be checked on this machine: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def conformance_device(conformance_backend):
    return conformance_backend.device(0)


@pytest.fixture(scope="session")
def conformance_dtype(request, conformance_backend):
    from splash_core.dtypes import torch_dtype

    name = request.config.getoption("splash_dtype") or ("bf16" if conformance_backend.info.accelerator else "fp32")
    return torch_dtype(name)


@pytest.fixture(scope="session")
def conformance_pool(request, conformance_backend):
    """``conformance_pool()`` -> a live RankPool of ``--splash-ranks`` ranks of the backend
    (replaced if an earlier check killed it)."""
    from splash_core.runtime.spawn import RankPool

    ranks = request.config.getoption("splash_ranks")
    devices = _device_count(conformance_backend)
    if devices is not None and devices < ranks:
        pytest.skip(f"--splash-ranks {ranks} needs {ranks} devices, {devices} visible")
    pools: list = []

    def get():
        if not pools or not pools[-1].alive:
            pools.append(RankPool(ranks, backend=conformance_backend.name, timeout_s=300))
        return pools[-1]

    yield get
    for pool in pools:
        pool.close()


def _device_count(backend) -> int | None:
    """Devices of the backend's kind on this host, None for the host itself."""
    import torch

    if not backend.info.accelerator:
        return None
    accelerator = getattr(torch, "accelerator", None)
    return accelerator.device_count() if accelerator is not None else None
