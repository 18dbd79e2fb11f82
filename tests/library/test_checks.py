"""One exception type per kind of mistake, everywhere: TypeError for a wrong type or dtype,
ValueError for a wrong shape or value, and a message naming the function, the argument and what it
got. The table covers the public entry points that take sizes, devices, dtypes and dims."""

from __future__ import annotations

import pytest
import torch

from attnbook.tasks.reversal import ReversalTask
from attnbook.attention import Attention
from attnbook.functional import attention, fused_attention, masked_softmax, split_heads
from attnbook.kv_cache import KVCache
from attnbook.masks import causal_mask, combine_masks, padding_mask
from attnbook.multihead import CausalSelfAttention, MultiHeadAttention
from attnbook.positions import LearnedPositions, sinusoidal_positions
from attnbook.scores import AdditiveScore, BilinearScore, DotScore
from attnbook.tiled import tiled_attention
from attnbook.block import TransformerBlock
from attnbook.models.transformer import TinyTransformer
from attnbook.tasks.repeat import repeat_batch

q = torch.randn(2, 3, 4)

CASES = [
    # positive ints: a non-int is a TypeError, an int <= 0 a ValueError
    (lambda: MultiHeadAttention(8.0, 2), TypeError, ["MultiHeadAttention", "`embed_dim`", "8.0"]),
    (lambda: MultiHeadAttention(8, 0), ValueError, ["MultiHeadAttention", "`num_heads`", "0"]),
    (lambda: CausalSelfAttention(8, 2, max_len="9"), TypeError, ["CausalSelfAttention", "`max_len`", "'9'"]),
    (lambda: CausalSelfAttention(8, 2, max_len=-1), ValueError, ["CausalSelfAttention", "`max_len`", "-1"]),
    (lambda: KVCache(True, 2, 4, 4), TypeError, ["KVCache", "`batch_size`", "bool"]),
    (lambda: KVCache(1, 2, 0, 4), ValueError, ["KVCache", "`max_len`", "0"]),
    (lambda: BilinearScore(4, 0), ValueError, ["BilinearScore", "`key_dim`", "0"]),
    (lambda: AdditiveScore(4, 4, 2.5), TypeError, ["AdditiveScore", "`hidden_dim`", "2.5"]),
    (lambda: TinyTransformer(0, 8), ValueError, ["TinyTransformer", "`vocab_size`", "0"]),
    (lambda: TransformerBlock(8, 2, mlp_ratio=1.5), TypeError, ["TransformerBlock", "`mlp_ratio`", "1.5"]),
    (lambda: repeat_batch(2, None, 4), TypeError, ["repeat_batch", "`half_len`", "NoneType"]),
    (lambda: LearnedPositions(0, 4), ValueError, ["LearnedPositions", "`max_len`", "0"]),
    (lambda: ReversalTask(min_len=1.5), TypeError, ["ReversalTask", "`min_len`", "1.5"]),
    (lambda: ReversalTask().sample(0, seed=0), ValueError, ["ReversalTask.sample", "`n`", "0"]),
    (lambda: tiled_attention(q, q, q, block_size=0), ValueError, ["tiled_attention", "`block_size`", "0"]),
    (lambda: split_heads(q, 3), ValueError, ["split_heads", "E=4", "num_heads=3"]),
    (lambda: split_heads(q, "2"), TypeError, ["split_heads", "`num_heads`", "'2'"]),
    # ints >= 0
    (lambda: causal_mask(-1), ValueError, ["causal_mask", "`L`", "-1"]),
    (lambda: causal_mask(2, 2.0), TypeError, ["causal_mask", "`S`", "2.0"]),
    (lambda: padding_mask([1, 2], max_len=-1), ValueError, ["padding_mask", "`max_len`", "-1"]),
    # devices
    (lambda: causal_mask(2, device="gpu"), ValueError, ["causal_mask", "`device`", "'gpu'"]),
    (lambda: CausalSelfAttention(8, 2, device="gpu"), ValueError, ["CausalSelfAttention", "`device`", "'gpu'"]),
    (lambda: KVCache(1, 2, 4, 4, device=3.0), TypeError, ["KVCache", "`device`", "float"]),
    (lambda: sinusoidal_positions(4, 4, device="tpu9"), ValueError, ["sinusoidal_positions", "`device`", "'tpu9'"]),
    # dtypes
    (lambda: MultiHeadAttention(8, 2, dtype="float16"), TypeError, ["MultiHeadAttention", "`dtype`", "torch.float16"]),
    (lambda: CausalSelfAttention(8, 2, dtype=torch.int64), TypeError, ["CausalSelfAttention", "`dtype`", "torch.int64"]),
    (lambda: sinusoidal_positions(4, 4, dtype=torch.bool), TypeError, ["sinusoidal_positions", "`dtype`", "torch.bool"]),
    # dims
    (lambda: masked_softmax(q, dim=5), ValueError, ["masked_softmax", "`dim`", "5", "3 dims"]),
    (lambda: masked_softmax(q, dim=-4), ValueError, ["masked_softmax", "`dim`", "-4"]),
    (lambda: masked_softmax(q, dim="last"), TypeError, ["masked_softmax", "`dim`", "'last'"]),
    # flags and numbers
    (lambda: MultiHeadAttention(8, 2, bias=1), TypeError, ["MultiHeadAttention", "`bias`", "1"]),
    (lambda: MultiHeadAttention(8, 2, dropout="0.1"), TypeError, ["MultiHeadAttention", "`dropout`", "'0.1'"]),
    (lambda: MultiHeadAttention(8, 2, dropout=1.0), ValueError, ["MultiHeadAttention", "`dropout`", "1.0"]),
    (lambda: sinusoidal_positions(4, 4, base=1), ValueError, ["sinusoidal_positions", "`base`", "1"]),
]


