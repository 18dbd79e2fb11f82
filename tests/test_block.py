"""The Transformer block: shapes, the residual path, pre- and post-norm, causality, key padding, the
decoder block's cross-attention, dropout only in training, equality with chapter 8's block, and
the ablation variants built from it in attnbook_tools.ablations (no residual, no norm, no MLP)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from attnbook.block import DecoderBlock, TransformerBlock
from attnbook.kv_cache import KVCache
from attnbook.models.transformer import TransformerBlock as TinyTransformerBlock
from attnbook_tools.ablations import AblationBlock

E, H = 16, 4
VARIANTS = [
    dict(residual=residual, norm=norm, mlp=mlp)
    for residual, norm, mlp in itertools.product((True, False), ("pre", "post", None), (True, False))
]
ATTENTION_PARAMETERS = 4 * E * E + 4 * E  # q_proj, k_proj, v_proj, out_proj: (E, E) weights and (E,) biases
MLP_PARAMETERS = 8 * E * E + 5 * E  # (E, 4E) + (4E,) and (4E, E) + (E,)


def ids(variant):
    return "-".join(f"{k}={v}" for k, v in variant.items())


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
    assert isinstance(block.attn, nn.Module) and type(block.attn).__name__ == (
        "CausalSelfAttention" if causal else "MultiHeadAttention")
    assert sum(p.numel() for p in block.parameters()) == ATTENTION_PARAMETERS + MLP_PARAMETERS + 2 * 2 * E
    assert list(block.state_dict()) == [
        "norm1.weight", "norm1.bias", *(f"attn.{p}_proj.{t}" for p in "qkv" for t in ("weight", "bias")),
        "attn.out_proj.weight", "attn.out_proj.bias", "norm2.weight", "norm2.bias",
        "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias"]


@pytest.mark.parametrize("causal", [True, False])
def test_residual_block_is_the_identity_when_sublayers_add_nothing(causal):
    torch.manual_seed(1)
    x = torch.randn(2, 5, E)
    for block in (TransformerBlock(E, H, causal=causal), AblationBlock(E, H, causal=causal, norm=None)):
        zero_sublayer_outputs(block.eval())
        assert torch.equal(block(x)[0], x)  # the residual path carries x through unchanged
    for norm in ("pre", None):
        no_residual = AblationBlock(E, H, causal=causal, norm=norm, residual=False).eval()
        zero_sublayer_outputs(no_residual)
        assert torch.equal(no_residual(x)[0], torch.zeros_like(x))  # without it nothing gets through


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


@pytest.mark.parametrize("variant", VARIANTS, ids=ids)
def test_ablation_defaults_and_post_norm_are_the_library_block(variant):
    """An AblationBlock that leaves nothing out is TransformerBlock, state dict and outputs alike."""
    torch.manual_seed(4)
    ablated = AblationBlock(E, H, **variant).eval()
    x = torch.randn(2, 5, E)
    norms = [m for m in ablated.modules() if isinstance(m, nn.LayerNorm)]
    assert len(norms) == (0 if variant["norm"] is None else 1 + variant["mlp"])
    assert (ablated.mlp is not None) == variant["mlp"]
    parameters = ATTENTION_PARAMETERS + (MLP_PARAMETERS if variant["mlp"] else 0) + 2 * E * len(norms)
    assert sum(p.numel() for p in ablated.parameters()) == parameters
    library = TransformerBlock(E, H, norm_first=variant["norm"] != "post").eval()
    assert set(ablated.state_dict()) <= set(library.state_dict())
    if variant["residual"] and variant["mlp"] and variant["norm"] is not None:
        library.load_state_dict(ablated.state_dict())
        assert torch.equal(ablated(x)[0], library(x)[0])
    y, weights = ablated(x, need_weights=True)
    assert y.shape == x.shape and weights.shape == (2, H, 5, 5)


@pytest.mark.parametrize("variant", VARIANTS + [dict(norm_first=False)], ids=ids)
def test_causal_block_never_looks_ahead(variant):
    torch.manual_seed(3)
    block = (TransformerBlock(E, H, **variant) if "norm_first" in variant else AblationBlock(E, H, **variant)).eval()
    x = torch.randn(2, 8, E)
    changed = x.clone()
    changed[:, 5:] = torch.randn(2, 3, E)  # change the future of position 4
    y, y_changed = block(x)[0], block(changed)[0]
    torch.testing.assert_close(y[:, :5], y_changed[:, :5], rtol=0, atol=0)
    assert not torch.allclose(y[:, 5:], y_changed[:, 5:])


def test_encoder_block_sees_every_position_but_no_padded_key():
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
    assert not torch.allclose(block(future)[0][1, 0], block(x)[0][1, 0])  # not causal: position 0 sees 6


@pytest.mark.parametrize("norm_first", [True, False])
def test_decoder_block_cross_attention(norm_first):
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
    assert not torch.allclose(block(x, memory.flip(1))[0], block(x, memory)[0])  # the memory matters
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


def test_default_block_equals_the_tiny_transformer_block():
    """Same seed, same initial weights (same order of creation), same outputs, with and without a cache."""
    torch.manual_seed(6)
    old = TinyTransformerBlock(E, H, max_len=12).eval()
    torch.manual_seed(6)
    new = TransformerBlock(E, H, max_len=12).eval()
    assert list(old.state_dict()) == list(new.state_dict())
    for name, tensor in old.state_dict().items():
        assert torch.equal(tensor, new.state_dict()[name]), name
    x = torch.randn(2, 9, E)
    y_old, w_old = old(x, need_weights=True)
    y_new, w_new = new(x, need_weights=True)
    assert torch.equal(y_old, y_new) and torch.equal(w_old, w_new)
    cache = KVCache(2, H, 12, E // H)
    steps = [new(x[:, :6], cache=cache)[0]] + [new(x[:, t : t + 1], cache=cache)[0] for t in range(6, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), y_new, atol=1e-6, rtol=0)


def test_dropout_only_in_training():
    torch.manual_seed(7)
    block = TransformerBlock(E, H, dropout=0.5)
    x = torch.randn(2, 6, E)
    block.train()
    assert not torch.equal(block(x)[0], block(x)[0])  # a new dropout mask on every call
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
    with pytest.raises(ValueError, match="`norm`"):
        AblationBlock(E, H, norm="middle")
    with pytest.raises(TypeError, match="`residual`"):
        AblationBlock(E, H, residual=1)
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


# ----------------------------------------------------------------------------- the ablation experiments
from attnbook_tools import ablations  # noqa: E402
from attnbook_tools.datafiles import DATA_DIR, DataFileError  # noqa: E402


def test_lookup_task_targets_are_table_entries_of_each_pair():
    table = ablations.lookup_table(8)
    assert table.shape == (8, 8) and torch.equal(table, ablations.lookup_table(8))  # fixed by its seed
    tokens, targets = ablations.lookup_batch(5, 7, table, torch.Generator().manual_seed(0))
    assert tokens.shape == (5, 7) and targets.shape == (5, 6)
    for b in range(5):
        for t in range(1, 7):
            assert targets[b, t - 1] == table[tokens[b, t - 1], tokens[b, t]]
    logits = torch.full((5, 7, 8), -10.0)
    logits[:, 1:].scatter_(-1, targets[..., None], 10.0)  # a perfect prediction from position 1 on
    loss, accuracy = ablations.lookup_loss(logits, targets)
    assert accuracy == 1.0 and loss < 1e-6
    baseline = ablations.constant_baseline(table, num_sequences=50)
    _, targets = ablations.lookup_batch(50, 12, table, torch.Generator().manual_seed(ablations.TEST_SEED))
    assert baseline == pytest.approx(max((targets == v).double().mean().item() for v in range(8)))
    with pytest.raises(ValueError, match="`table`"):
        ablations.lookup_batch(2, 5, torch.zeros(3, 4, dtype=torch.long), torch.Generator())
    with pytest.raises(ValueError, match="`seq_len`"):
        ablations.lookup_batch(2, 1, table, torch.Generator())


@pytest.mark.parametrize("variant", list(ablations.VARIANTS))
def test_ablation_models_use_the_block_variant(variant):
    model = ablations.ablation_model(variant, num_layers=2, vocab_size=8, embed_dim=16, num_heads=2, seq_len=6)
    options = ablations.VARIANTS[variant]
    for block in model.blocks:
        assert isinstance(block, AblationBlock) and isinstance(block, TransformerBlock)
        assert block.residual == options.get("residual", True) and block.norm == options.get("norm", "pre")
        assert (block.mlp is None) == (options.get("mlp", True) is False)
    assert isinstance(model.norm, nn.Identity) == (options.get("norm", "pre") is None)
    tokens = torch.randint(8, (3, 6))
    assert model(tokens).shape == (3, 6, 8)
    with pytest.raises(ValueError, match="`variant`"):
        ablations.ablation_model("no_attention", num_layers=1, vocab_size=8, embed_dim=16, num_heads=2, seq_len=6)


def test_ablation_checkpoints_are_verified(tmp_path):
    with pytest.raises(ValueError, match="`variant`"):
        ablations.checkpoint_path("mlp", "post_norm", 0)
    results = ablations.run(["mlp"], seeds=[5], save_seeds=[5], out=tmp_path, steps=2)
    run = results["runs"]["mlp/full/seed5"]
    assert 0.0 <= run["accuracy"] <= 1.0 and len(run["loss_every_10"]) == 1
    model = ablations.load_ablation_model("mlp", "full", seed=5, data_dir=tmp_path)
    table = ablations.lookup_table(ablations.EXPERIMENTS["mlp"]["vocab_size"])
    _, accuracy = ablations.evaluate_lookup(model, table)
    assert accuracy == run["accuracy"]  # the saved (float16) weights give the recorded accuracy
    path = ablations.checkpoint_path("mlp", "full", 5, tmp_path)
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DataFileError, match="digest"):
        ablations.load_ablation_model("mlp", "full", seed=5, data_dir=tmp_path)


@pytest.mark.skipif(not (DATA_DIR / ablations.RESULTS_FILE).exists(), reason="the ablations are not trained yet")
def test_shipped_ablation_results_cover_every_variant_and_seed():
    results = ablations.load_results()
    for experiment, setting in ablations.EXPERIMENTS.items():
        for variant in setting["variants"]:
            for seed in (0, 1, 2):
                assert f"{experiment}/{variant}/seed{seed}" in results["runs"]
            assert ablations.checkpoint_path(experiment, variant, 0).exists()
