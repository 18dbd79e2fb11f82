"""Tests for attnbook.masks: padding_mask, causal_mask, combine_masks (True = may attend)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnbook.masks import expand_key_mask, causal_mask, combine_masks, padding_mask

# --- padding_mask -------------------------------------------------------------------------


def test_padding_mask_example():
    expected = torch.tensor([[True, True, True, False], [True, False, False, False]])
    got = padding_mask([3, 1], max_len=4)
    assert got.dtype == torch.bool
    assert torch.equal(got, expected)


def test_padding_mask_default_max_len_is_longest():
    got = padding_mask(torch.tensor([2, 5, 0]))
    assert got.shape == (3, 5)
    assert got.sum(dim=1).tolist() == [2, 5, 0]


def test_padding_mask_list_and_tensor_agree():
    lengths = [4, 0, 2]
    assert torch.equal(padding_mask(lengths, max_len=6), padding_mask(torch.tensor(lengths), max_len=6))


@given(
    lengths=st.lists(st.integers(0, 9), min_size=1, max_size=6),
    extra=st.integers(0, 4),
)
def test_padding_mask_property(lengths, extra):
    max_len = max(lengths) + extra
    mask = padding_mask(lengths, max_len=max_len)
    assert mask.shape == (len(lengths), max_len)
    for b, n in enumerate(lengths):
        # a prefix of exactly n True values, then only False
        assert mask[b, :n].all()
        assert not mask[b, n:].any()


@pytest.mark.parametrize(("lengths", "name", "shown"), [([2, -1], "`lengths[1]`", "-1"),
                                                          (torch.tensor([-3]), "`lengths[0]`", "-3")])
def test_padding_mask_negative_length(raises_naming, lengths, name, shown):
    with raises_naming(ValueError, name, ">= 0", shown):  # the message names the entry at fault
        padding_mask(lengths, max_len=4)


def test_padding_mask_length_longer_than_max_len(raises_naming):
    with raises_naming(ValueError, "`max_len`", "3", "[2, 5]"):
        padding_mask([2, 5], max_len=3)


def test_padding_mask_float_lengths(raises_naming):
    with raises_naming(TypeError, "`lengths[0]`", "float"):
        padding_mask(torch.tensor([1.0, 2.0]))
    with raises_naming(TypeError, "`lengths`", "str"):
        padding_mask("3 1")


def test_padding_mask_2d_lengths(raises_naming):
    with raises_naming(ValueError, "`lengths`", "(2, 2)"):
        padding_mask(torch.ones(2, 2, dtype=torch.long))


@pytest.mark.parametrize("max_len", [2.0, "4", True])
def test_padding_mask_max_len_not_int(raises_naming, max_len):
    with raises_naming(TypeError, "`max_len`", repr(max_len)):
        padding_mask([1, 2], max_len=max_len)


def test_padding_mask_negative_max_len(raises_naming):
    with raises_naming(ValueError, "`max_len`", "-1"):
        padding_mask([0], max_len=-1)


# --- causal_mask --------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 2, 5])
def test_causal_mask_square_is_tril(n):
    expected = torch.ones(n, n, dtype=torch.bool).tril()
    assert torch.equal(causal_mask(n), expected)
    assert torch.equal(causal_mask(n, n), expected)


@given(L=st.integers(0, 9), S=st.integers(0, 9))
def test_causal_mask_row_counts(L, S):
    mask = causal_mask(L, S)
    assert mask.shape == (L, S) and mask.dtype == torch.bool
    for i in range(L):
        assert int(mask[i].sum()) == min(S, max(0, i + S - L + 1))
        # allowed keys are a prefix: j <= i + S - L
        allowed = [j for j in range(S) if j <= i + S - L]
        assert mask[i].nonzero().flatten().tolist() == allowed


def test_causal_mask_bottom_right_examples():
    # one new query and a cache of 4 keys: the query sees every key
    assert causal_mask(1, 4).all()
    # 2 queries, 4 keys: the last query sees all, the one before all but the last key
    assert torch.equal(causal_mask(2, 4), torch.tensor([[True, True, True, False], [True] * 4]))
    # more queries than keys: the first L - S queries see nothing
    assert torch.equal(
        causal_mask(3, 2), torch.tensor([[False, False], [True, False], [True, True]])
    )


def test_causal_mask_device():
    assert causal_mask(3, 4, device="cpu").device.type == "cpu"


@pytest.mark.parametrize(
    ("args", "name", "got"),
    [((2.0,), "`L`", "2.0"), ((3, "4"), "`S`", "'4'"), ((True,), "`L`", "True")],
)
def test_causal_mask_not_int(raises_naming, args, name, got):
    with raises_naming(TypeError, name, got):
        causal_mask(*args)


@pytest.mark.parametrize(("args", "name"), [((-1,), "`L`"), ((2, -3), "`S`")])
def test_causal_mask_negative(raises_naming, args, name):
    with raises_naming(ValueError, name, str(min(args))):
        causal_mask(*args)


# --- combine_masks ------------------------------------------------------------------------


def test_combine_masks_none_passes_through():
    assert combine_masks() is None
    assert combine_masks(None, None) is None
    m = causal_mask(3)
    assert torch.equal(combine_masks(None, m, None), m)


def test_combine_masks_is_and_with_broadcasting():
    pad = padding_mask([2, 3], max_len=3)[:, None, :]  # (B, 1, S)
    causal = causal_mask(3)  # (L, S)
    combined = combine_masks(pad, causal)
    assert combined.shape == (2, 3, 3) and combined.dtype == torch.bool
    assert torch.equal(combined, pad & causal)
    # batch 0, query 2 may not see key 2 (padding) though causal allows it
    assert not combined[0, 2, 2] and combined[1, 2, 2]


@given(
    a=st.lists(st.booleans(), min_size=6, max_size=6),
    b=st.lists(st.booleans(), min_size=6, max_size=6),
    c=st.lists(st.booleans(), min_size=3, max_size=3),
)
def test_combine_masks_algebra(a, b, c):
    a = torch.tensor(a).view(2, 3)
    b = torch.tensor(b).view(2, 3)
    c = torch.tensor(c).view(1, 3)
    assert torch.equal(combine_masks(a, b), a & b)
    assert torch.equal(combine_masks(a, b), combine_masks(b, a))
    assert torch.equal(combine_masks(a, b, c), combine_masks(combine_masks(a, b), c))
    assert torch.equal(combine_masks(a, None, c), a & c)


def test_combine_masks_rejects_integer_masks_and_lists(raises_naming):
    with raises_naming(TypeError, "`masks[1]`", "torch.int64"):
        combine_masks(causal_mask(2), torch.ones(2, 2, dtype=torch.long))
    with raises_naming(TypeError, "`masks[0]`", "list"):
        combine_masks([[True]])


def test_combine_masks_with_a_floating_mask_adds_and_blocks_with_minus_inf():
    additive = torch.tensor([[0.5, -1.0], [2.0, float("-inf")]])
    combined = combine_masks(causal_mask(2), additive, torch.tensor([True, True]))
    assert torch.equal(combined, torch.tensor([[0.5, float("-inf")], [2.0, float("-inf")]]))
    assert torch.equal(combine_masks(additive, additive), 2 * additive)


def test_expand_key_mask_broadcasts_over_queries_and_heads():
    keys = padding_mask([3, 1], max_len=4)  # (B, S)
    assert expand_key_mask(keys).shape == (2, 1, 4)
    assert expand_key_mask(keys, ndim=4).shape == (2, 1, 1, 4)
    assert torch.equal(expand_key_mask(keys).expand(2, 3, 4)[1, 2], keys[1])
    assert expand_key_mask(keys[0]).shape == (4,)


def test_causal_mask_block_is_a_slice_of_the_whole():
    whole = causal_mask(5, 9)
    assert torch.equal(causal_mask(5, 9, rows=slice(1, 4), cols=slice(2, 7)), whole[1:4, 2:7])


def test_combine_masks_rejects_non_broadcasting(raises_naming):
    with raises_naming(ValueError, "`masks[2]`", "(4, 5)", "(3, 3)"):
        combine_masks(causal_mask(3), None, torch.ones(4, 5, dtype=torch.bool))


def test_padding_mask_of_an_empty_batch_is_empty():
    from attnbook.masks import padding_mask

    assert padding_mask([]).shape == (0, 0)
    assert padding_mask([], max_len=3).shape == (0, 3)
