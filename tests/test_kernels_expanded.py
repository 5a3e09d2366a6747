"""Expanded (MHA-form) MLA attention: the Triton kernel against the torch reference in Triton's
interpreter on CPU (fp16/fp32 only: the interpreter computes bf16 dots wrongly, docs/design.md §6;
bf16 is checked on the GPU by bench/expanded_attention.py), and the reference against a dense
causal softmax built here from scaled_dot_product_attention, so the spec is checked too."""

from __future__ import annotations

import kernel_interpreter  # noqa: F401  (must precede the kernels' import)
import pytest
import torch
import torch.nn.functional as F

from splash_core.kernels import ExpandedTile, triton_expanded_attention
from splash_core.kernels.attention import _row_blocks
from splash_core.kernels.expanded import key_bounds
from splash_core.reference.expanded import expanded_attention as reference
from splash_core.testing.mla_inputs import tolerance

SMALL = ExpandedTile(block_m=16, block_n=16, warps=1, stages=1)

# Per request: (key positions, query positions). A prefill chunk after history (49 keys: not a
# multiple of any tile), a first chunk, a CP-like request holding only later keys than its
# queries (sees nothing), keys without queries, queries without keys, and one decode-like row.
REQUESTS = (
    (range(0, 49), range(40, 49)),
    (range(0, 20), range(0, 20)),
    (range(30, 40), (5, 6)),
    (range(0, 13), ()),
    ((), (3,)),
    (range(0, 31), (30,)),
)


def make_case(dtype, heads, d_n, d_r, d_v, *, requests=REQUESTS, shuffle_keys=False, packed=False, seed=0):
    """Arguments of ``expanded_attention``: rows of all requests interleaved at random; with
    ``shuffle_keys`` each request's keys out of position order; with ``packed`` k_nope and v are
    views of one [M, H, d_n + d_v] tensor (as kv_b's output is)."""
    g = torch.Generator().manual_seed(seed)
    k_pos, q_req, q_pos, k_start = [], [], [], [0]
    for r, (keys, queries) in enumerate(requests):
        keys = torch.tensor(list(keys), dtype=torch.int32)
        if shuffle_keys:
            keys = keys[torch.randperm(len(keys), generator=g)]
        k_pos.append(keys)
        k_start.append(k_start[-1] + len(keys))
        q_req += [r] * len(queries)
        q_pos += list(queries)
    m, n = k_start[-1], len(q_req)
    perm = torch.randperm(n, generator=g)
    kvb = torch.randn(m, heads, d_n + d_v, generator=g)
    k_nope, v = kvb[..., :d_n].to(dtype), kvb[..., d_n:].to(dtype)
    if packed:  # one allocation, two strided views
        whole = kvb.to(dtype)
        k_nope, v = whole[..., :d_n], whole[..., d_n:]
    return (torch.randn(n, heads, d_n + d_r, generator=g).to(dtype), k_nope,
            torch.randn(m, d_r, generator=g).to(dtype), v,
            torch.tensor(q_req, dtype=torch.int32)[perm], torch.tensor(q_pos, dtype=torch.int32)[perm],
            torch.tensor(k_start, dtype=torch.int32), torch.cat(k_pos), (d_n + d_r) ** -0.5)


def check(got, want, dtype):
    (out, lse), (ref_out, ref_lse) = got, want
    atol, rtol = tolerance(dtype)
    empty = torch.isneginf(ref_lse)
    assert empty.any() and (~empty).any()  # every case has rows of both kinds
    assert torch.equal(torch.isneginf(lse), empty)
    assert torch.all(out[empty] == 0)
    torch.testing.assert_close(lse[~empty], ref_lse[~empty], atol=atol, rtol=rtol)
    torch.testing.assert_close(out.float(), ref_out.float(), atol=atol, rtol=rtol)
    assert out.dtype == ref_out.dtype == dtype and lse.dtype == torch.float32


DIMS = [  # (dtype, heads, d_n, d_r, d_v): non-powers of two run through masking
    (torch.float32, 1, 16, 8, 16),
    (torch.float16, 3, 24, 8, 12),
    (torch.float32, 4, 24, 8, 12),
    (torch.float16, 4, 16, 8, 16),
]


