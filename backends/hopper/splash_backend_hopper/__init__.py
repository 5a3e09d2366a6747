"""SPLASH backend for NVIDIA Hopper GPUs (entry point ``splash = hopper``, refines ``cuda``)."""

__version__ = "0.1.0"
