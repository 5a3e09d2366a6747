"""The runtime's sparse-attention pieces behind the kernel contract (:mod:`splash_core.runtime.sparse_attention`,
:mod:`splash_core.model.dsa_slots`) against the layout-free math of :mod:`splash_core.model.dsa`: on a
request whose pages are shuffled and split as a CP rank holds them, slot selection equals position
selection (ties by position), and positions map back to exactly the slots held."""

from __future__ import annotations

import pytest
import torch

from splash_core.model.dsa import index_scores, select, sparse_attention, visible
from splash_core.model.dsa_slots import key_positions, top_k_slots
from splash_core.reference import dsa as reference_dsa
from splash_core.reference import plugin
from splash_core.runtime.sparse_attention import attend_selected, select_slots, slots_of_positions
from splash_core.runtime.step_context import AttentionView

PAGE, PAGES, D, HEADS, WIDTH, D_C = 4, 6, 8, 3, 24, 16


def test_top_k_slots_rank_ties_by_slot_pad_with_minus_one_and_refuse_nan():
    scores = torch.tensor([[1.0, 3.0, 3.0, float("-inf"), 0.0], [float("-inf")] * 5])
    slots, values = top_k_slots(scores, 3)
    assert slots.tolist() == [[1, 2, 0], [-1, -1, -1]] and values[0].tolist() == [3.0, 3.0, 1.0]
    assert top_k_slots(scores[:, :0], 2)[0].shape == (2, 0)
    with pytest.raises(ValueError, match="NaN"):
        top_k_slots(torch.tensor([[float("nan"), 1.0]]), 1)
    with pytest.raises(ValueError, match="top_k"):
        top_k_slots(scores, 0)


def _paged(held_pages):
    """One request of PAGES pages: physical pages shuffled, this rank holding ``held_pages``
    (logical) listed ascending; (view of two rows at positions 22 and 9, keys, entries, tables)."""
    g = torch.Generator().manual_seed(0)
    physical = torch.randperm(PAGES, generator=g)
    keys = torch.randn(PAGES, PAGE, D, generator=g)
    entries = torch.randn(PAGES, PAGE, WIDTH, generator=g)
    held = torch.tensor(held_pages)
    table, index = physical[held][None].int(), held[None].int()
    view = AttentionView(table, index, torch.zeros(2, dtype=torch.int32), torch.tensor([22, 9], dtype=torch.int32))
    return view, keys, entries, physical


class _KV:
    def __init__(self, entries, keys):
        self.kv, self.indexer, self.layer = entries, keys, 0


def test_selection_and_attention_equal_the_layout_free_math():
    view, keys, entries, physical = _paged(list(range(PAGES)))
    g = torch.Generator().manual_seed(1)
    iq, iw = torch.randn(2, HEADS, D, generator=g), torch.randn(2, HEADS, generator=g)
    q = torch.randn(2, 5, WIDTH, generator=g)
    iq[1] = 0.0  # row 1 scores every key 0: a tie everywhere, broken by position
    kernels = plugin.splash_mla_kernels(torch.device("cpu"), torch.float32)
    slots, kept = select_slots(kernels, iq, iw, _KV(entries, keys), view, topk=5)
    # the same request as one dense history in position order
    order = physical.long()
    dense_keys, dense_entries = keys[order].reshape(-1, D), entries[order].reshape(-1, WIDTH)
    positions = torch.arange(PAGES * PAGE)
    want_scores = index_scores(iq, iw, dense_keys, visible(view.row_pos.long(), positions))
    indices, valid = select(want_scores, 5)
    assert torch.equal(kept, torch.where(valid, indices, -1))
    assert kept[1].tolist() == [0, 1, 2, 3, 4]
    assert torch.equal(key_positions(slots, view.page_index, view.row_req, PAGE), kept)
    out, lse = attend_selected(kernels, q, _KV(entries, keys), view, slots, 0.3, D_C)
    want_out, want_lse = sparse_attention(q, dense_entries, indices, valid, D_C, 0.3)
    torch.testing.assert_close(lse, want_lse)
    torch.testing.assert_close(out, want_out)
    out[0, 0, 0] = float("nan")  # the comparison can fail
    with pytest.raises(AssertionError):
        torch.testing.assert_close(out, want_out)


def test_positions_map_to_the_slots_held_here_and_nowhere_else():
    """A CP rank holding logical pages 1, 3 and 5: positions on them map to its slots, the rest to -1."""
    view, *_ = _paged([1, 3, 5])
    positions = torch.tensor([[4, 7, 12, 21, -1], [0, 5, 8, 13, 20]])
    slots = slots_of_positions(positions, view, PAGE, 6 * PAGE)  # six logical pages, every other held
    assert slots.tolist() == [[0, 3, 4, 9, -1], [-1, 1, -1, 5, 8]]
    assert torch.equal(key_positions(slots, view.page_index, view.row_req, PAGE),
                       torch.where(slots >= 0, positions, -1))
    empty = AttentionView(view.block_table[:, :0], view.page_index[:, :0], view.row_req, view.row_pos)
    assert (slots_of_positions(positions, empty, PAGE, 6 * PAGE) == -1).all()


def test_reference_sparse_kernel_skips_holes_and_rows_without_keys():
    view, keys, entries, _ = _paged([1, 3, 5])
    q = torch.randn(2, 5, WIDTH)
    slots = torch.tensor([[0, 9, -1], [-1, -1, -1]], dtype=torch.int32)
    out, lse = reference_dsa.sparse_attention(q, entries, view.block_table, view.row_req, slots, 0.3, D_C)
    assert torch.isfinite(lse[0]).all() and torch.isneginf(lse[1]).all() and (out[1] == 0).all()
