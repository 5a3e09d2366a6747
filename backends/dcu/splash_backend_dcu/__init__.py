"""SPLASH backend for ROCm/HIP accelerators (entry point ``splash = dcu``)."""

__version__ = "0.1.0"
