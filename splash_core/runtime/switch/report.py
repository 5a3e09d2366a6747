"""What one switching step did, as this rank saw it."""

from __future__ import annotations

import dataclasses

from ...layouts import Layout
from .modes import Mode


@dataclasses.dataclass(frozen=True)
class LayerReport:
    """One layer's transfer.

    ``transfer_ms`` runs from the first pack to the last write on the side stream (on host
    streams, from launch to landing, so it includes time the transfer sat behind computation);
    ``wait_ms`` is how long the step's compute stream waited for it; ``host_ms`` is the host's
    time issuing and landing it (wall clock); ``primitives`` maps each state to the primitive
    that moved it (``"pull"`` for pages pulled out of peers' pools instead of the plan's
    collective)."""

    index: int
    primitives: dict[str, str]
    bytes_received: dict[str, int]
    transfer_ms: float
    wait_ms: float
    host_ms: float = 0.0


@dataclasses.dataclass(frozen=True)
class SwitchReport:
    """One switching step (or a refused one).

    - ``src``: the layout every moved layer left, or ``"mixed"`` when they left different ones
      (layers already in ``dst`` do not move); ``dst``, ``mode``.
    - ``step_ms``: the timed interval: the whole step (planning check, transfers, compute) in
      ``splash`` and ``blocking``, the step alone in ``ready``.
    - ``exposed_ms``: time the step waited on transfers (the whole transfer in ``blocking``,
      the sum of per-layer waits in ``splash``, 0 in ``ready``).
    - ``bytes_received``: bytes per state this rank received; ``bytes_group``: the same summed
      over the group (padding of uneven all-gathers not counted).
    - ``layers``: per moved layer, in model order.
    - ``plan_ms``: host time spent planning in this call (0 when the manifest was planned
      before, e.g. by :meth:`SwitchExecutor.plan`).
    - ``host_ms``: host time (wall clock) the executor spent on the switch in this call: the
      checks before anything moves (and planning) plus every layer's issuing and landing. Where
      the step's computation is bound by the host, this is what SPLASH adds to it.
    - ``refused``/``reason``: a refused switch changes nothing; ``reason`` has the numbers.
    - ``deferred_layer``: the layer that computed the step in its source layout and moved after
      it (``splash``: the first moving one), or None; its ``wait_ms`` comes after the last layer.
    """

    src: Layout | str
    dst: Layout
    mode: Mode
    step_ms: float = 0.0
    exposed_ms: float = 0.0
    bytes_received: dict[str, int] = dataclasses.field(default_factory=dict)
    bytes_group: dict[str, int] = dataclasses.field(default_factory=dict)
    layers: tuple[LayerReport, ...] = ()
    plan_ms: float = 0.0
    refused: bool = False
    reason: str = ""
    host_ms: float = 0.0
    deferred_layer: int | None = None

    @property
    def moved(self) -> bool:
        """Whether any layer changed layout."""
        return bool(self.layers)

    def summary(self) -> dict:
        """A JSON-ready dict (layouts and modes as strings)."""
        out = dataclasses.asdict(self)
        out.update(src=str(self.src), dst=str(self.dst), mode=str(self.mode))
        return out


def build_report(model, sw, mode: Mode, step_ms: float, exposed) -> SwitchReport:
    """This rank's report of switch ``sw`` (a :class:`~.landing.PreparedSwitch` whose layers
    landed) in a step of ``step_ms``: per landed layer its primitives, bytes and times; the exposed
    time measured as ``exposed`` says (None: the compute stream's waits; a pair of events; a
    number of ms)."""
    layers, received, group = [], {}, {}
    for lm in sw.landed:
        ev, got, prims = lm.events, {}, {}
        for _, t in lm.transfers:
            for s in t.states:
                name, n = s.value, t.received_bytes.get(s, 0)
                got[name] = got.get(name, 0) + n
                prims[name] = t.primitives[s]
                received[name] = received.get(name, 0) + n
                group[name] = group.get(name, 0) + t.group_bytes.get(s, 0)
        layers.append(LayerReport(lm.layer.index, prims, got, ev["t_start"].elapsed_time(ev["t_done"]),
                                  ev["w0"].elapsed_time(ev["w1"]), lm.host_s * 1e3))
    layers.sort(key=lambda r: r.index)
    if exposed is None:
        exposed_ms = float(sum(r.wait_ms for r in layers))
    elif isinstance(exposed, tuple):
        exposed_ms = exposed[0].elapsed_time(exposed[1])
    else:
        exposed_ms = float(exposed)
    host_ms = 1e3 * (sw.host_s + sum(lm.host_s for lm in sw.landed))
    deferred = model.layers[sw.deferred].index if sw.deferred is not None and sw.landed else None
    return SwitchReport(sw.src, sw.dst, mode, float(step_ms), exposed_ms, received, group, tuple(layers),
                        sw.plan_ms, host_ms=host_ms, deferred_layer=deferred)
