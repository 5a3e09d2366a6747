"""Import this before anything imports Triton kernels: it switches Triton to its CPU
interpreter (the flag is read when a kernel is defined). Shared by tests/test_kernels_*.py."""

import os

os.environ["TRITON_INTERPRET"] = "1"
