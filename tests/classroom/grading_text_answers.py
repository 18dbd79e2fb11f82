"""Right and wrong answers to chapter 16's exercises, for tests/classroom/test_grading.py and
tests/classroom/test_grading_text.py, written here without the graded functions."""

from __future__ import annotations

import functools

import torch


def good_bracket_score(weights, windows, *, which=-1, closer=True, reduce=0, denominator=None, by_kind=False,
                       closer_on_itself=False):
    """Exercise 16.1; ``which`` 0 takes the outermost open bracket, ``closer`` False leaves the
    closing bracket out of the queries, ``reduce`` another average, ``denominator`` another count,
    ``by_kind`` matches a closing bracket only with its own kind, ``closer_on_itself`` scores a closing
    bracket on its own position."""
    rows, queries, keys = [], [], []
    for b, window in enumerate(windows.tolist()):
        stack = []
        for t, byte in enumerate(window):
            closes = byte in b")]}" and bool(stack)
            if closes and by_kind:
                closes = window[stack[-1]] == {ord(")"): ord("("), ord("]"): ord("["), ord("}"): ord("{")}[byte]
            if closes and not closer:
                stack.pop()
                continue
            if stack:
                rows.append(b), queries.append(t), keys.append(t if closes and closer_on_itself else stack[which])
            if byte in b"([{":
                stack.append(t)
            elif closes:
                stack.pop()
    on = weights.permute(0, 2, 3, 1)[rows, queries, keys]  # (K, H)
    if denominator is not None:
        return on.sum(dim=0) / denominator(*windows.shape)
    return on.mean(dim=reduce)


def bracket_pushed_first(weights, windows):
    """Exercise 16.1 with the opening bracket pushed before its query is recorded."""
    rows, queries, keys = [], [], []
    for b, window in enumerate(windows.tolist()):
        stack = []
        for t, byte in enumerate(window):
            if byte in b"([{":
                stack.append(t)
            if stack:
                rows.append(b), queries.append(t), keys.append(stack[-1])
            if byte in b")]}" and stack:
                stack.pop()
    return weights.permute(0, 2, 3, 1)[rows, queries, keys].mean(dim=0)


def knock_bracket_answer(seed=5, head="open bracket", helped="closing", text="seeded", swap=False):
    """Exercise 16.2 measured here; ``head`` the role whose head is knocked out (or a (layer, head)),
    ``helped`` which predictions are averaged ("closing", "all", "others"), ``text`` "seeded" or
    "validation"."""
    before, after = _knock_losses(seed, head, helped, text)
    if swap:
        before, after = after, before
    return {"seed": seed, "closing_before": before, "closing_after": after}


@functools.lru_cache(maxsize=16)
def _knock_losses(seed, head, helped, text):
    from attnbook.tasks.text import text_batch, validation_windows
    from attnbook_tools.text_heads import helped_tokens, load_results, token_losses
    from attnbook_tools.text_study import load_text_model, text_parts

    model = load_text_model(0)
    found = load_results()["runs"]["seed0"]["found"]
    knocked = head if isinstance(head, tuple) else (found[head]["layer"], found[head]["head"])
    held = text_parts()[1]
    windows = (validation_windows(held, 128) if text == "validation" else
               text_batch(held, 64, 128, generator=torch.Generator().manual_seed(seed)))
    mask = helped_tokens(windows)["open bracket"]
    mask = {"closing": mask, "all": torch.ones_like(mask), "others": ~mask}[helped]
    before = token_losses(model, windows)[mask].mean().item()
    after = token_losses(model, windows, [knocked])[mask].mean().item()
    return before, after


PREDICTED = {"bracket": 5, "line_start": 5, "closing": "b"}
