"""Tests for attnbook.train: the one training loop, the loss, a short run lowers it, determinism,
evaluation."""

from __future__ import annotations

import pytest
import torch

from attnbook.tasks.reversal import EOS, PAD, ReversalTask
from attnbook.models.builder import build_model
from attnbook.train import Evaluation, evaluate, predict, sequence_loss, train, train_steps

SMALL = ReversalTask(min_len=2, max_len=5)


def test_sequence_loss_ignores_padding():
    logits = torch.randn(2, 3, 13)
    target = torch.tensor([[4, EOS, PAD], [5, 6, EOS]])
    expected = torch.nn.functional.cross_entropy(
        torch.cat([logits[0, :2], logits[1]]), torch.cat([target[0, :2], target[1]])
    )
    torch.testing.assert_close(sequence_loss(logits, target), expected)


def test_sequence_loss_without_padding_is_the_plain_mean_cross_entropy():
    """The dates targets hold no PAD: there the loss is, bit for bit, the mean over every position."""
    logits = torch.randn(4, 11, 20)
    target = torch.randint(3, 20, (4, 11))
    plain = torch.nn.functional.cross_entropy(logits.reshape(-1, 20), target.reshape(-1))
    assert torch.equal(sequence_loss(logits, target), plain)


def _manual_loop(model, optimizer, schedule, batches, clip):
    """The loop train_steps must be, written out: zero_grad, backward, clip, step, schedule."""
    losses = []
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    return losses


def test_train_steps_is_the_written_out_loop():
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 3, generator=generator), 10 * torch.randn(8, 2, generator=generator))
               for _ in range(6)]
    runs = []
    for use_train_steps in (True, False):
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
        if use_train_steps:
            it = iter(batches)

            def batch_loss():
                x, y = next(it)
                return torch.nn.functional.mse_loss(model(x), y)

            losses = train_steps(model, optimizer, len(batches), batch_loss, schedule, clip=0.5)
            assert not model.training  # left in eval mode
        else:
            losses = _manual_loop(model, optimizer, schedule, batches, clip=0.5)
        runs.append((losses, model.weight.detach().clone(), optimizer.param_groups[0]["lr"]))
    assert runs[0][0] == runs[1][0]
    assert torch.equal(runs[0][1], runs[1][1])
    assert runs[0][2] == runs[1][2] == pytest.approx(0.1 / 7)  # the schedule stepped once per step
    # one SGD step moves the parameters by lr times the gradient, whose norm the loop clips to `clip`
    for clip in (0.5, 1e6):
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        start = torch.cat([p.detach().flatten() for p in model.parameters()])
        x, y = batches[0]
        train_steps(model, torch.optim.SGD(model.parameters(), lr=0.1), 1,
                    lambda: torch.nn.functional.mse_loss(model(x), y), clip=clip)
        moved = (torch.cat([p.detach().flatten() for p in model.parameters()]) - start).norm()
        if clip == 0.5:
            torch.testing.assert_close(moved, torch.tensor(0.1 * 0.5))
        else:
            assert moved > 10 * 0.1 * 0.5  # unclipped, the gradient is far longer


@pytest.mark.parametrize("score", ["none", "dot"])
def test_short_training_run_lowers_the_loss(score):
    torch.manual_seed(0)
    model = build_model(score, hidden_dim=32)
    result = train(model, task=SMALL, steps=60, batch_size=32, seed=0, progress=False)
    assert len(result.losses) == 60
    first, last = sum(result.losses[:5]) / 5, sum(result.losses[-5:]) / 5
    assert last < 0.75 * first, (first, last)
    assert not model.training  # left in eval mode


