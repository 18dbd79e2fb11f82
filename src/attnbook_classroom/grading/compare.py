"""Comparing a student's result with the reference, and naming the mistake when they differ.

:func:`compare` reports a wrong type, shape or dtype, then the first typical mistake (a
``(message, thunk)`` pair computing the mistaken result) that the student's output reproduces,
and otherwise the largest difference and where it is. Every check raises :class:`Wrong`, whose
message is what the student reads.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable

import torch
from torch import Tensor

from attnbook_classroom.grading.wire import ErrorInfo, Foreign

__all__ = ["Wrong", "same", "tolerance", "match", "compare", "check_number", "fmt", "exception_message",
           "matmul_hint", "warning_notes", "M_NAN_ROWS", "M_FP16_OVERFLOW"]

M_NAN_ROWS = ("Rows whose keys are all masked come out as NaN: a softmax over a row of -inf is 0/0. "
              "Such a query must get zero weights (and a zero output): find the rows with nothing "
              "to attend to, take the softmax with their scores replaced by 0, then set their weights to 0.")


M_FP16_OVERFLOW = ("A fill value such as -1e9 does not fit in float16 (its largest magnitude is 65504). "
                   "Fill with `torch.finfo(scores.dtype).min`, which fits every dtype.")


class Wrong(Exception):
    """Raised by a part when the answer is wrong; carries the message for the student."""


def fmt(x: float) -> str:
    return f"{x:.4g}"


def tolerance(dtype: torch.dtype) -> dict:
    if dtype in (torch.float16, torch.bfloat16):
        return {"rtol": 1e-2, "atol": 2e-3}
    return {"rtol": 1e-4, "atol": 1e-5}


def same(a: Any, b: Tensor, tol: dict | None = None) -> bool:
    """Same shape and values (NaN equal to NaN), compared in float64; dtype ignored."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor) or tuple(a.shape) != tuple(b.shape):
        return False
    if a.dtype == torch.bool or b.dtype == torch.bool:
        return a.dtype == b.dtype and bool(torch.equal(a, b))
    tol = tol or tolerance(b.dtype)
    try:
        return bool(torch.allclose(a.detach().double(), b.detach().double(), equal_nan=True, **tol))
    except Exception:
        return False


def match(out: Any, variants) -> str | None:
    """The message of the first wrong variant whose output ``out`` reproduces.

    When ``out`` has NaN (often a second mistake on fully-masked rows), a variant that ``out``
    reproduces everywhere else is named too, with a note about the NaN.
    """
    candidates = []
    for message, make in variants:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                candidate = make()
        except Exception:
            continue
        if same(out, candidate):
            return message
        candidates.append((message, candidate))
    if isinstance(out, Tensor) and out.is_floating_point() and torch.isnan(out).any():
        finite = ~torch.isnan(out)
        for message, candidate in candidates:
            if (isinstance(candidate, Tensor) and candidate.shape == out.shape
                    and same(out[finite], candidate[finite])):
                return message + " Besides, " + M_NAN_ROWS[0].lower() + M_NAN_ROWS[1:]
    return None


def _kind(out: Any) -> str:
    if isinstance(out, Foreign):
        return out.kind
    return type(out).__module__.split(".")[0] + "." + type(out).__name__


