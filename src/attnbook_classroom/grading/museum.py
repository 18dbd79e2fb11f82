"""The classic attention bugs as the grader's first test cases: the bugs of the book's source
material and of chapter 7's museum, each written as a student would write it, for every exercise
where it can occur, with the message the grader names it by.

:data:`MUSEUM` holds one :class:`Exhibit` per (bug, exercise, part): ``make()`` returns the wrong
answer (a function, a module class or an answer dict, as the exercise takes), and ``message`` is the
text the grader's feedback contains for it (the constant the grader itself uses). The tests submit
every exhibit with :func:`.check` and assert that ``message`` is in the feedback, so
:func:`misconceptions_by_exercise` and :func:`misconceptions_table` (for the instructors' page)
list what the grader names, not what it was meant to name;
``python -m attnbook_classroom.grading.museum`` prints the table.

Shapes follow the exercises' contracts (see ``describe(exercise_id)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

from attnbook_classroom.grading import ch02_attention_in_seq2seq as ch02
from attnbook_classroom.grading import ch07_masking as ch07
from attnbook_classroom.grading import ch08_multi_head_attention as ch08
from attnbook_classroom.grading import ch10_rotary_positions as ch10
from attnbook_classroom.grading import ch11_grouped_query_and_sliding_window as ch11
from attnbook_classroom.grading.compare import M_FP16_OVERFLOW, M_NAN_ROWS
from attnbook_classroom.grading.mistakes import M_AFTER, M_FP16_FILL, M_NO_SCALE, M_POLARITY, M_WEAK_FILL

__all__ = ["BUGS", "Exhibit", "MUSEUM", "misconceptions_by_exercise", "misconceptions_table"]

# The classic bugs: key -> what the bug is, and where it comes from.
BUGS = {
    "after_softmax": ("the mask applied after the softmax, without renormalising",
                      "source 000; chapter 7, exhibit 1"),
    "inverted": ("the mask inverted (True read as 'blocked')", "chapter 7, exhibit 4"),
    "fp16_fill": ("a finite fill (-1e9) under float16", "source 001; chapter 7, exhibit 2"),
    "nan_rows": ("-inf on a row with nothing to attend to (NaN)", "source 002; chapter 7, exhibit 3"),
    "weak_fill": ("a fill value too weak for the scores (-1e4)", "source 004"),
    "diagonal": ("the causal mask off by one (the diagonal hidden)", "source 000; chapter 7, exhibit 5"),
    "min_fill_twice": ("two masks both filled with finfo.min", "chapter 7, exhibit 6"),
    "top_left": ("the top-left triangle with a cache (L < S)", "chapter 7"),
    "no_scale": ("the missing 1/√D", "source 003"),
    "split_no_transpose": ("heads split without the transpose", "chapter 8"),
    "rotary_layout": ("rotary pairs in the other layout", "chapter 10"),
    "kv_order": ("key/value heads repeated in the wrong order", "chapter 11"),
    "window_off_by_one": ("a window off by one", "chapter 11"),
}


@dataclass(frozen=True)
class Exhibit:
    """One classic bug in one part of one exercise: the wrong answer and the grader's message."""

    bug: str
    exercise_id: str
    part: str
    make: Callable[[], Any]
    message: str


NEG_INF = float("-inf")


def _scores(q: Tensor, k: Tensor, scale: bool = True) -> Tensor:
    """q (..., L, D), k (..., S, D) -> (..., L, S), divided by √D unless ``scale`` is False."""
    s = q @ k.transpose(-2, -1)
    return s / math.sqrt(q.shape[-1]) if scale else s


def _safe_softmax(scores: Tensor, allowed: Tensor) -> Tensor:
    """The right masked softmax (the wrong answers below differ from it in one place only)."""
    allowed = allowed.expand(scores.shape)
    w = torch.softmax(scores.masked_fill(~allowed, torch.finfo(scores.dtype).min), dim=-1)
    return w.masked_fill(~allowed, 0.0)


