"""Chapter 15's graders: each typical mistake loses its mark and is named."""

from __future__ import annotations

import pytest

from attnbook_classroom.grading import check
from grading_linear_answers import good_chunked, good_delta_step, recall_answer, unchunked

MISTAKES = [
    ("delta_rule_step", lambda *a: good_delta_step(*a, order="update_before_read"), "one_step",
     "updated the state before reading"),
    ("delta_rule_step", lambda *a: good_delta_step(*a, order="decay_after_write"), "one_step",
     "decay after the write"),
    ("delta_rule_step", lambda *a: good_delta_step(*a, scale=False), "forget_and_overwrite", "1/sqrt(D)"),
    ("chunked_linear_attention", lambda *a: good_chunked(*a, read_after=True), "uneven_chunks",
     "before the chunk read it"),
    ("chunked_linear_attention", lambda *a: good_chunked(*a, causal=False), "uneven_chunks", "causal"),
    ("chunked_linear_attention", lambda *a: good_chunked(*a, scale=False), "one_chunk", "1/sqrt(D)"),
    ("chunked_linear_attention", unchunked, "uneven_chunks", "did not work chunk by chunk"),
    ("recall_capacity", recall_answer(predicted="A"), "predicted", "overlaps"),
    ("recall_capacity", recall_answer(predicted="C"), "predicted", "not to chance"),
    ("recall_capacity", recall_answer(how="outputs"), "measured", "FINAL state"),
]


@pytest.mark.parametrize("exercise_id, fn, part, phrase", MISTAKES,
                         ids=[f"{m[0]}-{m[2]}-{i}" for i, m in enumerate(MISTAKES)])
def test_mistake_loses_marks_and_is_named(exercise_id, fn, part, phrase):
    feedback = check(exercise_id, fn, part=part)
    assert not feedback.passed and feedback.score == 0 and feedback.max_score == 1
    assert any(phrase.lower() in m.lower() for m in feedback.messages), str(feedback)


@pytest.mark.parametrize("exercise_id, answer", [("delta_rule_step", good_delta_step),
                                                 ("chunked_linear_attention", good_chunked),
                                                 ("recall_capacity", recall_answer())])
def test_right_answer_passes_at_a_hidden_seed(exercise_id, answer):
    assert check(exercise_id, answer, seed=3).passed
