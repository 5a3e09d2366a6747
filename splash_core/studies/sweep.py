"""The paper's fixed-layout sweeps (§5.2, appendices C, H.2, I.2) predicted with the cost model:
B requests of L input tokens arrive together at client concurrency B, each generates
``output`` tokens, and the total throughput is B(L + output)/T_batch.

Two ways to serve a position (``mode``):

- ``disaggregated`` (the paper's protocol): this group prefills in the layout under test;
  each finished prompt's KV goes to a separate decode group that runs one fixed layout
  (DP-attention) and decodes. Both run at once. As in SGLang's disaggregation, the decode
  group pre-allocates a request's KV (prompt + output, per decode rank) before prefill may
  start it, and holds that allocation until the request's last token; the prompt's KV also
  needs room in the prefill pool (Eq 6 in the layout under test) until its transfer ends. So
  a small prefill pool or a full decode group queues requests. Prefill steps take the deployment's
  chunk of rows in arrival order: one chunk over the group in TP and CP, an equal share of
  it per owner rank in DP and DOP (each rank prefills the requests it owns). Decode steps run
  every request whose KV has arrived.
- ``colocated``: one group prefills and decodes in the layout under test
  (:func:`splash_core.studies.simulator.simulate` with that fixed layout).

Every time comes from Eq 10 (:class:`~splash_core.planning.costmodel.CostModel`) with the hardware
profile's θ: a prediction, not a measurement.
"""

from __future__ import annotations

import collections
import dataclasses
import math

import numpy as np

from ..layouts import LAYOUTS, Layout, Ownership
from ..planning.costmodel import BatchArrays, CostModel, rank_loads
from ..planning.ownership import assign_owner
from ..profiles.deployment import Disaggregation

MODES = ("disaggregated", "colocated")
NOTE = ("predicted by the cost model (Eq 10) with the hardware profile's θ for the paper's protocol "
        "(B requests at concurrency B); not a measurement")


@dataclasses.dataclass(frozen=True)
class LayoutPrediction:
    """One layout at one position: throughput, T_batch and what held it back."""

    layout: Layout
    tokens_per_s: float | None  # None: some request never fits this layout
    total_s: float
    prefill_s: float  # when the last prompt finished prefill
    most_resident: int  # most prompts held in the prefill pool at once
    note: str = ""


@dataclasses.dataclass(frozen=True)
class PositionPrediction:
    """Every layout at one position: B requests of ``input_tokens`` generating ``output_tokens``."""

    batch: int  # B: requests, all at once (client concurrency B)
    input_tokens: int
    output_tokens: int
    layouts: tuple[LayoutPrediction, ...] = ()  # in LAYOUTS order

    @property
    def best(self) -> Layout | None:
        """The layout with the highest predicted throughput (ties: first of LAYOUTS)."""
        fit = [p for p in self.layouts if p.tokens_per_s is not None]
        return max(fit, key=lambda p: p.tokens_per_s).layout if fit else None

    def of(self, layout: Layout) -> LayoutPrediction:
        return next(p for p in self.layouts if p.layout is layout)


