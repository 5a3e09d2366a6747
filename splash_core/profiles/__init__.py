"""Profiles: YAML files loaded into frozen, validated dataclasses (docs/design.md §5).

Kinds: hardware (θ), model (dims, layer kinds, formats), deployment (backend + hardware +
model + T + memory policy), scenario (the paper's illustrative timing/capacity studies) and
workload (requests to serve).
"""

from .loader import available, find, kinds, load, load_file
from .schema import ProfileError

__all__ = ["ProfileError", "available", "find", "kinds", "load", "load_file"]
