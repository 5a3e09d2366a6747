"""SPLASH backend for NVIDIA GPUs (entry point ``splash = cuda``)."""

__version__ = "0.1.0"