@pytest.mark.parametrize("dtype,heads,d_n,d_r,d_v", DIMS)
def test_kernel_matches_reference(dtype, heads, d_n, d_r, d_v):
    case = make_case(dtype, heads, d_n, d_r, d_v)
    check(triton_expanded_attention(SMALL)(*case), reference(*case), dtype)


@pytest.mark.parametrize("tile", [SMALL, ExpandedTile()], ids=lambda t: t.label())
def test_kernel_with_unsorted_keys_and_packed_kv(tile):
    """k_pos is the truth, not the index; k_nope and v as views of one tensor; the default
    tile (fitted to the call) as well as the small one."""
    case = make_case(torch.float16, 3, 24, 8, 12, shuffle_keys=True, packed=True, seed=1)
    assert case[1].stride(1) == 36 and case[3].data_ptr() == case[1].data_ptr() + 24 * 2
    check(triton_expanded_attention(tile)(*case), reference(*case), torch.float16)


def test_kernel_never_reads_keys_past_a_blocks_last_position():
    """Keys of sorted requests after every query's position hold NaN (which any read would
    spread through the value dot): the kernel's loop bound stops before them."""
    requests = ((range(0, 70), range(10, 20)), (range(0, 40), range(0, 4)))
    case = list(make_case(torch.float32, 2, 16, 8, 16, requests=requests, seed=2))
    clean = reference(*case)
    k_nope, v, k_start, k_pos = case[1].clone(), case[3].clone(), case[6].long(), case[7]
    future = torch.zeros(k_pos.numel(), dtype=torch.bool)
    for r, (_, queries) in enumerate(requests):
        future[k_start[r]:k_start[r + 1]] = k_pos[k_start[r]:k_start[r + 1]] > max(queries)
    k_nope[future], v[future] = float("nan"), float("nan")
    case[1], case[3] = k_nope, v
    out, lse = triton_expanded_attention(SMALL)(*case)
    torch.testing.assert_close(out, clean[0], atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(lse, clean[1], atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("shuffle_keys", [False, True])
def test_key_bounds_are_exact(shuffle_keys):
    """Per row block: ``end`` is one past its request's last key at or before the block's
    largest position (sorted keys: the visible count), ``full_end`` the longest prefix of keys
    at or before its smallest position; neither leaves the request."""
    case = make_case(torch.float32, 1, 16, 8, 16, shuffle_keys=shuffle_keys, seed=3)
    q_req, q_pos, k_start, k_pos = case[4], case[5], case[6], case[7]
    order, start, length, _ = _row_blocks(q_req, k_start.numel() - 1, 4)
    full_ends, ends = key_bounds(q_req, q_pos, k_start, k_pos, order, start, length)
    unmasked = 0
    for b in range(start.numel()):
        if length[b] == 0:
            assert ends[b] == 0 and full_ends[b] == 0
            continue
        rows = order[start[b]: start[b] + length[b]].long()
        r = int(q_req[rows[0]])
        assert torch.all(q_req[rows] == r)
        first, end = int(k_start[r]), int(k_start[r + 1])
        keys = k_pos[first:end]
        seen = (keys <= q_pos[rows].max()).nonzero().flatten()
        want = first + int(seen.max()) + 1 if seen.numel() else first
        assert int(ends[b]) == want, (b, r)
        if not shuffle_keys:
            assert want == first + seen.numel()
        hidden = (keys > q_pos[rows].min()).nonzero().flatten()
        assert int(full_ends[b]) == first + (int(hidden.min()) if hidden.numel() else end - first), (b, r)
        unmasked += int(full_ends[b]) - first
    assert unmasked > 0  # the case has blocks with keys every row sees


def test_zero_rows_heads_or_keys_give_empty_results():
    q, k_nope, k_rope, v, q_req, q_pos, k_start, k_pos, scale = make_case(torch.float32, 2, 16, 8, 12)
    kernel = triton_expanded_attention(SMALL)
    out, lse = kernel(q[:0], k_nope, k_rope, v, q_req[:0], q_pos[:0], k_start, k_pos, scale)
    assert out.shape == (0, 2, 12) and lse.shape == (0, 2)
    none = torch.zeros(7, dtype=torch.int32)
    out, lse = kernel(q, k_nope[:0], k_rope[:0], v[:0], q_req, q_pos, none, k_pos[:0], scale)
    assert torch.all(out == 0) and torch.all(torch.isneginf(lse))


def test_bad_inputs_are_one_line_errors():
    q, k_nope, k_rope, v, q_req, q_pos, k_start, k_pos, scale = make_case(torch.float32, 2, 16, 8, 12)
    kernel = triton_expanded_attention(SMALL)
    bad = {
        "width": (q[..., :-1], k_nope, k_rope, v),
        "dtype": (q, k_nope, k_rope.half(), v),
        "heads": (q, k_nope[:, :1], k_rope, v),
        "stride": (q, k_nope, k_rope, v.transpose(0, 2).contiguous().transpose(0, 2)),
    }
    for name, (a, b, c, d) in bad.items():
        with pytest.raises(ValueError) as err:
            kernel(a, b, c, d, q_req, q_pos, k_start, k_pos, scale)
        assert "\n" not in str(err.value), name
    with pytest.raises(ValueError, match="q_req"):
        kernel(q, k_nope, k_rope, v, q_req[1:], q_pos, k_start, k_pos, scale)


def test_tile_is_validated_and_fitted_to_small_calls():
    with pytest.raises(ValueError, match="block_m"):
        ExpandedTile(block_m=24)
    with pytest.raises(ValueError, match="stages"):
        ExpandedTile(stages=0)
    assert ExpandedTile().fitted(1, 5) == ExpandedTile(block_m=16, block_n=16, warps=1, stages=3)
    assert ExpandedTile().fitted(10_000, 100_000) == ExpandedTile()
    assert ExpandedTile().fitted(40, 1000) == ExpandedTile(block_m=64, block_n=64, warps=8)


# ---- the reference against a dense causal softmax -------------------------------------------

def dense(q, k_nope, k_rope, v, q_req, q_pos, k_start, k_pos, scale):
    """Per request and head: one key [d_n + d_r] per key (the rotary part repeated per head),
    an explicit boolean causal mask, and torch's scaled_dot_product_attention in float64."""
    n, heads, width = q.shape
    out = torch.full((n, heads, v.shape[2]), float("nan"), dtype=torch.float64)
    lse = torch.full((n, heads), float("-inf"), dtype=torch.float64)
    for r in range(k_start.numel() - 1):
        rows = (q_req == r).nonzero().flatten()
        first, end = int(k_start[r]), int(k_start[r + 1])
        if rows.numel() == 0 or end == first:
            continue
        keys = torch.cat([k_nope[first:end], k_rope[first:end, None, :].expand(-1, heads, -1)], 2).double()
        mask = k_pos[None, first:end] <= q_pos[rows, None]
        qh, kh, vh = q[rows].double().transpose(0, 1), keys.transpose(0, 1), v[first:end].double().transpose(0, 1)
        out[rows] = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale).transpose(0, 1)
        scores = torch.where(mask, qh @ kh.transpose(1, 2) * scale, float("-inf"))
        lse[rows] = torch.logsumexp(scores, 2).transpose(0, 1)
    return out, lse


@pytest.mark.parametrize("shuffle_keys", [False, True])
def test_reference_matches_dense_causal_softmax(shuffle_keys):
    case = make_case(torch.float32, 3, 24, 8, 12, shuffle_keys=shuffle_keys, seed=4)
    out, lse = reference(*case)
    want_out, want_lse = dense(*case)
    empty = torch.isneginf(want_lse)
    assert empty.any() and (~empty).any()
    assert torch.equal(torch.isneginf(lse), empty) and torch.all(out[empty] == 0)
    torch.testing.assert_close(out[~empty].double(), want_out[~empty], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse[~empty].double(), want_lse[~empty], atol=1e-5, rtol=1e-5)


def test_benchmark_dry_run_writes_its_result(tmp_path):
    """bench/expanded_attention.py --tiny: the GPU benchmark's whole logic on CPU, including its
    bf16-style correctness check (in fp16 here) and a readable result file."""
    from bench_scripts import load_bench

    from splash_core.results import read_result

    bench = load_bench("expanded_attention")
    assert bench.main(["--tiny", "--out", str(tmp_path)]) == 0
    result = read_result(tmp_path / "cpu" / "expanded_attention.json")
    assert result.data["summary"]["correctness"]["correct"]
    assert [(s["batch"], s["rows_per_request"], s["history"], s["heads"])
            for s in result.data["samples"]] == bench.TINY["points"]
    assert all(s["visible_pairs"] == bench.visible_pairs(s["batch"], s["rows_per_request"], s["history"])
               for s in result.data["samples"])
