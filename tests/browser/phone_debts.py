"""Figures whose smallest text is known to be under 8 CSS pixels on a phone (or not yet shown to
reach it): tests/browser/test_small_screens.py's debts, per chapter, by glue key or control id.
They work as tests/book/chapter_debts.py's do (chapter_debts.settle): a figure not listed fails, a
listed figure that is fixed fails until its entry is deleted, the rest is an expected failure.
The chapters' owners delete entries as they fix their figures; nobody adds entries.

When listed (2026-11-26), every figure had been stored before the legibility report kept its
smallest text, so the test could only use the desktop guarantee (at least 6.0-7.2 px here). What
is known otherwise: the diagrams drawn by attnbook_tools.diagrams (fig-02-encoder-decoder,
fig-06-qkv, fig-08-qkv, fig-08-split, fig-08b-pre-norm, fig-08b-post-norm,
fig-08c-architecture, fig-09-online-softmax, fig-09-kv-cache) have 8-point labels
(canvas.SMALL_POINTS) in a 608-pixel PNG: 6.25 px on a phone, a real failure. The package's charts at
the book's style (11-point ticks and legends, 624 px wide) give 8.4 px and pass; figures that set a
smaller font in the chapter (fontsize=8 in chapters 3 and 8) likely do not (not measured). Executing a chapter again
stores the measurement and turns its bounds into exact numbers."""

PHONE_FIGURE_DEBTS: dict[str, list[str]] = {}
