"""The shipped induction-head runs: the checkpoint loads and is what the results describe."""

from __future__ import annotations

import pytest
import torch

from attnbook.tasks.induction import copy_loss
from attnbook_tools.induction import (CONFIG, TRAINING, build_model, knockout_losses, load_model, load_results,
                                      measure_heads)
from attnbook_tools.induction import test_batch as fixed_batch


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_shipped_checkpoint_is_the_measured_model(seed):
    model, config = load_model(seed)
    assert config["seed"] == seed and not model.training
    assert {k: config[k] for k in CONFIG} == CONFIG and config["lr"] == TRAINING["lr"]
    recorded = load_results()["runs"][f"seed{seed}"]
    batch = fixed_batch()
    scores = measure_heads(model, batch)
    for kind in ("previous_token", "induction"):
        torch.testing.assert_close(torch.tensor(scores[kind]), torch.tensor(recorded["heads"][kind]),
                                   atol=1e-5, rtol=0)
    knocked = knockout_losses(model, batch)
    assert abs(knocked["loss"] - recorded["loss"]) < 1e-4
    torch.testing.assert_close(torch.tensor(knocked["knocked_loss"]), torch.tensor(recorded["knocked_loss"]),
                               atol=1e-4, rtol=0)


def test_results_cover_several_seeds_with_full_curves():
    results = load_results()
    assert len(results["runs"]) >= 3
    for run in results["runs"].values():
        assert len(run["loss_every_10"]) == results["setup"]["steps"] // 10
        assert len(run["knocked_loss"]) == CONFIG["num_layers"]


def test_build_model_is_seeded():
    a, b = build_model(1), build_model(1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_head_outputs_add_up_to_the_layer():
    from attnbook_tools.induction import head_output
    model, _ = load_model(0)
    tokens = fixed_batch(8)[0]
    with torch.no_grad():
        x = model.positions(model.token_embedding(tokens))  # (B, L, E)
        layer = model.layers[0]
        heads = sum(head_output(layer, x, h) for h in range(model.num_heads))
        torch.testing.assert_close(heads + layer.out_proj.bias, layer(x)[0], atol=1e-6, rtol=0)
        # a head's output is what knocking it out takes away: the stream without it, read everywhere
        without = x + layer(x)[0] - head_output(layer, x, 0)  # (B, L, E)
        knocked = model.head(without + model.layers[1](without)[0])
        torch.testing.assert_close(knocked, model(tokens, knock_out={(0, 0)}), atol=1e-5, rtol=0)


def test_composition_removes_the_head_from_one_read_at_a_time():
    from attnbook_tools.induction import attend_reading, composition_losses
    model, _ = load_model(0)
    batch = fixed_batch(200)
    tokens, first, second = batch
    with torch.no_grad():
        x = torch.randn(2, 7, CONFIG["embed_dim"])
        layer = model.layers[1]
        torch.testing.assert_close(attend_reading(layer, x, x, x), layer(x)[0], atol=1e-6, rtol=0)
        # each read reads its own stream: changing the keys' stream changes the output
        assert not torch.allclose(attend_reading(layer, x, x.flip(1), x), layer(x)[0])
    losses = composition_losses(model, batch, head=0)
    whole = copy_loss(model(tokens), tokens, first, second, TRAINING["segment_len"])[0].item()
    assert abs(losses["whole"] - whole) < 1e-5
    # the previous-token head (layer 0, head 0 in seed 0) is read by the keys: removing it there hurts most
    assert losses["keys"] > losses["queries"] > losses["values"] - 0.05
    assert losses["keys"] > whole + 1.0 and abs(losses["values"] - whole) < 0.1
    # removed from every read of layer 1 (but kept on its direct path), it is nearly the whole knock-out
    knocked = copy_loss(model(tokens, knock_out={(0, 0)}), tokens, first, second, TRAINING["segment_len"])[0]
    assert abs(losses["all three"] - knocked.item()) < 0.2
    # replacing the head's output by its mean is another removal: the keys still lose most
    mean = composition_losses(model, batch, head=0, ablation="mean")
    assert mean != losses and abs(mean["whole"] - whole) < 1e-5 and mean["keys"] > whole + 1.0


def test_composition_refuses_bad_arguments():
    from attnbook_tools.induction import composition_losses, head_output
    model, _ = load_model(0)
    with pytest.raises(ValueError, match=r"composition_losses: `head` must be an int in 0..1 \(a head of layer 0\)"):
        composition_losses(model, fixed_batch(4), head=2)
    with pytest.raises(ValueError, match="head_output: `head` must be an int in 0..1; got -1"):
        head_output(model.layers[0], torch.zeros(1, 3, CONFIG["embed_dim"]), -1)
    with pytest.raises(ValueError, match="`ablation` must be 'zero' or 'mean'; got 'half'"):
        composition_losses(model, fixed_batch(4), head=0, ablation="half")
    with pytest.raises(ValueError, match="`model` must have 2 layers"):
        composition_losses(build_model(0, num_layers=3), fixed_batch(4), head=0)
