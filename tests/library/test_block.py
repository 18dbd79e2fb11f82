"""The Transformer block of the library: attention and an MLP, each a residual sub-layer, pre- or
post-norm (norm_first), and the decoder block with cross-attention."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from attnbook.block import DecoderBlock, TransformerBlock
from attnbook.kv_cache import KVCache

E, H = 16, 4
ATTENTION_PARAMETERS = 4 * E * E + 4 * E  # q_proj, k_proj, v_proj, out_proj: (E, E) weights and (E,) biases
MLP_PARAMETERS = 8 * E * E + 5 * E  # (E, 4E) + (4E,) and (4E, E) + (E,)


def zero_sublayer_outputs(block: nn.Module) -> None:
    """Zero the last projection of every sub-layer: each sub-layer then adds exactly 0."""
    with torch.no_grad():
        for attn in (getattr(block, "attn", None), getattr(block, "cross_attn", None)):
            if attn is not None:
                attn.out_proj.weight.zero_()
                attn.out_proj.bias.zero_()
        if block.mlp is not None:
            block.mlp[2].weight.zero_()
            block.mlp[2].bias.zero_()


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_shapes_parameters_and_state_dict_keys(norm_first, causal):
    torch.manual_seed(0)
    block = TransformerBlock(E, H, causal=causal, norm_first=norm_first).eval()
    x = torch.randn(3, 7, E)
    y, weights = block(x, need_weights=True)
    assert y.shape == x.shape and weights.shape == (3, H, 7, 7)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, H, 7))
    later = x.clone()
    later[:, -1] = torch.randn(3, E)  # another last token (adding a constant would vanish in LayerNorm)
    moved = (block(later)[0][:, :-1] - y[:, :-1]).abs().max().item()  # the earlier tokens' outputs
    assert moved < 1e-5 if causal else moved > 1e-2, moved  # rounding only / the change reaches them
    assert sum(p.numel() for p in block.parameters()) == ATTENTION_PARAMETERS + MLP_PARAMETERS + 2 * 2 * E
    assert list(block.state_dict()) == [
        "norm1.weight", "norm1.bias", *(f"attn.{p}_proj.{t}" for p in "qkv" for t in ("weight", "bias")),
        "attn.out_proj.weight", "attn.out_proj.bias", "norm2.weight", "norm2.bias",
        "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias"]


@pytest.mark.parametrize("causal", [True, False])
def test_residual_block_is_the_identity_when_sublayers_add_nothing(causal):
    torch.manual_seed(1)
    x = torch.randn(2, 5, E)
    block = TransformerBlock(E, H, causal=causal).eval()
    zero_sublayer_outputs(block)
    assert torch.equal(block(x)[0], x)  # the residual path carries x through unchanged


def test_post_norm_normalises_the_output_and_pre_norm_does_not():
    torch.manual_seed(2)
    x = 5 + 3 * torch.randn(2, 6, E)
    for post in (TransformerBlock(E, H, norm_first=False).eval(), DecoderBlock(E, H, norm_first=False).eval()):
        y = post(x)[0] if isinstance(post, TransformerBlock) else post(x, torch.randn(2, 3, E))[0]
        torch.testing.assert_close(y.mean(-1), torch.zeros(2, 6), atol=1e-5, rtol=0)
        torch.testing.assert_close(y.var(-1, unbiased=False), torch.ones(2, 6), atol=1e-3, rtol=0)
    pre = TransformerBlock(E, H, norm_first=True).eval()
    assert pre(x)[0].mean(-1).abs().min() > 1.0  # the residual stream keeps its offset
    assert DecoderBlock(E, H).eval()(x, torch.randn(2, 3, E))[0].mean(-1).abs().min() > 1.0


def test_each_form_is_the_formula_of_its_docstring():
    """pre-norm: x + f(LN(x)) per sub-layer; post-norm: LN(x + f(x)), with the block's own parts."""
    torch.manual_seed(3)
    x = torch.randn(2, 6, E)
    for norm_first in (True, False):
        block = TransformerBlock(E, H, norm_first=norm_first).eval()
        attn = lambda h: block.attn(h)[0]  # noqa: E731
        if norm_first:
            h = x + attn(block.norm1(x))
            expected = h + block.mlp(block.norm2(h))
        else:
            h = block.norm1(x + attn(x))
            expected = block.norm2(h + block.mlp(h))
        torch.testing.assert_close(block(x)[0], expected, rtol=0, atol=0)


