"""The reference scoring whole requests for the reference check: the logits of every row, and
what the check needs to tell a compute format's continuous rounding error from a routing
decision taken the other way (:mod:`~splash_core.runtime.routing_ties`): the router's scores and
choices of every MoE layer (recorded), a run that routes as another did (followed), and a
re-score with one routing decision taken the other way (flipped)."""

from __future__ import annotations

from typing import Mapping

import torch

from ..model.weights import layer_prefix
from .reference_model import ReferenceModel
from .routing_ties import near_tie, routed_weights, router_scores


class HeldWeights:
    """Weights already loaded (another reference's), as a weight source in another format."""

    def __init__(self, weights: Mapping[str, torch.Tensor]):
        self.weights = weights

    def get(self, name, shape, *, rows=None, cols=None, device=None, dtype=None):
        return self.weights[name].to(device=device, dtype=dtype)


class Scorer(ReferenceModel):
    """The reference, giving the logits of every row of a request (not only the last)."""

    flip: tuple[int, int] | None = None  # (MoE layer, position) routed by its closest decision's other side
    follow: Mapping[int, torch.Tensor] | None = None  # MoE layer -> experts [positions, k] to route to
    router: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] | None = None  # layer -> (scores, experts) chunks

    def score(self, request: int, tokens: torch.Tensor, chunk: int, first: int = 0, *,
              record: bool = False, follow: Mapping[int, torch.Tensor] | None = None,
              flip: tuple[int, int] | None = None) -> torch.Tensor:
        """Logits [n - first, V] float32 of positions ``first``.. of ``tokens`` fed from position 0.
        ``record``: keep the router's scores and choices (:meth:`recorded`); ``follow``: send every
        row to these experts (another run's :meth:`recorded` choices) with this run's own weights;
        ``flip``: take that (layer, position)'s closest routing decision the other way."""
        self.flip, self.follow, self.router = flip, follow, ({} if record else None)
        out = []
        try:
            for start in range(0, tokens.numel(), chunk):
                h = self.forward(request, start, tokens[start: start + chunk])
                out.append(self.logits(h[max(0, first - start):]))  # rows before ``first`` predict nothing we check
        finally:
            self.release(request)
            self.flip = self.follow = None
        return torch.cat(out)

    def recorded(self) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """MoE layer -> (router scores [positions, E], experts [positions, k]) of the last recorded
        :meth:`score`."""
        return {layer: (torch.cat([s for s, _ in parts]), torch.cat([e for _, e in parts]))
                for layer, parts in (self.router or {}).items()}

    def margins(self, scores: Mapping[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """MoE layer -> each position's routing margin (:func:`near_tie`) from router ``scores``."""
        return {layer: near_tie(s, self._bias(layer), self.profile.moe)[0] for layer, s in scores.items()}

    def _bias(self, layer: int) -> torch.Tensor | None:
        return self.w.get(f"{layer_prefix(layer)}.mlp.gate.e_score_correction_bias")

    def _route(self, layer: int, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.router is None and self.follow is None and (self.flip is None or self.flip[0] != layer):
            return super()._route(layer, x, pos)
        moe = self.profile.moe
        scores = router_scores(x, self.w[f"{layer_prefix(layer)}.mlp.gate.weight"], moe)
        if self.follow is not None:
            experts = self.follow[layer][pos]
            weights = routed_weights(scores, experts, moe)
        else:
            weights, experts = super()._route(layer, x, pos)
        if self.flip is not None and self.flip[0] == layer:
            rows = (pos == self.flip[1])[:, None]
            if rows.any():
                _, other_weights, other_experts = near_tie(scores, self._bias(layer), moe)
                weights = torch.where(rows, other_weights.to(weights.dtype), weights)
                experts = torch.where(rows, other_experts, experts)
        if self.router is not None:
            self.router.setdefault(layer, []).append((scores, experts))
        return weights, experts