def test_training_is_deterministic_given_seed(differs):
    runs = []
    for _ in range(2):
        torch.manual_seed(3)
        model = build_model("bilinear", hidden_dim=8)
        result = train(model, task=SMALL, steps=5, batch_size=8, seed=11, progress=False)
        runs.append((result.losses, model.state_dict()))
    assert runs[0][0] == runs[1][0]
    for key, value in runs[0][1].items():
        assert torch.equal(value, runs[1][1][key]), key
    torch.manual_seed(3)
    other = build_model("bilinear", hidden_dim=8)
    differs(train(other, task=SMALL, steps=5, batch_size=8, seed=12, progress=False).losses, runs[0][0], at_least=1e-2)


class _Oracle(torch.nn.Module):
    """Answers with the reversed source, except that it gets every source of length 3 wrong in
    its first token; used to check evaluate() against hand-counted accuracies."""

    def greedy_decode(self, src, src_lengths, max_len=None):
        out = torch.zeros(src.shape[0], src.shape[1] + 1, dtype=torch.long)
        for b, n in enumerate(src_lengths.tolist()):
            answer = src[b, :n].flip(0)
            if n == 3:
                answer[0] = 3 if answer[0] != 3 else 4
            out[b, :n] = answer
            out[b, n] = EOS
        return out, None


def test_evaluate_counts_exact_and_token_accuracy():
    sources, targets = ReversalTask(min_len=2, max_len=4).test_set(3, seed=0)
    evaluation = evaluate(_Oracle(), sources, targets, batch_size=4)
    assert evaluation.lengths == [2, 3, 4]
    assert evaluation.count == [3, 3, 3]
    assert evaluation.exact == [1.0, 0.0, 1.0]
    assert evaluation.token == pytest.approx([1.0, 3 / 4, 1.0])  # 3 of 4 tokens (EOS included)
    assert evaluation.bucketed([(2, 3), (4, 4)]) == {"2-3": 0.5, "4-4": 1.0}
    assert evaluation.at(3, "token") == pytest.approx(0.75)
    assert Evaluation.from_dict(evaluation.to_dict()) == evaluation
    outputs, weights = predict(_Oracle(), sources[:2])
    assert outputs[0] == [*targets[0], EOS] and weights == [None, None]


def test_output_without_eos_is_not_exact():
    class NoEos(_Oracle):
        def greedy_decode(self, src, src_lengths, max_len=None):
            out, _ = super().greedy_decode(src, src_lengths)
            return out.masked_fill(out == EOS, 5), None

    sources, targets = ReversalTask(min_len=2, max_len=2).test_set(2, seed=0)
    assert evaluate(NoEos(), sources, targets).exact == [0.0]


def test_bad_inputs_raise_clear_errors(raises_naming):
    model = build_model("none", hidden_dim=4)
    with raises_naming(ValueError, "`steps`", "0"):
        train(model, steps=0, progress=False)
    with raises_naming(ValueError, "`lr`", "-1"):
        train(model, steps=1, lr=-1, progress=False)
    with raises_naming(TypeError, "`task`", "str"):
        train(model, task="reverse", steps=1, progress=False)
    with raises_naming(TypeError, "`model`", "str"):
        train("model", steps=1)
    with raises_naming(ValueError, "`sources`", "`targets`"):
        evaluate(model, [[3]], [])
    with raises_naming(ValueError, "`logits`", "`tgt_out`"):
        sequence_loss(torch.randn(2, 3, 13), torch.zeros(2, 4, dtype=torch.long))
    evaluation = Evaluation([2, 3], [1.0, 0.5], [1.0, 0.8], [1, 1])
    with raises_naming(ValueError, "`metric`", "'bleu'"):
        evaluation.bucketed(metric="bleu")
    with raises_naming(ValueError, "`length`", "7"):
        evaluation.at(7)


def test_accuracy_by_position():
    from attnbook.train import accuracy_by_position

    targets = [[3, 4, 5], [6, 7]]
    outputs = [[3, 9, 5, EOS], [6, EOS]]
    assert accuracy_by_position(targets, outputs) == [1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="`targets`"):
        accuracy_by_position(targets, outputs[:1])