# ------------------------------------------------------------------------------------------------
# Wrong answers, one switch per bug
# ------------------------------------------------------------------------------------------------

def masked_softmax_with(bug: str):
    def fn(scores, mask):
        if bug == "after_softmax":
            return torch.softmax(scores, dim=-1) * mask
        if bug == "inverted":
            return _safe_softmax(scores, ~mask)
        if bug == "fp16_fill":  # exhibit 2 as written: masked_fill refuses -1e9 in float16
            return torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1)
        if bug == "fp16_fill_where":  # torch.where accepts it, and float16 rounds it to -inf
            return torch.softmax(torch.where(mask, scores, -1e9), dim=-1)
        if bug == "nan_rows":
            return torch.softmax(scores.masked_fill(~mask, NEG_INF), dim=-1)
        if bug == "weak_fill":
            return torch.softmax(scores.masked_fill(~mask, -1e4), dim=-1).masked_fill(~mask, 0.0)
        raise ValueError(bug)
    return fn


def masked_attention_with(bug: str):
    def fn(q, k, v, mask, additive):
        scores = _scores(q, k, scale=bug != "no_scale") + additive  # (B, L, S)
        if bug == "after_softmax":
            return torch.softmax(scores, dim=-1) * mask @ v
        if bug == "min_fill_twice":  # exhibit 6: finfo.min on the blocked scores, then the additive mask
            raw = _scores(q, k)
            return torch.softmax(raw.masked_fill(~mask, torch.finfo(q.dtype).min) + additive, dim=-1) @ v
        if bug == "nan_rows":
            return torch.softmax(scores.masked_fill(~mask, NEG_INF), dim=-1) @ v
        allowed = ~mask if bug == "inverted" else mask
        return _safe_softmax(torch.where(allowed, scores, NEG_INF), allowed) @ v
    return fn


def sdpa_with(bug: str):
    def fn(q, k, v):
        return torch.softmax(_scores(q, k, scale=bug != "no_scale"), dim=-1) @ v
    return fn


def self_attention_with(bug: str):
    def fn(x, W_q, W_k, W_v, mask=None):
        q, k, v = x @ W_q.T, x @ W_k.T, x @ W_v.T
        scores = _scores(q, k, scale=bug != "no_scale")  # (B, L, L)
        if mask is None:
            return torch.softmax(scores, dim=-1) @ v
        if bug == "after_softmax":
            return torch.softmax(scores, dim=-1) * mask @ v
        return _safe_softmax(scores, ~mask if bug == "inverted" else mask) @ v
    return fn