@pytest.mark.parametrize("norm_first", [True, False])
def test_causal_block_never_looks_ahead(norm_first, never_looks_ahead):
    torch.manual_seed(3)
    never_looks_ahead(TransformerBlock(E, H, norm_first=norm_first).eval(), E)


def test_encoder_block_sees_every_position_but_no_padded_key(differs):
    torch.manual_seed(4)
    block = TransformerBlock(E, H, causal=False).eval()
    x = torch.randn(2, 7, E)
    key_mask = torch.tensor([[True] * 4 + [False] * 3, [True] * 7])  # (B, S)
    changed = x.clone()
    changed[0, 4:] = 100 * torch.randn(3, E)  # change the padding of sequence 0
    y, weights = block(x, key_mask=key_mask, need_weights=True)
    y_changed = block(changed, key_mask=key_mask)[0]
    torch.testing.assert_close(y[0, :4], y_changed[0, :4], rtol=0, atol=0)  # real positions unchanged
    torch.testing.assert_close(y[1], y_changed[1], rtol=0, atol=0)
    assert weights[0, :, :, 4:].abs().max() == 0
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, H, 7))
    future = x.clone()
    future[1, 6] = torch.randn(E)
    differs(block(future)[0][1, 0], block(x)[0][1, 0], at_least=1e-2)  # not causal: position 0 sees 6


@pytest.mark.parametrize("norm_first", [True, False])
def test_decoder_block_cross_attention(norm_first, differs):
    torch.manual_seed(5)
    block = DecoderBlock(E, H, norm_first=norm_first).eval()
    x, memory = torch.randn(2, 5, E), torch.randn(2, 7, E)  # L = 5 decoder positions, S = 7 source positions
    key_mask = torch.tensor([[True] * 3 + [False] * 4, [True] * 7])  # (B, S): the memory's real positions
    y, self_weights, cross_weights = block(x, memory, key_mask=key_mask, need_weights=True)
    assert y.shape == (2, 5, E) and self_weights.shape == (2, H, 5, 5) and cross_weights.shape == (2, H, 5, 7)
    # every query row sums to 1 over the real keys, and padded keys get exactly 0
    for b, real in enumerate(key_mask.sum(1).tolist()):
        torch.testing.assert_close(cross_weights[b, ..., :real].sum(-1), torch.ones(H, 5))
        assert torch.all(cross_weights[b, ..., real:] == 0)
    assert self_weights.triu(1).abs().max() == 0  # the decoder's self-attention is causal
    padded = memory.clone()
    padded[0, 3:] = torch.randn(4, E)
    torch.testing.assert_close(block(x, padded, key_mask=key_mask)[0], y, rtol=0, atol=0)
    changed = x.clone()
    changed[:, 3:] = torch.randn(2, 2, E)
    torch.testing.assert_close(block(changed, memory, key_mask=key_mask)[0][:, :3], y[:, :3], rtol=0, atol=0)
    # The memory carries no positions, so cross-attention reads it as a set: the memory's positions
    # reordered (keys with their values) give the same output, up to the order of the sums...
    whole = block(x, memory)[0]
    torch.testing.assert_close(block(x, memory.flip(1))[0], whole, rtol=0, atol=1e-5)
    # ...and what it holds matters: another memory, another output
    differs(block(x, torch.randn(2, 7, E))[0], whole, at_least=1e-2)
    if norm_first:  # with every sub-layer adding nothing, the block is the identity on x whatever the memory
        zero_sublayer_outputs(block)
        assert torch.equal(block(x, memory)[0], x)


