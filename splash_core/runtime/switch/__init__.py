"""Live layout switching: executing a switch manifest inside a serving step (paper §4.1, §5.5).

Use::

    from splash_core.runtime.switch import SwitchExecutor, SwitchRefused, SwitchFailed, SwitchReport, Mode

    executor = SwitchExecutor(model, ctx)           # ctx: the rank's RankContext
    logits, report = executor.step(batch, tokens, dst, mode="splash")
    manifest = executor.plan(dst, batch)           # what it would execute (Eq 5: manifest.fits)

Every rank calls ``step`` with the same arguments at the same step boundary. The step runs
``batch`` while every layer moves from its current layout to ``dst``; modes ``splash``
(overlapped), ``blocking`` and ``ready`` (measurement) are described in :class:`Mode`.
``SwitchRefused`` (before anything moves) and ``SwitchFailed`` (a transfer failed, histories
intact) are raised on every rank. Each state moves through a :class:`~.transfer.StateMover`
(weights, KV + indexer pages, KDA recurrent state by default); a new kind of state joins
through that contract.

A switch may also span steps: ``executor.precopy(dst, batch, k)`` copies the destination's
missing KV in the background of k ordinary steps, and the handoff ``executor.step(...,
precopy=...)`` moves only the dirty tails (:mod:`.precopy`).

Modules: ``executor`` (the step: the façade and the ``splash`` schedule), ``planner`` (planning a
switching step, the decision's manifest reused, Eq 5's verdict), ``planning`` (the switch plan,
manifests for the model's layers, their peak and the pool checks), ``checks`` (what must hold
before anything moves), ``landing`` (starting, landing, retiring and rolling back one layer at a
time), ``precopy`` (switches spanning steps), ``transfer`` (side communicator,
waits, faults, the mover contract), ``weights_mover``, ``pages_mover``, ``page_pulls``,
``recurrent`` (KDA state), ``modes``, ``report``, ``errors`` and ``tracing`` (what a benchmark
observes). Options come from the deployment's ``transfer:``
(:class:`~splash_core.profiles.transfer.TransferConfig`).
"""

from .errors import SwitchFailed, SwitchRefused, TransferError
from .executor import SwitchExecutor, default_movers
from .modes import Mode
from .planning import SwitchPlan
from .precopy import PreCopy, PreCopyReport
from .report import LayerReport, SwitchReport
from .tracing import SwitchTracer
from .transfer import Fault, StateMover, Transfer, TransferContext

__all__ = ["Fault", "LayerReport", "Mode", "PreCopy", "PreCopyReport", "StateMover", "SwitchExecutor", "SwitchFailed", "SwitchPlan",
           "SwitchRefused", "SwitchReport", "SwitchTracer", "Transfer", "TransferContext", "TransferError",
           "default_movers"]
