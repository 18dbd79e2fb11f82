"""The ablation variants of chapter 8b (attnbook_tools.ablations): the library's block with a part
left out, composed from its parts, and the shipped ablation runs."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from attnbook.block import TransformerBlock
from attnbook_tools import ablations
from attnbook_tools.ablations import AblationBlock
from attnbook_tools.datafiles import DATA_DIR, DataFileError

E, H = 16, 4
VARIANTS = [
    dict(residual=residual, norm=norm, mlp=mlp)
    for residual, norm, mlp in itertools.product((True, False), ("pre", "post", None), (True, False))
]
ATTENTION_PARAMETERS = 4 * E * E + 4 * E  # q_proj, k_proj, v_proj, out_proj: (E, E) weights and (E,) biases
MLP_PARAMETERS = 8 * E * E + 5 * E  # (E, 4E) + (4E,) and (4E, E) + (E,)


def ids(variant):
    return "-".join(f"{k}={v}" for k, v in variant.items())


@pytest.mark.parametrize("causal", [True, False])
def test_without_the_residual_path_nothing_gets_through_zeroed_sublayers(causal):
    torch.manual_seed(1)
    x = torch.randn(2, 5, E)
    with_residual = AblationBlock(E, H, causal=causal, norm=None).eval()
    for norm in ("pre", None):
        no_residual = AblationBlock(E, H, causal=causal, norm=norm, residual=False).eval()
        for block in (with_residual, no_residual):
            with torch.no_grad():  # every sub-layer then adds exactly 0
                for layer in (block.attn.out_proj, block.mlp[2]):
                    layer.weight.zero_()
                    layer.bias.zero_()
        assert torch.equal(with_residual(x)[0], x)  # the residual path carries x through
        assert torch.equal(no_residual(x)[0], torch.zeros_like(x))  # without it nothing gets through


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


@pytest.mark.parametrize("variant", VARIANTS, ids=ids)
def test_no_variant_looks_ahead(variant, never_looks_ahead):
    torch.manual_seed(3)
    never_looks_ahead(AblationBlock(E, H, **variant).eval(), E)


def test_bad_switches_name_themselves():
    with pytest.raises(ValueError, match="`norm`"):
        AblationBlock(E, H, norm="middle")
    with pytest.raises(TypeError, match="`residual`"):
        AblationBlock(E, H, residual=1)


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
