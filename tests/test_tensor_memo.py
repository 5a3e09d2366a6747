"""What the kernels derive from a step's index tensors alone is made once a step: reused only for
the same, unchanged tensors and key (kernels/tensor_memo.py)."""

import torch

from splash_core.kernels.tensor_memo import TensorMemo


def test_a_value_is_reused_only_for_the_same_unchanged_tensors_and_key():
    made = []
    memo = TensorMemo()

    def get(tensors, key):
        return memo.get(tensors, key, lambda: made.append(key) or len(made))

    rows, pos = torch.tensor([0, 0, 1], dtype=torch.int32), torch.tensor([5, 6, 9], dtype=torch.int32)
    first = get((rows, pos), 2)
    assert get((rows, pos), 2) == first and len(made) == 1
    assert get((rows.clone(), pos), 2) != first  # equal values, another tensor
    assert get((rows, pos), 3) == 3  # another key
    pos[1] = 7  # in place: the version counter moves
    assert get((rows, pos), 3) == 4
    assert get((rows,), 3) == 5  # fewer tensors never match
    del rows, pos
    assert get((torch.zeros(3, dtype=torch.int32), torch.ones(3, dtype=torch.int32)), 3) == 6  # freed: new
    assert len(made) == 6


def test_the_attention_kernels_row_blocks_follow_row_req():
    from splash_core.kernels.attention import _row_blocks

    row_req = torch.tensor([0, 0, 0, 1, 2, 2], dtype=torch.int32)
    memo = TensorMemo()
    first = memo.get((row_req,), (3, 2), lambda: _row_blocks(row_req, 3, 2))
    row_req[5] = 1
    again = memo.get((row_req,), (3, 2), lambda: _row_blocks(row_req, 3, 2))
    assert again is not first
    for got, want in zip(again[:3], _row_blocks(row_req, 3, 2)[:3]):
        assert torch.equal(got, want)
