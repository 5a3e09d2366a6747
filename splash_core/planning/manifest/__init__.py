"""Switch manifests: the per-layer, per-state, per-rank plan of one layout switch.

:func:`plan_switch` is the entry point; :class:`Manifest` holds one :class:`LayerPlan` per
planned layer, each with a :class:`StatePlan` per state, whose :meth:`StatePlan.rank` gives
the explicit key arrays (:class:`RankBlocks`) a rank executes.
"""

from .diff import RankBlocks
from .fit import Fit, eq5_fit, switch_peak
from .plan import LayerPlan, Manifest, StatePlan, layer_states, plan_precopy, plan_switch

__all__ = ["Fit", "LayerPlan", "Manifest", "RankBlocks", "StatePlan", "eq5_fit", "layer_states", "plan_precopy",
           "plan_switch", "switch_peak"]
