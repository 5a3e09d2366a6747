"""SPLASH core: device-neutral ownership model, planner, cost model, scheduler and runtime.

Nothing in this package names a vendor; accelerators arrive as backend plugins
(entry-point group ``splash``), see :mod:`splash_core.platform.hookspecs`.
"""

__version__ = "0.1.0"
