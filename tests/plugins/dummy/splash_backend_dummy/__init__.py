"""A test-only SPLASH backend, shaped like a vendor's package.

It claims to be an accelerator backend but reports itself unusable unless
``SPLASH_DUMMY_AVAILABLE=1``, so installing it never changes what ``backend: auto`` picks.
It answers only the hooks it must (who it is, whether it is usable) plus two cheap ones;
every other hook falls back to the reference backend.
"""

import os

from splash_core.platform.hookspecs import hookimpl
from splash_core.platform.interfaces import BackendInfo

ENABLE_ENV = "SPLASH_DUMMY_AVAILABLE"


@hookimpl
def splash_backend_info():
    return BackendInfo(
        name="dummy",
        version="0.0.1",
        summary="test-only external backend (entry point proof)",
        device_type="cpu",
        accelerator=True,
    )


@hookimpl
def splash_backend_check():
    if os.environ.get(ENABLE_ENV) == "1":
        return None
    return f"test-only backend: set {ENABLE_ENV}=1 to make it usable"


@hookimpl
def splash_process_group_backend():
    return "gloo"


@hookimpl
def splash_hardware_profile():
    return "cpu"