def split_heads_without_transpose(x, num_heads):
    B, L, E = x.shape
    return x.reshape(B, num_heads, L, E // num_heads)


def multi_head_with(bug: str):
    def fn(query, key, value, W_q, W_k, W_v, W_o, num_heads, mask=None):
        B, L, E = query.shape
        D = E // num_heads

        def split(t):  # (B, n, E) -> (B, H, n, D)
            if bug == "split_no_transpose":
                return t.reshape(B, num_heads, t.shape[1], D)
            return t.reshape(B, t.shape[1], num_heads, D).transpose(1, 2)
        q, k, v = split(query @ W_q.T), split(key @ W_k.T), split(value @ W_v.T)
        scores = _scores(q, k, scale=bug != "no_scale")  # (B, H, L, S)
        if mask is None:
            w = torch.softmax(scores, dim=-1)
        elif bug == "after_softmax":
            w = torch.softmax(scores, dim=-1) * mask[:, None]
        elif bug == "nan_rows":
            w = torch.softmax(scores.masked_fill(~mask[:, None], NEG_INF), dim=-1)
        else:
            w = _safe_softmax(scores, (~mask if bug == "inverted" else mask)[:, None])
        out = w @ v  # (B, H, L, D)
        out = out.reshape(B, L, E) if bug == "split_no_transpose" else out.transpose(1, 2).reshape(B, L, E)
        return out @ W_o.T
    return fn


def seq2seq_step_with(bug: str):
    def fn(decoder_state, encoder_states, key_mask):
        scores = (encoder_states @ decoder_state[:, :, None])[..., 0]  # (B, S)
        if bug == "after_softmax":
            weights = torch.softmax(scores, dim=-1) * key_mask
        elif bug == "nan_rows":
            weights = torch.softmax(scores.masked_fill(~key_mask, NEG_INF), dim=-1)
        else:
            weights = _safe_softmax(scores, ~key_mask if bug == "inverted" else key_mask)
        return (weights[:, :, None] * encoder_states).sum(1), weights
    return fn


def gqa_with(bug: str):
    def fn(q, k, v, mask=None):
        groups = q.shape[1] // k.shape[1]
        if bug == "kv_order":  # 0, 1, 0, 1, ...
            k, v = k.repeat(1, groups, 1, 1), v.repeat(1, groups, 1, 1)
        else:  # 0, 0, 1, 1, ...
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = _scores(q, k, scale=bug != "no_scale")
        if mask is None:
            return torch.softmax(scores, dim=-1) @ v
        if bug == "after_softmax":
            return torch.softmax(scores, dim=-1) * mask @ v
        return _safe_softmax(scores, ~mask if bug == "inverted" else mask) @ v
    return fn


def causal_mask_with(bug: str):
    def fn(L, S):
        ones = torch.ones(L, S, dtype=torch.bool)
        if bug == "inverted":
            return ~ones.tril(S - L)
        if bug == "top_left":
            return ones.tril()
        if bug == "diagonal":
            return ones.tril(S - L - 1)
        raise ValueError(bug)
    return fn


def padding_mask_inverted(lengths, S):
    return torch.arange(S)[None, :] >= lengths[:, None]


def window_mask_with(bug: str):
    def fn(L, S, W):
        i = torch.arange(L)[:, None] + (0 if bug == "top_left" else S - L)  # (L, 1): each query's position
        j = torch.arange(S)[None, :]  # (1, S)
        first = {"too_wide": i - W, "too_narrow": i - W + 2}.get(bug, i - W + 1)  # the first key in the window
        allowed = (j <= i) & (j >= first)
        return ~allowed if bug == "inverted" else allowed
    return fn


def rotary_interleaved(x, positions, base=10000.0):
    """apply_rotary with the pairs (2n, 2n + 1), the layout the exercise does not ask for."""
    D = x.shape[-1]
    n = torch.arange(D // 2, dtype=torch.float64)
    angles = positions.double()[:, None] * base ** (-2 * n / D)  # (L, D/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


def rotary_score_interleaved(q, k, offset, base=10000.0):
    D = q.shape[-1]
    angle = offset * base ** (-2 * torch.arange(D // 2, dtype=torch.float64) / D)
    a, b, c, d = q[0::2], q[1::2], k[0::2], k[1::2]
    return float(((a * c + b * d) * angle.cos() + (a * d - b * c) * angle.sin()).sum())


def scaled_dot_scores_unscaled(q, k):
    return q @ k.transpose(-2, -1)


def _after_softmax_unrenormalised(seed: int = 5) -> dict:
    """Exercise 7.5 measured with exhibit 1's weights as they are (not renormalised)."""
    scores = torch.randn(64, 16, 16, generator=torch.Generator().manual_seed(seed))  # (B, L, S)
    allowed = torch.ones(16, 16, dtype=torch.bool).tril()  # (L, S)
    full = torch.softmax(scores, dim=-1)
    right = _safe_softmax(scores, allowed)
    return {"seed": seed, "lost": (full * ~allowed).sum(-1).mean().item(),
            "renormalised": (full * allowed - right).abs().max().item()}


def _window_cache_w_plus_one() -> dict:
    per = 2 * 32 * 1 * 128 * 2  # keys and values, layers, batch, width, bytes: per head and position
    return {"full": per * 32 * 16384, "grouped": per * 8 * 16384, "window": per * 8 * 4097}


# ------------------------------------------------------------------------------------------------
# The exhibits
# ------------------------------------------------------------------------------------------------

def _e(bug, exercise_id, part, make, message):
    return Exhibit(bug, exercise_id, part, make, message)


MUSEUM: list[Exhibit] = [
    # the mask after the softmax, without renormalising
    _e("after_softmax", "masked_softmax", "values", lambda: masked_softmax_with("after_softmax"), M_AFTER),
    _e("after_softmax", "masked_attention", "values", lambda: masked_attention_with("after_softmax"), M_AFTER),
    _e("after_softmax", "self_attention", "mask", lambda: self_attention_with("after_softmax"), M_AFTER),
    _e("after_softmax", "multi_head_forward", "mask", lambda: multi_head_with("after_softmax"), M_AFTER),
    _e("after_softmax", "grouped_query_attention", "mask", lambda: gqa_with("after_softmax"), M_AFTER),
    _e("after_softmax", "seq2seq_attention_step", "padding", lambda: seq2seq_step_with("after_softmax"), M_AFTER),
    _e("after_softmax", "mask_after_softmax", "renormalised", _after_softmax_unrenormalised,
       ch07.M_NOT_RENORMALISED),
    # the mask inverted
    _e("inverted", "masked_softmax", "values", lambda: masked_softmax_with("inverted"), M_POLARITY),
    _e("inverted", "masked_attention", "values", lambda: masked_attention_with("inverted"), M_POLARITY),
    _e("inverted", "self_attention", "mask", lambda: self_attention_with("inverted"), M_POLARITY),
    _e("inverted", "multi_head_forward", "mask", lambda: multi_head_with("inverted"), M_POLARITY),
    _e("inverted", "grouped_query_attention", "mask", lambda: gqa_with("inverted"), ch11.M_POLARITY),
    _e("inverted", "seq2seq_attention_step", "padding", lambda: seq2seq_step_with("inverted"), M_POLARITY),
    _e("inverted", "padding_mask", "values", lambda: padding_mask_inverted, ch02.M_PADDING_POLARITY),
    _e("inverted", "causal_mask", "square", lambda: causal_mask_with("inverted"), ch07.M_CM_POLARITY),
    _e("inverted", "sliding_window_mask", "square", lambda: window_mask_with("inverted"), ch11.M_W_POLARITY),
    # a finite fill under float16
    _e("fp16_fill", "masked_softmax", "fp16", lambda: masked_softmax_with("fp16_fill"), M_FP16_OVERFLOW),
    _e("fp16_fill", "masked_softmax", "fp16", lambda: masked_softmax_with("fp16_fill_where"), M_FP16_FILL),
    # -inf on a row with nothing to attend to
    _e("nan_rows", "masked_softmax", "fully_masked", lambda: masked_softmax_with("nan_rows"), M_NAN_ROWS),
    _e("nan_rows", "masked_attention", "empty_row", lambda: masked_attention_with("nan_rows"), ch07.M_EMPTY_NAN),
    _e("nan_rows", "multi_head_forward", "mask", lambda: multi_head_with("nan_rows"), M_NAN_ROWS),
    _e("nan_rows", "seq2seq_attention_step", "empty_source", lambda: seq2seq_step_with("nan_rows"),
       M_NAN_ROWS.replace("Such a query", "A source with no real token")),
    # a fill value too weak for the scores
    _e("weak_fill", "masked_softmax", "large_scores", lambda: masked_softmax_with("weak_fill"), M_WEAK_FILL),
    # the causal mask off by one
    _e("diagonal", "causal_mask", "square", lambda: causal_mask_with("diagonal"), ch07.M_DIAG),
    # two masks both filled with finfo.min
    _e("min_fill_twice", "masked_attention", "blocked", lambda: masked_attention_with("min_fill_twice"),
       ch07.M_MIN_FILL),
    # the top-left triangle with a cache
    _e("top_left", "causal_mask", "more_keys", lambda: causal_mask_with("top_left"), ch07.M_TOPLEFT),
    _e("top_left", "causal_mask", "one_query", lambda: causal_mask_with("top_left"), ch07.M_TOPLEFT),
    _e("top_left", "sliding_window_mask", "cache", lambda: window_mask_with("top_left"), ch11.M_TOP_LEFT),
    # the missing 1/√D
    _e("no_scale", "scaled_dot_product_attention", "no_mask", lambda: sdpa_with("no_scale"), M_NO_SCALE),
    _e("no_scale", "scaled_dot_scores", "values", lambda: scaled_dot_scores_unscaled, M_NO_SCALE),
    _e("no_scale", "self_attention", "values", lambda: self_attention_with("no_scale"), M_NO_SCALE),
    _e("no_scale", "masked_attention", "values", lambda: masked_attention_with("no_scale"), M_NO_SCALE),
    _e("no_scale", "multi_head_forward", "values", lambda: multi_head_with("no_scale"), ch08.M_NO_SCALE_HEADS),
    _e("no_scale", "grouped_query_attention", "multi_query", lambda: gqa_with("no_scale"), ch11.M_SCALE),
    # heads split without the transpose
    _e("split_no_transpose", "split_heads", "values", lambda: split_heads_without_transpose, ch08.M_SPLIT_NO_T),
    _e("split_no_transpose", "multi_head_forward", "values", lambda: multi_head_with("split_no_transpose"),
       ch08.M_SPLIT_NO_T),
    # rotary pairs in the other layout
    _e("rotary_layout", "apply_rotary", "pairs", lambda: rotary_interleaved, ch10.M_ADJACENT),
    _e("rotary_layout", "rotary_score", "many_pairs", lambda: rotary_score_interleaved, ch10.M_ADJACENT),
    # key/value heads repeated in the wrong order
    _e("kv_order", "grouped_query_attention", "groups", lambda: gqa_with("kv_order"), ch11.M_ORDER),
    _e("kv_order", "grouped_query_attention", "mask", lambda: gqa_with("kv_order"), ch11.M_ORDER),
    # a window off by one
    _e("window_off_by_one", "sliding_window_mask", "square", lambda: window_mask_with("too_wide"),
       ch11.M_PLUS_ONE),
    _e("window_off_by_one", "sliding_window_mask", "cache", lambda: window_mask_with("too_narrow"),
       ch11.M_MINUS_ONE),
    _e("window_off_by_one", "window_cache_bytes", "window", _window_cache_w_plus_one, ch11.M_CACHE_PLUS_ONE),
]


def misconceptions_by_exercise() -> dict[str, list[tuple[str, str, str]]]:
    """Per exercise (in the book's order), the classic bugs its grader names: (bug, part, message)."""
    from attnbook_classroom.grading.harness import exercise_ids

    found: dict[str, list[tuple[str, str, str]]] = {}
    for exhibit in MUSEUM:
        found.setdefault(exhibit.exercise_id, []).append((exhibit.bug, exhibit.part, exhibit.message))
    order = {name: i for i, name in enumerate(exercise_ids())}
    return dict(sorted(found.items(), key=lambda item: order[item[0]]))


def misconceptions_table() -> str:
    """A Markdown table: per exercise, each classic bug its grader names, the part, and the message."""
    rows = ["| exercise | bug | part | what the student reads |", "|---|---|---|---|"]
    for exercise_id, named in misconceptions_by_exercise().items():
        for bug, part, message in named:
            text = message.replace("|", "\\|")
            rows.append(f"| `{exercise_id}` | {BUGS[bug][0]} | `{part}` | {text} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(misconceptions_table(), end="")
