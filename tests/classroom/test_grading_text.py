"""Chapter 16's graders: each typical mistake loses its mark and is named."""

from __future__ import annotations

import pytest

from attnbook_classroom.grading import check
from grading_text_answers import (PREDICTED, bracket_pushed_first, good_bracket_score, knock_bracket_answer)


def _on_self(weights, windows):
    """Each scored query's weight on its own position."""
    rows, queries = [], []
    for b, window in enumerate(windows.tolist()):
        depth = 0
        for t, byte in enumerate(window):
            if depth:
                rows.append(b), queries.append(t)
            depth += byte in b"([{"
            depth -= byte in b")]}" and depth > 0
    return weights.permute(0, 2, 3, 1)[rows, queries, queries].mean(dim=0)


class Later(dict):
    """Exercise 16.2's answer, measured when a test asks for it (not when the tests are collected);
    a "seed" given here replaces the measured answer's seed."""

    def answer(self):
        options = {k: v for k, v in self.items() if k != "seed"}
        return {**knock_bracket_answer(**options), **({"seed": self["seed"]} if "seed" in self else {})}


MISTAKES = [
    ("bracket_score", lambda w, x: good_bracket_score(w, x, which=0), "random_windows", "OUTERMOST"),
    ("bracket_score", lambda w, x: good_bracket_score(w, x, which=0), "nested", "OUTERMOST"),
    ("bracket_score", lambda w, x: good_bracket_score(w, x, closer=False), "nested", "left the closing bracket out"),
    ("bracket_score", bracket_pushed_first, "random_windows", "attends to itself"),
    ("bracket_score", lambda w, x: good_bracket_score(w, x, reduce=(0, 1)), "random_windows", "one number per head"),
    ("bracket_score", lambda w, x: good_bracket_score(w, x, reduce=1), "nested", "one number per head"),
    ("bracket_score", lambda w, x: good_bracket_score(w, x, denominator=lambda W, L: W * L), "nested", "W·L"),
    ("bracket_score", lambda w, x: good_bracket_score(w, x, denominator=lambda W, L: W * (L - 1)),
     "random_windows", "W·(L - 1)"),
    ("bracket_score", lambda w, x: w.diagonal(-1, -2, -1).mean(dim=(0, 2)), "nested", "previous-token score"),
    ("bracket_score", _on_self, "random_windows", "own position (the diagonal)"),
    ("bracket_score", lambda w, x: good_bracket_score(w, x, by_kind=True), "random_windows",
     "matched the brackets by kind"),
    ("bracket_score", lambda w, x: good_bracket_score(w, x, closer_on_itself=True), "nested",
     "closing bracket's weight on its own position"),
    ("knock_out_bracket", Later(helped="all"), "closing_before", "EVERY prediction"),
    ("knock_out_bracket", Later(helped="others"), "closing_after", "OTHER predictions"),
    ("knock_out_bracket", Later(head="line start"), "closing_after", "the line start head"),
    ("knock_out_bracket", Later(head="previous token"), "closing_after", "the previous token head"),
    ("knock_out_bracket", Later(head=(1, 0)), "closing_after", "not the open-bracket head"),
    ("knock_out_bracket", Later(head="induction"), "closing_after", "the induction head"),
    ("knock_out_bracket", Later(text="validation"), "closing_after", "whole held-out text"),
    ("knock_out_bracket", Later(text="validation"), "closing_before", "validation_windows"),
    ("knock_out_bracket", Later(swap=True), "closing_before", "swap before and after"),
    ("knock_out_bracket", Later(swap=True), "closing_after", "swap before and after"),
    ("knock_out_bracket", Later(seed="5"), "closing_after", "expected the int"),
    ("bracket_predict", {**PREDICTED, "bracket": 1}, "bracket", "outermost"),
    ("bracket_predict", {**PREDICTED, "bracket": 10}, "bracket", "causal mask"),
    ("bracket_predict", {**PREDICTED, "bracket": 12}, "bracket", "int in 0..11"),
    ("bracket_predict", {**PREDICTED, "line_start": 0}, "line_start", "start of the text"),
    ("bracket_predict", {**PREDICTED, "line_start": 14}, "line_start", "causal mask"),
    ("bracket_predict", {**PREDICTED, "line_start": 11}, "line_start", "open-bracket head"),
    ("bracket_predict", {**PREDICTED, "closing": "A"}, "closing", "innermost open bracket closes first"),
    ("bracket_predict", {**PREDICTED, "closing": "C"}, "closing", "no `(` is open"),
    ("bracket_predict", {**PREDICTED, "closing": "D"}, "closing", "letters"),
]


@pytest.mark.parametrize("exercise_id, fn, part, phrase", MISTAKES,
                         ids=[f"{m[0]}-{m[2]}-{i}" for i, m in enumerate(MISTAKES)])
def test_mistake_loses_marks_and_is_named(exercise_id, fn, part, phrase):
    fn = fn.answer() if isinstance(fn, Later) else fn
    feedback = check(exercise_id, fn, part=part)
    assert not feedback.passed and feedback.score == 0 and feedback.max_score == 1
    assert any(phrase.lower() in m.lower() for m in feedback.messages), str(feedback)


@pytest.mark.parametrize("exercise_id, answer", [("bracket_score", good_bracket_score),
                                                 ("knock_out_bracket", Later()),
                                                 ("bracket_predict", PREDICTED)])
def test_right_answer_passes_at_a_hidden_seed(exercise_id, answer):
    answer = answer.answer() if isinstance(answer, Later) else answer
    feedback = check(exercise_id, answer, seed=3)
    assert feedback.passed, str(feedback)


def test_the_library_score_is_the_reference():
    """The grader's reference agrees with attnbook_tools.text_heads on the shipped model's weights."""
    import torch

    from attnbook.tasks.text import text_batch
    from attnbook_classroom.grading.ch16_real_text import bracket_reference, text_model
    from attnbook_tools.text_heads import bracket_positions, mean_weight_at
    from attnbook_tools.text_study import text_parts

    model, _ = text_model()
    windows = text_batch(text_parts()[1], 4, 128, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, weights = model(windows, need_weights=True)
    for w in weights:
        assert torch.equal(bracket_reference(w, windows), mean_weight_at(w, *bracket_positions(windows)))


def test_every_seed_a_student_might_choose_has_closing_brackets_to_measure():
    """64 held-out windows hold a prediction of a closing bracket for every small seed and a few
    large ones; a seed that held none would get a message asking for another."""
    import torch

    from attnbook.tasks.text import text_batch
    from attnbook_tools.text_heads import helped_tokens
    from attnbook_tools.text_study import text_parts

    held = text_parts()[1]
    for seed in [*range(40), 1234, 2024, 2025, 2026, 12345, 31415, 2**31 - 1]:
        windows = text_batch(held, 64, 128, generator=torch.Generator().manual_seed(seed))
        assert helped_tokens(windows)["open bracket"].any(), seed


def test_a_seed_without_closing_brackets_is_told_to_choose_another(monkeypatch):
    import torch

    from attnbook_classroom.grading import ch16_real_text

    original = ch16_real_text.closing_losses

    def empty(seed, head):
        helped, losses = original(seed, head)
        return torch.zeros_like(helped), losses

    monkeypatch.setattr(ch16_real_text, "closing_losses", empty)
    feedback = check("knock_out_bracket", knock_bracket_answer(), part="closing_before")
    assert not feedback.passed and "choose another seed" in feedback.messages[0], str(feedback)