def compare(out: Any, ref: Tensor, name: str, variants=(), tol: dict | None = None,
            extra: Callable[[Tensor], str | None] | None = None) -> None:
    """Raise Wrong naming the mistake unless ``out`` equals ``ref`` (shape, dtype, values)."""
    if isinstance(out, (tuple, list)) and len(out) and all(isinstance(t, Tensor) for t in out):
        raise Wrong(f"Your function returned a {type(out).__name__} of {len(out)} tensors; it should "
                    f"return only the {name}, one tensor of shape {tuple(ref.shape)}.")
    if not isinstance(out, Tensor):
        kind = _kind(out)
        raise Wrong(f"Your function returned {kind if kind != 'builtins.NoneType' else 'None'}; it "
                    f"should return the {name} as a torch tensor of shape {tuple(ref.shape)}."
                    + (" Did you forget the `return`?" if out is None else ""))
    if tuple(out.shape) != tuple(ref.shape):
        named = match(out, variants)
        raise Wrong(f"Your {name} has shape {tuple(out.shape)}; expected {tuple(ref.shape)}."
                    + (f" {named}" if named else ""))
    if out.dtype != ref.dtype:
        named = match(out, variants)
        if ref.dtype == torch.bool:
            raise Wrong(f"Your {name} has dtype {out.dtype}; it must be a bool tensor (True = may "
                        "attend). Compare with `<` or `<=`, or call `.bool()`."
                        + (f" Besides, {named[0].lower()}{named[1:]}" if named else ""))
        raise Wrong(f"Your {name} has dtype {out.dtype}; expected {ref.dtype}, the dtype of the "
                    "inputs. Do not convert: compute in the inputs' dtype (or convert back before "
                    "returning).")
    if same(out, ref, tol):
        return
    named = match(out, variants)
    if named:
        raise Wrong(named)
    if ref.dtype == torch.bool:
        where = (out != ref).nonzero()[0].tolist()
        raise Wrong(f"Your {name} differs from the expected one at {len((out != ref).nonzero())} "
                    f"places, first at index {tuple(where)} (yours {bool(out[tuple(where)])}, "
                    f"expected {bool(ref[tuple(where)])}).")
    o, r = out.detach().double(), ref.detach().double()
    if torch.isnan(o).any() and not torch.isnan(r).any():
        raise Wrong(f"Your {name} has NaN at {int(torch.isnan(o).sum())} places where the expected "
                    "values are finite.")
    hint = extra(out) if extra else None
    diff = (o - r).abs().nan_to_num(nan=float("inf"))
    idx = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
    raise Wrong(f"Your {name} differs from the reference: the largest difference is "
                f"{fmt(float(diff[idx]))} at index {idx} (yours {fmt(float(o[idx]))}, expected "
                f"{fmt(float(r[idx]))})." + (f" {hint}" if hint else ""))


def check_number(value: Any, ref: float, what: str, variants=(), rel_tol: float = 1e-9,
                 abs_tol: float = 1e-9) -> None:
    """Raise Wrong unless ``value`` is the number ``ref``; name a listed wrong number."""
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        shown = value.text or value.kind if isinstance(value, Foreign) else repr(value)
        raise Wrong(f"Your answer for {what} is {shown:.80}; expected a number.")
    if math.isclose(float(value), float(ref), rel_tol=rel_tol, abs_tol=abs_tol):
        return
    for message, candidate in variants:
        if math.isclose(float(value), float(candidate), rel_tol=rel_tol, abs_tol=abs_tol):
            raise Wrong(f"Your answer for {what} is {value:g}. {message}")
    raise Wrong(f"Your answer for {what} is {value:g}, which is not right.")


# ------------------------------------------------------------------------------------------------
# Exceptions and warnings raised by the student's code
# ------------------------------------------------------------------------------------------------

def _common_hint(err: ErrorInfo) -> str | None:
    text = err.message
    if "without overflow" in text and ("Half" in text or "BFloat16" in text):
        return M_FP16_OVERFLOW
    if "view size is not compatible" in text:
        return ("`.view` needs a contiguous tensor, and a transposed tensor is not: use `.reshape(...)` "
                "or call `.contiguous()` before `.view`.")
    if err.is_a("RecursionError"):
        return "Your function calls itself without end."
    return None


def exception_message(err: ErrorInfo, hints: Callable[[ErrorInfo], str | None] | None) -> str:
    """What the student reads when their code raised ``err``."""
    if err.is_a("NotImplementedError") and not err.message:
        return ("Your function raises NotImplementedError: write your solution in place of "
                "`raise NotImplementedError()`.")
    text = f"Your code raised {err.type}: {err.message.strip()[:300].rstrip('.')}"
    hint = _common_hint(err) or (hints(err) if hints else None)
    return f"{text}. {hint}" if hint else text + "."


def matmul_hint(err: ErrorInfo) -> str | None:
    if any(s in err.message for s in ("cannot be multiplied", "must match the size", "Expected size for first",
                                      "size mismatch", "Expected batch2", "dimension 0")):
        return ("A matrix product got shapes that do not fit: to compare every query with every key, "
                "transpose the LAST TWO axes of the keys, `q @ k.transpose(-2, -1)` (not `k.T` and not "
                "`k.transpose(0, 1)`).")
    return None


def warning_notes(messages: list[str]) -> list[str]:
    """Notes about warnings PyTorch raised in the student's code."""
    notes = []
    for text in messages:
        if "x.T" in text or "`.T`" in text or "dimension other than 2" in text:
            notes.append("PyTorch warned that `.T` on a tensor with more than 2 dims reverses ALL its "
                         "dims; to transpose the keys use `k.transpose(-2, -1)` (or `k.mT`).")
    return notes[:1]
