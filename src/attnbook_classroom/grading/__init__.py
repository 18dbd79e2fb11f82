"""Autograding for the book's exercises: compare a student's answer with the package, name the mistake.

``check(exercise_id, fn, part=None)`` runs the tests of one exercise (or of one of its parts) against
the student's function ``fn`` and returns a :class:`Feedback`. Every reference answer comes from
the package itself (``attnbook.functional``, ``attnbook.masks``, ``attnbook.scores``, ...), on
seeded random inputs: several shapes, L != S, masks with fully-masked rows, and fp16 where it
matters. When an answer is wrong, the grader runs the typical wrong versions of the reference on
the same inputs; if the student's output matches one of them, the feedback names that mistake.

In an nbgrader test cell::

    check("masked_softmax", my_masked_softmax, part="values").assert_passed()

The package is laid out as

- :mod:`.harness`: :class:`Feedback`, the registry of exercises and parts, :func:`check`;
- :mod:`.compare` and :mod:`.mistakes`: comparison with the reference, and the typical mistakes;
- :mod:`.museum`: the classic bugs (the source material's and chapter 7's museum) written as wrong
  answers for every exercise where they can occur, with the message each gets (the grader's first
  test cases, and the table of what each exercise's grader names);
- :mod:`.wire`: what crosses between the grader and the process that runs the student's code;
- :mod:`.forked`: that process in a notebook (a fork of its kernel);
- :mod:`.sandbox`, :mod:`.runner`, :mod:`.submission`: that process when a class is graded (a
  bubblewrap sandbox per student), and how a submitted notebook becomes its checks;
- :mod:`.views`: what the sandbox can import (the library with the graded functions removed at the
  source, PyTorch without its own attention, a stand-in for this package); :mod:`.helpers`: what
  an exercise notebook may import from here besides ``check``;
- :mod:`.sealed`: answers stored as salted digests;
- one module per chapter (``ch00_attention_at_a_glance``, ...) with that chapter's exercises.

Shapes:
    B batch, H heads, L queries, S keys/values, E model width, D per-head width; see
    :data:`EXERCISES` (or ``describe(exercise_id)``) for each exercise's contract.
"""

from attnbook_classroom.grading.forked import _run_threaded  # noqa: F401  (kept for the fallback's tests)
from attnbook_classroom.grading.harness import (DEFAULT_TIMEOUT, EXERCISES, HIDDEN_SEED, Feedback, check, describe, exercise_ids,
                      get_exercise, parts)

# The chapters' exercises, registered in the book's order.
from attnbook_classroom.grading import ch00_attention_at_a_glance  # noqa: E402,F401
from attnbook_classroom.grading import ch01_seq2seq_bottleneck  # noqa: E402,F401
from attnbook_classroom.grading import ch02_attention_in_seq2seq  # noqa: E402,F401
from attnbook_classroom.grading import ch03_scaled_dot_product  # noqa: E402,F401
from attnbook_classroom.grading import ch04_bilinear_score  # noqa: E402,F401
from attnbook_classroom.grading import ch05_additive_score  # noqa: E402,F401
from attnbook_classroom.grading import ch05b_four_scores  # noqa: E402,F401
from attnbook_classroom.grading import ch06_queries_keys_values  # noqa: E402,F401
from attnbook_classroom.grading import ch07_masking  # noqa: E402,F401
from attnbook_classroom.grading.helpers import causal_mask_choices  # noqa: E402
from attnbook_classroom.grading import ch08_multi_head_attention  # noqa: E402,F401
from attnbook_classroom.grading import ch08b_transformer_block  # noqa: E402,F401
from attnbook_classroom.grading import ch08c_cross_attention  # noqa: E402,F401
from attnbook_classroom.grading import ch09_attention_at_scale  # noqa: E402,F401
from attnbook_classroom.grading import ch10_rotary_positions  # noqa: E402,F401
from attnbook_classroom.grading import ch11_grouped_query_and_sliding_window  # noqa: E402,F401
from attnbook_classroom.grading import ch12_induction_heads  # noqa: E402,F401
from attnbook_classroom.grading import ch13_positions_at_length  # noqa: E402,F401
from attnbook_classroom.grading import ch14_attention_in_2026  # noqa: E402,F401
from attnbook_classroom.grading import ch15_linear_attention  # noqa: E402,F401
from attnbook_classroom.grading import ch16_real_text  # noqa: E402,F401

__all__ = ["Feedback", "check", "describe", "parts", "exercise_ids", "EXERCISES", "causal_mask_choices",
           "DEFAULT_TIMEOUT", "HIDDEN_SEED", "get_exercise"]
