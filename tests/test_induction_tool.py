"""The shipped induction-head runs: the checkpoint loads and is what the results describe."""

from __future__ import annotations

import torch

from attnbook_tools.induction import (CONFIG, TRAINING, build_model, knockout_losses, load_model, load_results,
                                      measure_heads)
from attnbook_tools.induction import test_batch as fixed_batch


def test_shipped_checkpoint_is_the_measured_model():
    model, config = load_model(0)
    assert config["seed"] == 0 and not model.training
    assert {k: config[k] for k in CONFIG} == CONFIG and config["lr"] == TRAINING["lr"]
    recorded = load_results()["runs"]["seed0"]
    batch = fixed_batch()
    scores = measure_heads(model, batch)
    for kind in ("previous_token", "induction"):
        torch.testing.assert_close(torch.tensor(scores[kind]), torch.tensor(recorded["heads"][kind]),
                                   atol=1e-5, rtol=0)
    knocked = knockout_losses(model, batch)
    assert abs(knocked["loss"] - recorded["loss"]) < 1e-4


def test_results_cover_several_seeds_with_full_curves():
    results = load_results()
    assert len(results["runs"]) >= 3
    for run in results["runs"].values():
        assert len(run["loss_every_10"]) == results["setup"]["steps"] // 10
        assert len(run["knocked_loss"]) == CONFIG["num_layers"]


def test_build_model_is_seeded():
    a, b = build_model(1), build_model(1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
