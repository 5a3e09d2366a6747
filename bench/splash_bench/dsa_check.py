"""``bench/costmodel_check.py --dsa``: the cost model's sparse-attention charges against what the
runtime does (:mod:`splash_bench.dsa_accounting`'s counts), step by step in every layout, for tiny
V3.2- and GLM-5-shaped models (:data:`DSA_MODELS`) on two CPU ranks.

Per step: whether decode steps run from captured graphs (the cost model charges replayed steps
only where :func:`~splash_core.profiles.graphs.decode_capturable` says so); per layer, on which
ranks the indexer scores (none where no context exceeds k: the runtime then attends densely) and
the (row, key) pairs sparse attention attends (CP: summed over its ranks, which select globally);
and the bytes each CP rank receives in the exchange of top-k candidates per selecting layer (none
in the other layouts, none where no context exceeds k), except on CP steps whose prefill rows the
cost model prices as gathering the remote history (where a rank selects alone), which SPLASH's
runtime attends in place: those are counted, not compared. Any disagreement, a non-finite count,
a layout without steps or a step without requests is a problem.
"""

from __future__ import annotations

import math

import numpy as np

from splash_core.layouts import LAYOUTS, Layout
from splash_core.planning.costmodel import BatchArrays, CostModel
from splash_core.planning.cp_exchange import candidate_bytes
from splash_core.profiles.loader import load
from splash_core.profiles.model import LayerKind

DSA_TOPK = 8
# (name, its layers and the layers that share the previous selecting layer's top-k)
DSA_MODELS = (("V3.2-shaped", dict(layers=2, shared_layers=())),
              ("GLM-5-shaped, layer 1 sharing layer 0's top-k", dict(layers=3, shared_layers=(1,))))
# contexts beyond k (chunked prefill, mixed and decode steps), then none beyond k (nothing to exchange)
DSA_SCENARIOS = (dict(prompts=[5, 20, 37, 6], owners=[0, 1, 1, 0], new_tokens=4),
                 dict(prompts=[3, 4], owners=[1, 0], new_tokens=3))


def run_dsa(pool, model: dict = DSA_MODELS[0][1]) -> dict[str, list[list[dict]]]:
    """Per layout, every rank's step records of every scenario for ``model`` (one of
    :data:`DSA_MODELS`; :func:`splash_bench.dsa_accounting.count_layout`)."""
    from splash_bench.dsa_accounting import count_layout

    runs = {}
    for layout in (str(x) for x in LAYOUTS):
        per_scenario = [pool.run(count_layout, {"topk": DSA_TOPK, **model, **scenario, "layout": layout})
                        for scenario in DSA_SCENARIOS]
        runs[layout] = [sum((ranks[r] for ranks in per_scenario), []) for r in range(len(per_scenario[0]))]
    return runs


COUNTS = ("candidate_bytes", "scored_rows", "attended_pairs")  # what each rank counts per step and layer


def check_dsa(runs: dict[str, list[list[dict]]], cost: CostModel) -> dict:
    """The runtime's counts ``runs`` (per layout, per rank, per step) against ``cost``; the summary
    lists every problem (an empty one passes)."""
    problems, tally = [], {"compared": 0, "history": 0}
    for layout in (str(x) for x in LAYOUTS):
        ranks = runs.get(layout) or []
        if len(ranks) != cost.T or not all(ranks) or len({len(steps) for steps in ranks}) != 1:
            problems.append(f"{layout}: no steps counted on every one of {cost.T} ranks")
            continue
        for k, records in enumerate(zip(*ranks)):
            problems += _step_problems(f"{layout} step {k}", Layout(layout), records, cost, tally)
    share = _index_share(cost)
    return {"model": f"{cost.model.name} dims, top-k {cost.topk}, {share:.0%} of layers selecting", "T": cost.T,
            "steps_compared": tally["compared"], "cp_history_steps": tally["history"],
            "decode_capturable": cost.decode_capturable, "problems": problems,
            "passed": not problems and tally["compared"] > 0}


def _index_share(cost: CostModel) -> float:
    return next(kc.index_share for kc in cost.kinds if kc.kind is LayerKind.MLA)