def predict(deployment, batch: int, input_tokens: int, output_tokens: int = 1024, *, mode: str = "disaggregated",
            layouts=LAYOUTS, prefill_chunk: int | None = None, decode_stride: int = 32) -> PositionPrediction:
    """Every layout's predicted throughput at one sweep position."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)} (got {mode!r})")
    if min(batch, input_tokens, output_tokens, decode_stride) < 1 or (prefill_chunk is not None and prefill_chunk < 1):
        raise ValueError("batch, input and output tokens, the chunk and the decode stride must be >= 1")
    dis = deployment.disaggregation or Disaggregation(decode_T=deployment.T,
                                                      decode_memory_fraction=deployment.memory_fraction,
                                                      decode_common_gib=deployment.common_gib)
    chunk = prefill_chunk or dis.prefill_chunk
    if mode == "colocated":
        return _colocated(deployment, batch, input_tokens, output_tokens, layouts, chunk, decode_stride)
    prefill = CostModel.from_deployment(deployment, cp_recurrent=dis.cp_recurrent)
    decode_dep = decode_deployment(deployment, dis)
    decode = CostModel.from_deployment(decode_dep)
    out = tuple(_Pipeline(deployment, prefill, decode_dep, decode, dis, Layout.parse(str(layout)), batch,
                          input_tokens, output_tokens, chunk, decode_stride).run() for layout in layouts)
    return PositionPrediction(batch, input_tokens, output_tokens, out)


def decode_deployment(deployment, dis: Disaggregation):
    """The decode group as a deployment of its own (same model, hardware and pages)."""
    return dataclasses.replace(deployment, name=f"{deployment.name}-decode", T=dis.decode_T,
                               memory_fraction=dis.decode_memory_fraction, common_gib=dis.decode_common_gib,
                               initial_layout=dis.decode_layout, disaggregation=None)


def _colocated(deployment, batch, input_tokens, output_tokens, layouts, chunk, stride) -> PositionPrediction:
    from ..profiles.workload import SweepSpec, WorkloadProfile
    from .simulator import simulate

    work = WorkloadProfile(name=f"sweep-b{batch}-{input_tokens}", sweep=SweepSpec(batch, input_tokens, output_tokens))
    sim = simulate(deployment, work, policies=tuple(layouts), prefill_chunk=max(1, chunk // deployment.T),
                   decode_stride=stride)
    out = []
    for r in sim.results:
        ok = not r.rejected
        out.append(LayoutPrediction(Layout.parse(r.policy), r.throughput if ok else None, r.total_time_s,
                                    r.total_time_s, max((n for _, _, n in r.trace), default=0),
                                    "" if ok else f"{len(r.rejected)} request(s) never fit"))
    return PositionPrediction(batch, input_tokens, output_tokens, tuple(out))


@dataclasses.dataclass
class _Prompt:
    id: int
    owner: int = -1  # prefill rank that owns it (every layout assigns one; CP and TP ignore it)
    done: int = 0  # prompt tokens prefilled
    finished_s: float = math.inf  # when its last chunk ended
    arrived_s: float = math.inf  # when its KV reached the decode group
    left_s: float = math.inf  # when its KV left the prefill pool (on arrival, or at its last token)
    decode_owner: int = -1
    generated: int = 0


class _Pipeline:
    """One layout at one position: a prefill engine and a decode engine on their own clocks,
    coupled as SGLang's prefill-decode disaggregation couples them: the decode group
    pre-allocates a request's KV (prompt + output) before the prefill group may start it, the
    prefill group holds the prompt's KV until its transfer to that allocation completes, and
    the decode allocation is freed when the request finishes. So a request waits for room on
    both sides, and the decode group's room is held from admission to the last token.

    Each engine only acts on what the other has already decided: a prefill step runs while the
    prefill clock is behind the decode clock (so every decode release before it is known), and
    decode runs up to the prefill clock while prefill has rows (so every prompt that finishes
    before it is known)."""

    def __init__(self, dep, cost: CostModel, decode_dep, decode: CostModel, dis: Disaggregation, layout: Layout,
                 batch: int, input_tokens: int, output_tokens: int, chunk: int, stride: int):
        self.cost, self.dcost = cost, decode
        self.layout, self.li, self.dli = layout, LAYOUTS.index(layout), LAYOUTS.index(dis.decode_layout)
        self.L, self.out, self.chunk, self.stride = input_tokens, output_tokens, chunk, stride
        self.T, self.Td = dep.T, dis.decode_T
        self.batch = batch
        self.owners = layout.ownership is Ownership.OWNER
        self.prompts_per_step = dis.cp_prompts_per_step if layout is Layout.CP else None
        self.queue = collections.deque(_Prompt(i) for i in range(batch))
        self.resident: list[_Prompt] = []  # in the prefill pool: prefilling, or until its KV is sent
        self.decoding: list[_Prompt] = []  # holding a decode allocation: prefilling, in transfer or decoding
        self.served = 0
        self.prefill_clock = self.decode_clock = 0.0
        self.projected = np.zeros(self.T, dtype=np.int64)
        self.decode_projected = np.zeros(self.Td, dtype=np.int64)
        self.most = 0
        self.blocked_at = None  # (resident, allocated) when the last admission attempt found no room
        senders = 1 if self.owners else self.T  # CP's positions and TP's replicas leave from every rank
        bw = dis.kv_transfer_gbps.value * 1e9 * senders if dis.kv_transfer_gbps else math.inf
        self.transfer_s = cost.kv_bytes_token * input_tokens / bw
        self.prefill_room = self._room(cost, dep, layout, chunk, dis.prefill_pool_tokens.get(layout))
        self.decode_room = self._room(decode, decode_dep, dis.decode_layout, 0)
        self.until_last_token = dis.prefill_residency == "last_token"
        self.waves = dis.admission == "waves"
        self._step_cache: dict = {}

    # ---- memory (Eq 6) ----------------------------------------------------------------

    @staticmethod
    def _room(cost: CostModel, dep, layout: Layout, chunk: int, pool_tokens: float | None = None) -> float:
        """Bytes per rank left for KV pages: the testbed's pool where the profile reports it
        (``pool_tokens`` distinct tokens over the group), else the budget less M0, R, the layout's
        weights and the activations of a full chunk (Eq 6's A at its largest)."""
        if pool_tokens is not None:
            per_rank = pool_tokens if layout.ownership is Ownership.ALL else pool_tokens / dep.T
            return per_rank * cost.kv_bytes_token
        i = LAYOUTS.index(layout)
        scratch = 0.0
        if chunk:
            rows = [chunk // dep.T] * dep.T if layout.ownership is Ownership.OWNER else [chunk]
            x = BatchArrays.of([max(r, 2) for r in rows], list(range(len(rows))), query_rows=rows)
            scratch = float(cost.evaluate(x).scratch_bytes[i].max())
        return (dep.memory_budget_bytes - dep.common_bytes - dep.reserve_bytes - float(cost.weights_bytes[i])
                - scratch)

    @staticmethod
    def _fits(cost: CostModel, layout_index: int, room: float, tokens: int, members) -> bool:
        x = BatchArrays.of([tokens] * len(members), [m[0] for m in members], ids=[m[1] for m in members])
        pages = rank_loads(x, cost.T, cost.page_size).reserved_pages[layout_index]  # pages need no top-k
        return float(pages.max(initial=0)) * cost.page_size * cost.kv_bytes_token <= room

    def _admit(self) -> None:
        """Queued requests start, in order, while the decode group can pre-allocate them and
        their prompts fit the prefill pool (in waves: only into an empty prefill pool)."""
        for p in self.resident:
            if p.left_s <= self.prefill_clock:  # the prompt left the prefill pool
                self.projected[p.owner] -= self.L
        self.resident = [p for p in self.resident if p.left_s > self.prefill_clock]
        state = (len(self.resident), len(self.decoding))
        if self.blocked_at == state or (self.waves and self.resident):
            return  # nothing released since the last request did not fit, or the wave is not over
        self.blocked_at = None
        while self.queue:
            p = self.queue[0]
            p.owner = assign_owner(self.projected)
            p.decode_owner = assign_owner(self.decode_projected)
            allocated = [(m.decode_owner, m.id) for m in self.decoding + [p]]
            members = [(m.owner, m.id) for m in self.resident + [p]]
            if not (self._fits(self.dcost, self.dli, self.decode_room, self.L + self.out, allocated)
                    and self._fits(self.cost, self.li, self.prefill_room, self.L, members)):
                self.blocked_at = (len(self.resident), len(self.decoding))
                break
            self.queue.popleft()
            self.resident.append(p)
            self.decoding.append(p)
            self.projected[p.owner] += self.L
            self.decode_projected[p.decode_owner] += self.L + self.out
        self.most = max(self.most, len(self.resident))

    # ---- the engines --------------------------------------------------------------------

    def run(self) -> LayoutPrediction:
        if not self._fits(self.cost, self.li, self.prefill_room, self.L, [(0, 0)]):
            return LayoutPrediction(self.layout, None, math.inf, math.inf, 0,
                                    f"one {self.L:,}-token prompt does not fit {self.layout}'s prefill pool (Eq 6)")
        if not self._fits(self.dcost, self.dli, self.decode_room, self.L + self.out, [(0, 0)]):
            return LayoutPrediction(self.layout, None, math.inf, math.inf, 0,
                                    "one request does not fit the decode group's pool (Eq 6)")
        last_prefill = 0.0
        while self.served < self.batch:
            self._admit()
            rows = self._rows()
            decode_busy = any(math.isfinite(p.arrived_s) for p in self.decoding)
            release = min((p.left_s for p in self.resident), default=math.inf)
            if rows and (self.prefill_clock <= self.decode_clock or not decode_busy):
                last_prefill = self._prefill_step(rows)
            elif decode_busy:
                # prefill is ahead, or waits for room: decode catches up, freeing allocations
                self._decode_until(self.prefill_clock if rows else release)
                if not rows:
                    self.prefill_clock = max(self.prefill_clock, min(self.decode_clock, release))
            elif math.isfinite(release):  # prefill waits for its pool to drain
                self.prefill_clock = release
            else:
                raise RuntimeError("the sweep pipeline is stuck: nothing can make progress")
        total = self.decode_clock
        tokens = self.served * (self.L + self.out)
        return LayoutPrediction(self.layout, tokens / total if total > 0 else None, total, last_prefill, self.most)

    def _rows(self) -> list[tuple[_Prompt, int]]:
        """This prefill step's rows: the group's chunk in arrival order (TP; CP takes at most
        ``cp_prompts_per_step`` prompts), or an equal share of it per owner rank (DP, DOP)."""
        budget = [self.chunk // self.T] * self.T if self.owners else [self.chunk]
        rows = []
        for p in self.resident:
            if p.done < self.L:
                slot = p.owner if self.owners else 0
                take = min(budget[slot], self.L - p.done)
                if take > 0:
                    budget[slot] -= take
                    rows.append((p, take))
                    if len(rows) == self.prompts_per_step:
                        break
        return rows

    def _prefill_step(self, rows) -> float:
        # equal prompts repeat the same steps: cost each distinct one once
        key = tuple((p.done, take, p.owner if self.owners else p.id % self.T) for p, take in rows)
        step = self._step_cache.get(key)
        if step is None:
            x = BatchArrays.of([p.done + take for p, take in rows], [p.owner for p, _ in rows],
                               query_rows=[take for _, take in rows], ids=[p.id for p, _ in rows],
                               reserved=[self.L] * len(rows))
            step = self._step_cache[key] = float(self.cost.evaluate(x).total_s[self.li])
        self.prefill_clock += step
        for p, take in rows:
            p.done += take
            if p.done >= self.L:
                p.finished_s = self.prefill_clock
                p.arrived_s = p.finished_s + self.transfer_s
                p.left_s = math.inf if self.until_last_token else p.arrived_s
        return self.prefill_clock

    def _decode_until(self, limit: float) -> None:
        """Decode a stride of steps over every request whose KV has arrived, cut short where
        another request's KV arrives, or at ``limit`` (the prefill clock while it may still
        finish prompts)."""
        active = [p for p in self.decoding if p.arrived_s <= self.decode_clock]
        pending = [p.arrived_s for p in self.decoding if p.arrived_s > self.decode_clock]
        horizon = min(pending + [limit])
        if not active:
            if not math.isfinite(horizon):
                raise RuntimeError("the sweep pipeline is stuck: the decode group has nothing to wait for")
            self.decode_clock = max(self.decode_clock, horizon)
            return
        k = min(self.stride, min(self.out - p.generated for p in active))
        x = BatchArrays.of([self.L + p.generated + (k + 1) // 2 for p in active], [p.decode_owner for p in active],
                           ids=[p.id for p in active])
        step = float(self.dcost.evaluate(x).total_s[self.dli])
        if math.isfinite(horizon) and horizon > self.decode_clock:
            k = max(1, min(k, math.ceil((horizon - self.decode_clock) / step)))
        self.decode_clock += k * step
        for p in active:
            p.generated += k
            if p.generated >= self.out:
                p.left_s = min(p.left_s, self.decode_clock)
                self.decoding.remove(p)
                self.decode_projected[p.decode_owner] -= self.L + self.out
                self.served += 1
