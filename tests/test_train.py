"""Tests for attnbook.train: the loss, a short run lowers it, determinism, evaluation."""

from __future__ import annotations

import pytest
import torch

from attnbook.tasks.reversal import EOS, PAD, ReversalTask
from attnbook.models.builder import build_model
from attnbook.train import Evaluation, evaluate, predict, sequence_loss, train

SMALL = ReversalTask(min_len=2, max_len=5)


def test_sequence_loss_ignores_padding():
    logits = torch.randn(2, 3, 13)
    target = torch.tensor([[4, EOS, PAD], [5, 6, EOS]])
    expected = torch.nn.functional.cross_entropy(
        torch.cat([logits[0, :2], logits[1]]), torch.cat([target[0, :2], target[1]])
    )
    torch.testing.assert_close(sequence_loss(logits, target), expected)


@pytest.mark.parametrize("score", ["none", "dot"])
def test_short_training_run_lowers_the_loss(score):
    torch.manual_seed(0)
    model = build_model(score, hidden_dim=32)
    result = train(model, task=SMALL, steps=60, batch_size=32, seed=0, progress=False)
    assert len(result.losses) == 60
    first, last = sum(result.losses[:5]) / 5, sum(result.losses[-5:]) / 5
    assert last < 0.75 * first, (first, last)
    assert not model.training  # left in eval mode


def test_training_is_deterministic_given_seed():
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
    assert train(other, task=SMALL, steps=5, batch_size=8, seed=12, progress=False).losses != runs[0][0]


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
