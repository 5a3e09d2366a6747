"""The reference backend: torch ops + gloo on CPU, the executable spec every backend is
checked against. Registered through the same path as external plugins."""