def _step_problems(where: str, layout: Layout, records: tuple[dict, ...], cost: CostModel, tally: dict) -> list[str]:
    """One step's counts on every rank against the cost model: graphs or not, which ranks score,
    the pairs attended (CP: summed over the ranks, which select globally) and CP's candidate bytes."""
    bad = [f"{where} rank {i}: {r[c]} {c}" for i, r in enumerate(records) for c in COUNTS if not math.isfinite(r[c])]
    first = records[0]
    if bad or not first["contexts"]:
        return bad or [f"{where}: a step without requests"]
    tally["compared"] += 1
    out = []
    if any(r["graphs"] != cost.decode_capturable for r in records):
        out.append(f"{where}: runtime decode graphs {[r['graphs'] for r in records]}, the cost model charges decode "
                   f"{'replayed' if cost.decode_capturable else 'eager'}")
    x = BatchArrays.of(first["contexts"], first["owners"], query_rows=first["rows"], ids=first["ids"])
    ld = cost.loads(x)
    out += _attention_problems(where, layout, records, cost, x, ld)
    # per selecting layer (layers sharing a top-k exchange nothing), as the cost model states it
    charged = cost.cp_candidate_bytes(x, ld) if layout is Layout.CP else 0.0
    got = [r["candidate_bytes"] / _index_share(cost) for r in records]
    if layout is Layout.CP and all(_history_step(first, charged, g, cost) for g in got):
        tally["history"] += 1
    elif not all(math.isclose(g, charged, rel_tol=1e-9) for g in got):
        out.append(f"{where}: runtime received {got} candidate bytes per selecting layer, the cost model charges "
                   f"{charged:g}")
    return out


def _attention_problems(where: str, layout: Layout, records, cost: CostModel, x: BatchArrays, ld) -> list[str]:
    """Which ranks the indexer scored on, and the pairs attended, against the cost model."""
    i, out = LAYOUTS.index(layout), []
    ran = np.array([r["scored_rows"] > 0 for r in records])
    charged = cost.scored_pairs(x, ld)[i] > 0
    if (ran != charged).any():
        out.append(f"{where}: the indexer scored on ranks {ran.nonzero()[0].tolist()}, the cost model charges "
                   f"scores on {charged.nonzero()[0].tolist()}")
    attended = np.array([r["attended_pairs"] for r in records])
    want = ld.sparse_pairs[i] if ran.any() else np.zeros(cost.T)  # unscored: dense kernels, no sparse pairs
    if layout is Layout.CP:
        attended, want = attended.sum(keepdims=True), want.sum(keepdims=True)
    if not np.allclose(attended, want, rtol=1e-9, atol=0.0):
        out.append(f"{where}: runtime attended {attended.tolist()} (row, key) pairs per layer, the cost model "
                   f"charges {want.tolist()}")
    return out


def _history_step(r: dict, charged: float, got: float, cost: CostModel) -> bool:
    """Whether CP step ``r`` is one whose chunk rows the cost model prices as gathering the history
    (charging the decode rows' candidates alone) while the runtime attended every row in place."""
    def rows_bytes(rows: int) -> float:
        return candidate_bytes(cost.T, float(rows), cost.topk, max(r["contexts"]))

    chunked = any(q > 1 for q in r["rows"])
    every_row = rows_bytes(sum(r["rows"]))
    return chunked and charged == rows_bytes(sum(q == 1 for q in r["rows"])) < every_row and \
        math.isclose(got, every_row, rel_tol=1e-9)


def dsa_cost_model(model: dict = DSA_MODELS[0][1], **kwargs) -> CostModel:
    """The cost model of the runtime :func:`run_dsa` counts for ``model`` (``kwargs``: more options)."""
    from splash_bench.dsa_accounting import PAGE_SIZE, dsa_profile

    return CostModel(dsa_profile(DSA_TOPK, model["shared_layers"]), load("hardware", "cpu"), 2, page_size=PAGE_SIZE,
                     compute_dtype="fp32", layers=range(model["layers"]), sparse=True, **kwargs)


def dsa_summary() -> dict:
    """:func:`check_dsa` of fresh runs of every one of :data:`DSA_MODELS` on two CPU ranks, merged."""
    from splash_core.runtime.spawn import RankPool

    with RankPool(2, backend="reference", timeout_s=300) as pool:
        checks = [(name, check_dsa(run_dsa(pool, model), dsa_cost_model(model))) for name, model in DSA_MODELS]
    return {"model": "; ".join(f"{name}: {c['model']}" for name, c in checks), "T": checks[0][1]["T"],
            "steps_compared": sum(c["steps_compared"] for _, c in checks),
            "cp_history_steps": sum(c["cp_history_steps"] for _, c in checks),
            "decode_capturable": any(c["decode_capturable"] for _, c in checks),
            "problems": [f"{name}: {p}" for name, c in checks for p in c["problems"]],
            "passed": all(c["passed"] for _, c in checks)}