def test_decoder_block_is_its_own_module_with_three_sublayers():
    block = DecoderBlock(E, H)
    assert not isinstance(block, TransformerBlock)
    names = [n.split(".")[0] for n, _ in block.named_parameters()]
    assert list(dict.fromkeys(names)) == ["norm1", "attn", "cross_norm", "cross_attn", "norm2", "mlp"]
    assert sum(p.numel() for p in block.parameters()) == 2 * ATTENTION_PARAMETERS + MLP_PARAMETERS + 3 * 2 * E
    cache = KVCache(2, H, 8, E // H)
    x, memory = torch.randn(2, 6, E), torch.randn(2, 3, E)
    full = block.eval()(x, memory)[0]
    steps = [block(x[:, :4], memory, cache=cache)[0]] + [block(x[:, t : t + 1], memory, cache=cache)[0]
                                                          for t in (4, 5)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-6, rtol=0)


def test_block_decodes_with_a_cache_as_it_reads_the_whole_sequence():
    """A prompt, then one token at a time through a KVCache: the outputs of the whole sequence."""
    torch.manual_seed(6)
    block = TransformerBlock(E, H, max_len=12).eval()
    x = torch.randn(2, 9, E)
    whole = block(x)[0]
    cache = KVCache(2, H, 12, E // H)
    steps = [block(x[:, :6], cache=cache)[0]] + [block(x[:, t : t + 1], cache=cache)[0] for t in range(6, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, atol=1e-6, rtol=0)


def test_dropout_only_in_training(differs):
    torch.manual_seed(7)
    block = TransformerBlock(E, H, dropout=0.5)
    x = torch.randn(2, 6, E)
    block.train()
    differs(block(x)[0], block(x)[0], at_least=1e-2)  # a new dropout mask on every call
    block.eval()
    assert torch.equal(block(x)[0], block(x)[0])
    plain = TransformerBlock(E, H, dropout=0.0).eval()
    plain.load_state_dict(block.state_dict())
    assert torch.equal(block(x)[0], plain(x)[0])  # in eval mode dropout does nothing at all


def test_bad_arguments_name_themselves():
    with pytest.raises(TypeError, match="`norm_first`"):
        TransformerBlock(E, H, norm_first="pre")
    with pytest.raises(ValueError, match="`mlp_ratio`"):
        TransformerBlock(E, H, mlp_ratio=0)
    with pytest.raises(TypeError, match="`causal`"):
        TransformerBlock(E, H, causal=1)
    with pytest.raises(ValueError, match="`max_len`"):
        TransformerBlock(E, H, causal=False, max_len=8)
    with pytest.raises(ValueError, match="`embed_dim`"):
        TransformerBlock(E, 3)
    with pytest.raises(TypeError, match="residual"):  # the library's block has no such switch
        TransformerBlock(E, H, residual=False)
    x = torch.randn(2, 4, E)
    with pytest.raises(ValueError, match="`key_mask`"):
        TransformerBlock(E, H)(x, key_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="`cache`"):
        TransformerBlock(E, H, causal=False)(x, cache=KVCache(2, H, 8, E // H))
    with pytest.raises(ValueError, match="`key_mask`"):
        TransformerBlock(E, H, causal=False)(x, key_mask=torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="`memory`"):
        DecoderBlock(E, H)(x, None)
    with pytest.raises(TypeError, match="causal"):  # the decoder's self-attention is always causal
        DecoderBlock(E, H, causal=False)
    with pytest.raises(TypeError, match="`norm_first`"):
        DecoderBlock(E, H, norm_first=None)
    with pytest.raises(ValueError, match="`key_mask`"):
        DecoderBlock(E, H)(x, torch.randn(2, 3, E), key_mask=torch.ones(2, 4, dtype=torch.bool))