@pytest.mark.parametrize("call, error, fragments", CASES, ids=[" ".join(map(str, c[2][:2])) for c in CASES])
def test_each_kind_of_mistake_has_one_exception_type_and_a_message_naming_it(call, error, fragments, raises_naming):
    with raises_naming(error, *fragments):
        call()


def test_an_unavailable_device_is_named():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="`device`='cuda' is not available"):
        KVCache(1, 2, 4, 4, device="cuda")


def _float_mask(bad):
    """A causal float mask (0 where a query may attend, -inf where not), (3, 3), with ``bad`` (NaN or
    +inf) at query 1, key 0."""
    mask = torch.zeros(3, 3).masked_fill(torch.ones(3, 3, dtype=torch.bool).triu(1), float("-inf"))
    mask[1, 0] = bad
    return mask


# every public entry point that takes a floating mask (added to the scores)
FLOAT_MASK_ENTRIES = {
    "masked_softmax": lambda m: masked_softmax(torch.randn(2, 3, 3), m),
    "attention": lambda m: attention(q, q, q, m),
    "fused_attention": lambda m: fused_attention(q, q, q, m),
    "tiled_attention": lambda m: tiled_attention(q, q, q, m, block_size=2),
    "Attention": lambda m: Attention(DotScore())(q, q, q, m),
    "MultiHeadAttention.forward": lambda m: MultiHeadAttention(4, 2)(q, q, q, mask=m),
    "MultiHeadAttention.forward (sdpa)": lambda m: MultiHeadAttention(4, 2, backend="sdpa")(q, q, q, mask=m),
    "combine_masks": lambda m: (combine_masks(causal_mask(3), m),),
}


@pytest.mark.parametrize("entry", FLOAT_MASK_ENTRIES)
@pytest.mark.parametrize(("bad", "named"), [(float("nan"), "1 NaN"), (float("inf"), "1 +inf")])
def test_a_float_mask_holding_nan_or_plus_inf_is_refused(entry, bad, named, raises_naming):
    """Added to the scores, a NaN (or a +inf) would make its query's row of weights NaN."""
    call = FLOAT_MASK_ENTRIES[entry]
    assert not call(_float_mask(0.0))[0].isnan().any()  # -inf and finite values are what a float mask holds
    argument = "`masks[1]`" if entry == "combine_masks" else "`mask`"
    with raises_naming(ValueError, entry.split(" ")[0] + ":", argument, "finite values or -inf", "(3, 3)", named):
        call(_float_mask(bad))


# ----------------------------------------------------------------------------- the checks' quick paths
SHAPES = [(), (1,), (3,), (0,), (2, 1), (1, 4), (2, 4), (3, 1, 4), (1, 0), (5, 1, 1), (2, 3, 4), (0, 4)]


@pytest.mark.parametrize("first", SHAPES)
@pytest.mark.parametrize("second", SHAPES)
def test_shapes_broadcast_on_tuples_as_torch_broadcasts_them(first, second):
    from attnbook import _tensor_checks

    try:
        expected = tuple(torch.broadcast_shapes(first, second, (1,) * len(first)))
    except RuntimeError:
        expected = None
    assert _tensor_checks._broadcast(first, second, (1,) * len(first)) == expected


@pytest.mark.parametrize("case", [
    {"k": torch.randn(2, 3, 5)},  # a width that differs from the query's
    {"k": torch.randn(2, 3, 4, dtype=torch.float64)},  # another dtype
    {"k": torch.randn(3, 4)},  # too few dims
    {"q": torch.randint(0, 3, (2, 3, 4))},  # integer
    {"q": [[1.0]]},  # not a tensor
])
def test_the_quick_path_of_tensors_refuses_what_the_explained_path_refuses(case):
    from attnbook import _tensor_checks

    tensors = {"q": torch.randn(2, 3, 4), "k": torch.randn(2, 3, 4), **case}
    named = {"query": (tensors["q"], "B, L, D"), "key": (tensors["k"], "B, S, D")}
    assert not _tensor_checks._tensors_fit(named, None, {})
    with pytest.raises((TypeError, ValueError), match="^where: "):
        _tensor_checks.tensors("where", named)
