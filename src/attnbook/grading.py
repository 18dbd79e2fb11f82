"""Autograding for the book's exercises: compare a student's answer with the package, name the mistake.

``check(exercise_id, fn, part=None)`` runs the tests of one exercise (or of one of its parts) against
the student's function ``fn`` and returns a :class:`Feedback`. Every reference answer comes from
the package itself (``attnbook.functional``, ``attnbook.masks``, ``attnbook.scores``, ...), on
seeded random inputs: several shapes, L != S, masks with fully-masked rows, and fp16 where it
matters. When an answer is wrong, the grader runs the typical wrong versions of the reference on
the same inputs; if the student's output matches one of them, the feedback names that mistake.

The student's code runs in a forked child process (on Linux, Colab included; elsewhere in a
thread), so an exception, a crash or an endless loop cannot break grading: an exception becomes a
message naming it, a function that does not return within ``timeout`` seconds is stopped (on Linux)
and reported as too slow.

In an nbgrader test cell::

    check("masked_softmax", my_masked_softmax, part="fully_masked").assert_passed()

Shapes:
    B batch, H heads, L queries, S keys/values, E model width, D per-head width; see
    :data:`EXERCISES` (or ``describe(exercise_id)``) for each exercise's contract.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import select
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor, nn

from .functional import attention, masked_softmax
from .masks import causal_mask, padding_mask

__all__ = ["Feedback", "check", "describe", "parts", "exercise_ids", "EXERCISES",
           "causal_mask_choices", "DEFAULT_TIMEOUT"]

DEFAULT_TIMEOUT = 5.0  # seconds per part


# --------------------------------------------------------------------------------------------
# Feedback
# --------------------------------------------------------------------------------------------

@dataclass
class Feedback:
    """The result of grading one exercise (or one part of it).

    ``score`` counts the parts passed (one point each), out of ``max_score``. ``messages`` says,
    for every part that failed, what is wrong and what to look at.
    """

    exercise_id: str
    score: float
    max_score: float
    messages: list[str] = field(default_factory=list)
    part: str | None = None

    @property
    def passed(self) -> bool:
        return self.max_score > 0 and self.score >= self.max_score

    def __str__(self) -> str:
        where = self.exercise_id if self.part is None else f"{self.exercise_id} (part {self.part!r})"
        head = f"{where}: {'passed' if self.passed else 'not yet'}, {self.score:g}/{self.max_score:g}"
        return "\n".join([head] + [f"  - {m}" for m in self.messages])

    def _repr_pretty_(self, printer, cycle) -> None:  # how IPython shows it in a notebook
        printer.text(str(self))

    def assert_passed(self) -> "Feedback":
        """Raise ``AssertionError`` carrying the messages unless every part passed; else return self."""
        if not self.passed:
            raise AssertionError(str(self))
        return self


class _Wrong(Exception):
    """Raised inside a part when the answer is wrong; carries the message for the student."""


# --------------------------------------------------------------------------------------------
# Running student code safely
# --------------------------------------------------------------------------------------------

def _run_forked(job: Callable[[], list[str]], timeout: float) -> tuple[str, Any]:
    """Run ``job`` in a forked child; return ("ok", messages), ("timeout", None) or ("crash", text)."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded, fork() may deadlock"
        pid = os.fork()
    if pid == 0:  # the child: never return from here
        code = 0
        try:
            os.close(read_end)
            sys.stdout = io.StringIO()  # the kernel's streams belong to the parent
            sys.stderr = io.StringIO()
            try:
                import faulthandler
                faulthandler.disable()  # a crash is reported by the parent, without a C-level dump
            except Exception:
                pass
            try:
                torch.set_num_threads(1)
            except Exception:
                pass
            try:
                payload = pickle.dumps(("ok", job()))
            except BaseException as exc:  # job() catches student errors; this is a last resort
                payload = pickle.dumps(("crash", f"{type(exc).__name__}: {exc}"))
            view = memoryview(payload)
            while view:
                written = os.write(write_end, view)
                view = view[written:]
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    chunks, deadline, status = [], time.monotonic() + timeout, None
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                status = "timeout"
                break
            ready, _, _ = select.select([read_end], [], [], left)
            if not ready:
                continue
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        if status == "timeout":
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, wait_status = os.waitpid(pid, 0)
    if status == "timeout":
        return "timeout", None
    data = b"".join(chunks)
    if not data:
        if os.WIFSIGNALED(wait_status):
            return "crash", f"the process was killed by signal {os.WTERMSIG(wait_status)}"
        return "crash", f"the process exited with code {os.WEXITSTATUS(wait_status)} before answering"
    try:
        return pickle.loads(data)
    except Exception as exc:  # pragma: no cover - the child only sends a tuple of str
        return "crash", f"unreadable answer from the grading process ({exc})"


def _run_threaded(job: Callable[[], list[str]], timeout: float) -> tuple[str, Any]:
    """Fallback without fork (Windows): a daemon thread; an endless loop keeps running in it."""
    box: dict[str, Any] = {}

    def target():
        try:
            box["result"] = ("ok", job())
        except BaseException as exc:
            box["result"] = ("crash", f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return "timeout", None
    return box["result"]


_WARM = []


def _warm_up() -> None:
    """Import what torch loads lazily (torch._refs takes a second) once, before the first fork."""
    if not _WARM:
        _WARM.append(True)
        torch.broadcast_shapes((1, 2), (2,))
        attention(*(torch.zeros(1, 2, 2, dtype=torch.float16) for _ in range(3)), torch.ones(2, 2).bool())


def _isolated(job: Callable[[], list[str]], timeout: float) -> tuple[str, Any]:
    # fork is safe with torch on Linux (Colab included); macOS frameworks may abort a forked child
    if hasattr(os, "fork") and sys.platform.startswith("linux"):
        _warm_up()
        return _run_forked(job, timeout)
    return _run_threaded(job, timeout)


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

@dataclass
class _Exercise:
    id: str
    contract: str
    parts: dict[str, Callable[[Any, torch.Generator], None]] = field(default_factory=dict)


EXERCISES: dict[str, _Exercise] = {}


def _exercise(exercise_id: str, contract: str) -> _Exercise:
    ex = _Exercise(exercise_id, contract)
    EXERCISES[exercise_id] = ex
    return ex


def _part(ex: _Exercise, name: str):
    def register(func):
        ex.parts[name] = func
        return func
    return register


def exercise_ids() -> list[str]:
    """Every exercise id the grader knows."""
    return list(EXERCISES)


def parts(exercise_id: str) -> list[str]:
    """The names of an exercise's parts, in the order ``check`` runs them."""
    return list(_get(exercise_id).parts)


def describe(exercise_id: str) -> str:
    """The contract of an exercise: what the student's function takes and returns."""
    ex = _get(exercise_id)
    return f"{ex.id}: {ex.contract}\nparts: {', '.join(ex.parts)}"


def _get(exercise_id: str) -> _Exercise:
    if not isinstance(exercise_id, str) or exercise_id not in EXERCISES:
        raise ValueError(
            f"check: unknown `exercise_id` {exercise_id!r}; expected one of {sorted(EXERCISES)}"
        )
    return EXERCISES[exercise_id]


def check(exercise_id: str, fn: Any, part: str | None = None, *, seed: int = 0,
          timeout: float = DEFAULT_TIMEOUT) -> Feedback:
    """Grade ``fn`` on one exercise, or on one part of it.

    Args:
        exercise_id: one of :func:`exercise_ids`, e.g. ``"masked_softmax"``.
        fn: the student's function (or, for a conceptual exercise, the answer).
        part: one of :func:`parts`; None runs every part.
        seed: seeds the random inputs (hidden tests use another seed).
        timeout: seconds allowed for each part before it is stopped and reported as too slow.

    Returns:
        A :class:`Feedback`; one point per part passed.
    """
    ex = _get(exercise_id)
    if part is None:
        names = list(ex.parts)
    elif part in ex.parts:
        names = [part]
    else:
        raise ValueError(f"check: `part` {part!r} is not a part of {exercise_id!r}; "
                         f"expected one of {list(ex.parts)} or None")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"check: `seed` must be an int; got {seed!r}")
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
        raise ValueError(f"check: `timeout` must be a positive number of seconds; got {timeout!r}")
    score, messages = 0, []
    for name in names:
        status, value = _isolated(lambda: _run_part(ex.parts[name], fn, seed), float(timeout))
        label = f"[{name}] " if len(names) > 1 else ""
        if status == "ok" and not value:
            score += 1
        elif status == "ok":
            messages += [label + m for m in value]
        elif status == "timeout":
            messages.append(label + f"Too slow: your code did not finish within {timeout:g} s, so it "
                            "was stopped. Look for a loop that never ends (a `while` whose condition "
                            "never changes) or for work far bigger than the inputs need.")
        else:
            messages.append(label + f"Your code crashed the process that ran it ({value}).")
    return Feedback(exercise_id, score, len(names), messages, part)


def _run_part(func, fn, seed: int) -> list[str]:
    """Run one part (in the child process); return the messages, empty when it passed."""
    gen = torch.Generator().manual_seed(1000 + seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            func(fn, gen)
        except _Wrong as wrong:
            notes = _warning_notes(caught)
            return [str(wrong)] + notes
        except Exception as exc:  # a bug in the inputs the student's code produced, not in `fn`
            return [f"Grading stopped on {type(exc).__name__}: {exc}"]
    return []


def _warning_notes(caught) -> list[str]:
    notes = []
    for w in caught:
        text = str(w.message)
        if "x.T" in text or "`.T`" in text or "dimension other than 2" in text:
            notes.append("PyTorch warned that `.T` on a tensor with more than 2 dims reverses ALL its "
                         "dims; to transpose the keys use `k.transpose(-2, -1)` (or `k.mT`).")
    return notes[:1]


# --------------------------------------------------------------------------------------------
# Helpers used by the parts (they run in the child)
# --------------------------------------------------------------------------------------------

def _randn(gen: torch.Generator, *shape: int, dtype=torch.float32) -> Tensor:
    return torch.randn(*shape, generator=gen).to(dtype)


def _rand_mask(gen: torch.Generator, *shape: int, fully_masked_rows: int = 0) -> Tensor:
    """A bool mask (..., S) with at least one True and one False per row; then some rows all False."""
    mask = torch.rand(*shape, generator=gen) < 0.6
    S = shape[-1]
    flat = mask.reshape(-1, S)  # (rows, S)
    for r in range(flat.shape[0]):
        flat[r, r % S] = True
        flat[r, (r + 1) % S] = False
    for r in range(fully_masked_rows):
        flat[(3 * r + 1) % flat.shape[0]] = False
    return flat.reshape(shape)


def _exception_message(exc: BaseException, hints: Callable[[BaseException], str | None] | None) -> str:
    if isinstance(exc, NotImplementedError) and not str(exc):
        return ("Your function raises NotImplementedError: write your solution in place of "
                "`raise NotImplementedError()`.")
    text = f"Your code raised {type(exc).__name__}: {str(exc).strip()[:300].rstrip('.')}"
    hint = _common_hint(exc) or (hints(exc) if hints else None)
    return f"{text}. {hint}" if hint else text + "."


def _common_hint(exc: BaseException) -> str | None:
    text = str(exc)
    if "without overflow" in text and ("Half" in text or "BFloat16" in text):
        return ("A fill value such as -1e9 does not fit in float16 (its largest magnitude is 65504). "
                "Fill with `torch.finfo(scores.dtype).min`, which fits every dtype.")
    if "view size is not compatible" in text:
        return ("`.view` needs a contiguous tensor, and a transposed tensor is not: use `.reshape(...)` "
                "or call `.contiguous()` before `.view`.")
    if isinstance(exc, RecursionError):
        return "Your function calls itself without end."
    return None


def _call(fn: Any, *args, hints=None, **kwargs) -> Any:
    if not callable(fn):
        raise _Wrong(f"Expected a function, got {type(fn).__name__} {fn!r:.80}.")
    try:
        return fn(*args, **kwargs)
    except _Wrong:
        raise
    except BaseException as exc:  # SystemExit, KeyboardInterrupt and friends too
        raise _Wrong(_exception_message(exc, hints)) from None


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _same(a: Any, b: Tensor, tol: dict | None = None) -> bool:
    """Same shape and values (NaN equal to NaN), compared in float64; dtype ignored."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor) or tuple(a.shape) != tuple(b.shape):
        return False
    if a.dtype == torch.bool or b.dtype == torch.bool:
        return a.dtype == b.dtype and bool(torch.equal(a, b))
    tol = tol or _tolerance(b.dtype)
    try:
        return bool(torch.allclose(a.detach().double(), b.detach().double(), equal_nan=True, **tol))
    except Exception:
        return False


def _tolerance(dtype: torch.dtype) -> dict:
    if dtype in (torch.float16, torch.bfloat16):
        return {"rtol": 1e-2, "atol": 2e-3}
    return {"rtol": 1e-4, "atol": 1e-5}


def _match(out: Any, variants) -> str | None:
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
        if _same(out, candidate):
            return message
        candidates.append((message, candidate))
    if isinstance(out, Tensor) and out.is_floating_point() and torch.isnan(out).any():
        finite = ~torch.isnan(out)
        for message, candidate in candidates:
            if (isinstance(candidate, Tensor) and candidate.shape == out.shape
                    and _same(out[finite], candidate[finite])):
                return message + " Besides, " + M_NAN_ROWS[0].lower() + M_NAN_ROWS[1:]
    return None


def _compare(out: Any, ref: Tensor, name: str, variants=(), tol: dict | None = None,
             extra: Callable[[Tensor], str | None] | None = None) -> None:
    """Raise _Wrong naming the mistake unless ``out`` equals ``ref`` (shape, dtype, values)."""
    if isinstance(out, (tuple, list)) and len(out) and all(isinstance(t, Tensor) for t in out):
        raise _Wrong(f"Your function returned a {type(out).__name__} of {len(out)} tensors; it should "
                     f"return only the {name}, one tensor of shape {tuple(ref.shape)}.")
    if not isinstance(out, Tensor):
        kind = type(out).__module__.split(".")[0] + "." + type(out).__name__
        raise _Wrong(f"Your function returned {kind if kind != 'builtins.NoneType' else 'None'}; it "
                     f"should return the {name} as a torch tensor of shape {tuple(ref.shape)}."
                     + (" Did you forget the `return`?" if out is None else ""))
    if tuple(out.shape) != tuple(ref.shape):
        named = _match(out, variants)
        raise _Wrong(f"Your {name} has shape {tuple(out.shape)}; expected {tuple(ref.shape)}."
                     + (f" {named}" if named else ""))
    if out.dtype != ref.dtype:
        named = _match(out, variants)
        if ref.dtype == torch.bool:
            raise _Wrong(f"Your {name} has dtype {out.dtype}; it must be a bool tensor (True = may "
                         "attend). Compare with `<` or `<=`, or call `.bool()`."
                         + (f" Besides, {named[0].lower()}{named[1:]}" if named else ""))
        raise _Wrong(f"Your {name} has dtype {out.dtype}; expected {ref.dtype}, the dtype of the "
                     "inputs. Do not convert: compute in the inputs' dtype (or convert back before "
                     "returning).")
    if _same(out, ref, tol):
        return
    named = _match(out, variants)
    if named:
        raise _Wrong(named)
    if ref.dtype == torch.bool:
        where = (out != ref).nonzero()[0].tolist()
        raise _Wrong(f"Your {name} differs from the expected one at {len((out != ref).nonzero())} "
                     f"places, first at index {tuple(where)} (yours {bool(out[tuple(where)])}, "
                     f"expected {bool(ref[tuple(where)])}).")
    o, r = out.detach().double(), ref.detach().double()
    if torch.isnan(o).any() and not torch.isnan(r).any():
        raise _Wrong(f"Your {name} has NaN at {int(torch.isnan(o).sum())} places where the expected "
                     "values are finite.")
    hint = extra(out) if extra else None
    diff = (o - r).abs().nan_to_num(nan=float("inf"))
    idx = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
    raise _Wrong(f"Your {name} differs from the reference: the largest difference is "
                 f"{_fmt(float(diff[idx]))} at index {idx} (yours {_fmt(float(o[idx]))}, expected "
                 f"{_fmt(float(r[idx]))})." + (f" {hint}" if hint else ""))


def _check_int(value: Any, ref: int, what: str, variants=()) -> None:
    if isinstance(value, Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Wrong(f"Your answer for {what} is {value!r:.80}; expected a number.")
    if math.isclose(float(value), float(ref), rel_tol=1e-9, abs_tol=1e-9):
        return
    for message, candidate in variants:
        if math.isclose(float(value), float(candidate), rel_tol=1e-9, abs_tol=1e-9):
            raise _Wrong(f"Your answer for {what} is {value:g}. {message}")
    raise _Wrong(f"Your answer for {what} is {value:g}, which is not right.")


# Typical-mistake messages shared by several exercises ---------------------------------------

M_WRONG_DIM = ("The softmax runs over dimension {dim} instead of over the keys: each row of weights "
               "(one query) must sum to 1 over the last dimension, so use `dim=-1`.")
M_POLARITY = ("Your mask polarity is inverted: in this book True means 'may attend', so the scores to "
              "hide are where the mask is False (`~mask`), not where it is True.")
M_AFTER = ("You applied the mask after the softmax: the masked weights are zero but the remaining "
           "weights no longer sum to 1. Fill the masked scores before the softmax.")
M_IGNORED = "Your function ignores the mask: masked keys still get weight."
M_NAN_ROWS = ("Rows whose keys are all masked come out as NaN: a softmax over a row of -inf is 0/0. "
              "Such a query must get zero weights (and a zero output): fill with "
              "`torch.finfo(scores.dtype).min` and set the masked weights to 0 after the softmax.")
M_UNIFORM_ROWS = ("Rows whose keys are all masked get uniform weights 1/S instead of zeros: the fill value "
                  "only makes masked keys small compared with the others, and here there are no others. "
                  "Set the weights of masked keys to 0 after the softmax.")
M_WEAK_FILL = ("Your fill value is not negative enough: here the real scores are below -1e4, so the "
               "masked keys (filled with -1e4 or similar) win the softmax. Fill with "
               "`torch.finfo(scores.dtype).min`.")
M_NO_SCALE = ("The scores are not scaled: divide q·k by √E (the square root of the query/key width), "
              "as in softmax(q kᵀ / √E).")
M_SCALE_D = "You divided the scores by E; divide by √E (`math.sqrt(E)`) instead."
M_FP16_FILL = ("In float16 your fill value overflows to -inf, so fully-masked rows become NaN: fill with "
               "`torch.finfo(scores.dtype).min` and zero the masked weights after the softmax.")


def _softmax_variants(scores: Tensor, mask: Tensor):
    """Wrong versions of a masked softmax over the last dim, as (message, thunk) pairs."""
    fill = torch.finfo(scores.dtype).min
    out = []
    for d in range(scores.dim() - 1):
        out.append((M_WRONG_DIM.format(dim=d),
                    lambda d=d: masked_softmax(scores, mask, dim=d)))
        out.append((M_WRONG_DIM.format(dim=d),
                    lambda d=d: torch.softmax(scores.masked_fill(~mask, -1e9), dim=d)))
    out += [
        (M_POLARITY, lambda: masked_softmax(scores, ~mask)),
        (M_POLARITY, lambda: torch.softmax(scores.masked_fill(mask, fill), dim=-1)),
        (M_AFTER, lambda: torch.softmax(scores, dim=-1) * mask),
        (M_IGNORED, lambda: torch.softmax(scores.float(), dim=-1).to(scores.dtype)),
        (M_NAN_ROWS, lambda: torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)),
        (M_UNIFORM_ROWS, lambda: torch.softmax(scores.float().masked_fill(~mask, -1e9), dim=-1)
         .to(scores.dtype)),
        (M_WEAK_FILL, lambda: torch.softmax(scores.masked_fill(~mask, -1e4), dim=-1)),
        (M_WEAK_FILL, lambda: torch.softmax(scores.masked_fill(~mask, -1e4), dim=-1).masked_fill(~mask, 0)),
    ]
    return out


def _rows_hint(weights: Tensor, mask: Tensor | None = None) -> str | None:
    w = weights.detach().double()
    sums = w.sum(-1)
    live = torch.ones_like(sums, dtype=torch.bool) if mask is None else mask.expand(w.shape).any(-1)
    if live.any() and not torch.allclose(sums[live], torch.ones_like(sums[live]), atol=1e-3):
        return "Check: each row of your weights (one query) should sum to 1 over the keys, and does not."
    return None


# --------------------------------------------------------------------------------------------
# masked_softmax
# --------------------------------------------------------------------------------------------

MS = _exercise("masked_softmax",
               "fn(scores (..., S) float, mask (..., S) bool, True = may attend) -> weights (..., S): "
               "a softmax over the last dim with masked positions at exactly 0; a row with every key "
               "masked is all zeros (never NaN); keeps the dtype (float16 too).")


def _ms_case(fn, scores: Tensor, mask: Tensor) -> None:
    ref = masked_softmax(scores, mask)
    out = _call(fn, scores.clone(), mask.clone())
    _compare(out, ref, "weights", _softmax_variants(scores, mask),
             extra=lambda w: _rows_hint(w, mask))


@_part(MS, "values")
def _(fn, gen):
    scores = _randn(gen, 2, 4, 6)
    _ms_case(fn, scores, _rand_mask(gen, 2, 4, 6))


@_part(MS, "fully_masked")
def _(fn, gen):
    scores = _randn(gen, 2, 3, 5)
    _ms_case(fn, scores, _rand_mask(gen, 2, 3, 5, fully_masked_rows=2))


@_part(MS, "broadcast")
def _(fn, gen):
    scores = _randn(gen, 3, 4, 7)  # (B, L, S)
    mask = padding_mask([7, 3, 5], max_len=7)[:, None, :]  # (B, 1, S)
    _ms_case(fn, scores, mask)


@_part(MS, "fp16")
def _(fn, gen):
    scores = _randn(gen, 2, 3, 6, dtype=torch.float16)
    _ms_case(fn, scores, _rand_mask(gen, 2, 3, 6))


@_part(MS, "large_scores")
def _(fn, gen):
    scores = _randn(gen, 2, 3, 6) * 1e3 - 5e4  # every real score far below -1e4
    _ms_case(fn, scores, _rand_mask(gen, 2, 3, 6))


# --------------------------------------------------------------------------------------------
# scaled_dot_product_attention
# --------------------------------------------------------------------------------------------

SDPA = _exercise("scaled_dot_product_attention",
                 "fn(q (..., L, E), k (..., S, E), v (..., S, Ev), mask=None (bool, broadcastable to "
                 "(..., L, S), True = may attend)) -> output (..., L, Ev) = softmax(q kᵀ / √E) v; a "
                 "query whose keys are all masked gets a zero output; keeps the dtype.")


def _sdpa_variants(q, k, v, mask):
    E = q.shape[-1]
    raw = q @ k.transpose(-2, -1)  # (..., L, S)
    scores = raw / math.sqrt(E)
    m = mask if mask is not None else torch.ones(scores.shape, dtype=torch.bool)
    m = m.expand(scores.shape)
    out = [
        (M_NO_SCALE, lambda: masked_softmax(raw, m) @ v),
        (M_SCALE_D, lambda: masked_softmax(raw / E, m) @ v),
        ("You multiplied the scores by √E; divide by it instead.", lambda: masked_softmax(raw * math.sqrt(E), m) @ v),
        ("You scaled by the square root of the key length S; the scale is 1/√E, with E the "
         "query/key width (`q.shape[-1]`).", lambda: masked_softmax(raw / math.sqrt(k.shape[-2]), m) @ v),
        ("You scaled by the square root of the VALUE width Ev; the scale is 1/√E, with E the "
         "query/key width (`q.shape[-1]`).", lambda: masked_softmax(raw / math.sqrt(v.shape[-1]), m) @ v),
        ("You returned the attention weights (..., L, S); return the output, weights @ v.",
         lambda: masked_softmax(scores, m)),
        ("You multiplied the values by the scores before the softmax, not by the weights.",
         lambda: scores @ v),
    ]
    out += [(msg, (lambda f=f: f() @ v)) for msg, f in _softmax_variants(scores, m)]
    return out


def _sdpa_case(fn, q, k, v, mask, pass_mask=True):
    ref = attention(q, k, v, mask)[0]
    args = (q.clone(), k.clone(), v.clone()) + ((mask.clone(),) if pass_mask else ())
    out = _call(fn, *args, hints=_matmul_hint)
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], Tensor):
        if _same(out[0], ref):
            raise _Wrong("Your function returned a tuple (output, weights); return only the output.")
    _compare(out, ref, "output", _sdpa_variants(q, k, v, mask))


def _matmul_hint(exc: BaseException) -> str | None:
    text = str(exc)
    if any(s in text for s in ("cannot be multiplied", "must match the size", "Expected size for first",
                               "size mismatch", "Expected batch2", "dimension 0")):
        return ("A matrix product got shapes that do not fit: to compare every query with every key, "
                "transpose the LAST TWO axes of the keys, `q @ k.transpose(-2, -1)` (not `k.T` and not "
                "`k.transpose(0, 1)`).")
    return None


@_part(SDPA, "no_mask")
def _(fn, gen):
    q, k, v = _randn(gen, 2, 3, 8), _randn(gen, 2, 5, 8), _randn(gen, 2, 5, 4)
    _sdpa_case(fn, q, k, v, None, pass_mask=False)


@_part(SDPA, "mask")
def _(fn, gen):
    q, k, v = _randn(gen, 2, 4, 8), _randn(gen, 2, 6, 8), _randn(gen, 2, 6, 3)
    _sdpa_case(fn, q, k, v, _rand_mask(gen, 2, 4, 6))


@_part(SDPA, "fully_masked")
def _(fn, gen):
    q, k, v = _randn(gen, 2, 4, 8), _randn(gen, 2, 5, 8), _randn(gen, 2, 5, 3)
    _sdpa_case(fn, q, k, v, _rand_mask(gen, 2, 4, 5, fully_masked_rows=2))


@_part(SDPA, "heads")
def _(fn, gen):
    q, k, v = _randn(gen, 2, 3, 4, 8), _randn(gen, 2, 3, 6, 8), _randn(gen, 2, 3, 6, 5)  # (B, H, ., .)
    mask = padding_mask([6, 4], max_len=6)[:, None, None, :]  # (B, 1, 1, S)
    _sdpa_case(fn, q, k, v, mask)


@_part(SDPA, "fp16")
def _(fn, gen):
    q, k, v = (_randn(gen, 2, 3, 8, dtype=torch.float16), _randn(gen, 2, 5, 8, dtype=torch.float16),
               _randn(gen, 2, 5, 4, dtype=torch.float16))
    _sdpa_case(fn, q, k, v, _rand_mask(gen, 2, 3, 5))


# --------------------------------------------------------------------------------------------
# weights_shape (conceptual)
# --------------------------------------------------------------------------------------------

WS = _exercise("weights_shape",
               "fn(B, H, L, S, E, Ev) -> (weights_shape, output_shape), two tuples of ints: the shapes "
               "of the weights and of the output of attention(q, k, v) for q (B, H, L, E), "
               "k (B, H, S, E), v (B, H, S, Ev).")

_WS_CASES = [(2, 4, 3, 5, 8, 6), (1, 2, 7, 3, 4, 10), (3, 1, 1, 9, 2, 2)]


def _ws_answer(fn, case):
    ans = _call(fn, *case)
    if not (isinstance(ans, (tuple, list)) and len(ans) == 2):
        raise _Wrong(f"For {dict(zip('B H L S E Ev'.split(), case))} your function returned {ans!r:.80}; "
                     "it should return two shapes: (weights_shape, output_shape).")
    return ans


def _as_shape(x) -> tuple | None:
    try:
        return tuple(int(i) for i in x)
    except Exception:
        return None


def _ws_check(which: int, fn):
    for case in _WS_CASES:
        B, H, L, S, E, Ev = case
        q, k, v = torch.zeros(B, H, L, E), torch.zeros(B, H, S, E), torch.zeros(B, H, S, Ev)
        out, weights = attention(q, k, v)
        ref = tuple(weights.shape) if which == 0 else tuple(out.shape)
        got = _as_shape(_ws_answer(fn, case)[which])
        if got == ref:
            continue
        sizes = f"B={B}, H={H}, L={L}, S={S}, E={E}, Ev={Ev}"
        named = {
            (B, H, S, L): "rows are queries and columns are keys: the weights are (B, H, L, S), not (B, H, S, L).",
            (B, L, S): "you forgot the heads: every head has its own weights, (B, H, L, S).",
            (B, H, L, L): "the weights have one column per KEY, and there are S keys (L is the number of queries).",
            (B, H, S, S): "the weights have one row per QUERY, and there are L queries.",
            (B, H, L, E): "the weights compare queries with keys; their last size is the number of keys S, not the width E.",
            (B, H, S, Ev): "the output has one row per query (L rows), not one per key.",
            (B, L, H * Ev): "attention itself keeps the heads apart, (B, H, L, Ev); merging them is a later step.",
        }
        if which == 1:
            named[(B, H, L, E)] = "the output is a weighted average of the VALUES, so its width is Ev, not E."
            named[(B, H, L, S)] = "that is the shape of the weights; the output is weights @ v."
        what = "weights" if which == 0 else "output"
        note = named.get(got)
        raise _Wrong(f"For {sizes} you gave the {what} shape {got}; expected {ref}."
                     + (f" Mistake: {note}" if note else ""))


@_part(WS, "weights")
def _(fn, gen):
    _ws_check(0, fn)


@_part(WS, "output")
def _(fn, gen):
    _ws_check(1, fn)


# --------------------------------------------------------------------------------------------
# causal_mask and pick_causal_mask
# --------------------------------------------------------------------------------------------

CM = _exercise("causal_mask",
               "fn(L, S) -> (L, S) bool, True = may attend, aligned to the bottom right: query i sees "
               "key j when j <= i + (S - L) (the last query sees every key).")

M_DIAG = ("Your mask excludes the diagonal: a token may attend to itself (use `<=`, or `tril` with "
          "diagonal 0, not -1).")
M_FUTURE = "Your mask lets the future in: query i must not see keys after its own position."
M_CM_POLARITY = ("Your mask is inverted: True must mean 'may attend' (the past and the token itself), "
                 "False the future.")
M_TOPLEFT = ("Your mask is aligned to the top left: with fewer queries than keys (L < S, e.g. new "
             "tokens after a cache of keys) the LAST query is the newest token and must see every key. "
             "Align to the bottom right: j <= i + (S - L).")


def _cm_variants(L, S):
    ones = torch.ones(L, S, dtype=torch.bool)
    return [
        (M_DIAG, lambda: ones.tril(S - L - 1)),
        (M_CM_POLARITY, lambda: ~causal_mask(L, S)),
        (M_FUTURE, lambda: ones.triu(S - L)),
        (M_FUTURE, lambda: ones),
        (M_TOPLEFT, lambda: ones.tril()),
        (M_TOPLEFT + " Also, " + M_DIAG[0].lower() + M_DIAG[1:], lambda: ones.tril(-1)),
    ]


def _cm_case(fn, L, S):
    out = _call(fn, L, S)
    if isinstance(out, Tensor) and out.dtype != torch.bool and tuple(out.shape) == (L, S):
        named = _match(out.bool() if out.dtype.is_floating_point or not out.dtype.is_complex else out,
                       _cm_variants(L, S))
        if _same(out.bool(), causal_mask(L, S)):
            raise _Wrong(f"Your mask has the right pattern but dtype {out.dtype}; return a bool tensor "
                         "(True = may attend): compare with `<=` or call `.bool()`.")
        if named:
            raise _Wrong(f"Your mask has dtype {out.dtype} (it must be bool), and: {named}")
    _compare(out, causal_mask(L, S), f"mask for L={L}, S={S}", _cm_variants(L, S))


@_part(CM, "square")
def _(fn, gen):
    _cm_case(fn, 5, 5)


@_part(CM, "more_keys")
def _(fn, gen):
    _cm_case(fn, 3, 7)


@_part(CM, "one_query")
def _(fn, gen):
    _cm_case(fn, 1, 6)


@_part(CM, "fewer_keys")
def _(fn, gen):
    _cm_case(fn, 5, 3)


def causal_mask_choices(L: int, S: int) -> dict[str, Tensor]:
    """Four candidate masks (L, S), labelled "A" to "D", for the `pick_causal_mask` exercise.

    Shapes:
        -> dict of four (L, S) bool masks
    """
    ones = torch.ones(L, S, dtype=torch.bool)
    return {
        "A": ones.tril(),  # top-left aligned
        "B": ones.tril(S - L - 1),  # bottom-right, diagonal excluded
        "C": causal_mask(L, S),  # the right one
        "D": ones.triu(S - L),  # the future
    }


PCM = _exercise("pick_causal_mask",
                "answer: a dict {'square': letters, 'cache': letters}; for each situation, ALL the masks "
                "among causal_mask_choices(L, S) that make the model causal (True = may attend), as a "
                "string such as 'AD' or a set of letters: 'square' is L = S = 4, 'cache' is L = 2 new "
                "tokens after 3 cached ones (S = 5).")

_PCM_WHY = {
    "A": ("mask A is aligned to the top left: with a cache the newest query (the last row) must see "
          "every key, and under A it does not"),
    "B": "mask B hides the diagonal, but a token may attend to itself",
    "D": "mask D lets every query see the future and hides the past",
}


def _pcm_case(answer, key: str, L: int, S: int) -> None:
    if not isinstance(answer, dict):
        raise _Wrong(f"Your answer is {answer!r:.80}; expected a dict such as {{'square': 'A', 'cache': 'BD'}}.")
    got = answer.get(key)
    try:
        letters = {str(c).strip().upper() for c in got} - {"", ","}
    except TypeError:
        letters = None
    if not letters or not letters <= set("ABCD"):
        raise _Wrong(f"Your answer for {key!r} is {got!r:.40}; expected some of the letters 'A', 'B', 'C', "
                     "'D' (a string such as 'AC' or a set).")
    choices = causal_mask_choices(L, S)
    right = {c for c, m in choices.items() if torch.equal(m, causal_mask(L, S))}
    if letters == right:
        return
    notes = [_PCM_WHY[c] for c in sorted(letters - right) if c in _PCM_WHY]
    missed = sorted(right - letters)
    if missed:
        extra = (" When L = S, aligning to the top left or to the bottom right gives the same mask."
                 if L == S and len(right) > 1 else "")
        notes.append(f"you left out {', '.join(missed)}, which is causal too" + ("." + extra if extra else ""))
    raise _Wrong(f"For {key!r} (L={L}, S={S}) your choice {''.join(sorted(letters))} is not right: "
                 + "; ".join(notes).rstrip(".") + ".")


@_part(PCM, "square")
def _(answer, gen):
    _pcm_case(answer, "square", 4, 4)


@_part(PCM, "cache")
def _(answer, gen):
    _pcm_case(answer, "cache", 2, 5)


# --------------------------------------------------------------------------------------------
# split_heads, merge_heads, multi_head_forward
# --------------------------------------------------------------------------------------------

def _split_ref(x: Tensor, H: int) -> Tensor:
    B, L, E = x.shape
    return x.reshape(B, L, H, E // H).transpose(1, 2)  # (B, H, L, D)


def _merge_ref(x: Tensor) -> Tensor:
    B, H, L, D = x.shape
    return x.transpose(1, 2).reshape(B, L, H * D)  # (B, L, H·D)


M_SPLIT_NO_T = ("You split the width into heads with `view`/`reshape` to (B, H, L, D) directly, without "
                "a transpose: that mixes positions across heads. Reshape to (B, L, H, D) first, then "
                "`.transpose(1, 2)`.")
M_SPLIT_FORGOT_T = ("You reshaped to (B, L, H, D) but did not move the heads forward: add "
                    "`.transpose(1, 2)` to get (B, H, L, D).")
M_SPLIT_INTERLEAVE = ("Your heads take every H-th feature (you reshaped to (B, L, D, H)); head h must own "
                      "the contiguous block of features h·D ... (h+1)·D - 1: reshape to (B, L, H, D).")

SH = _exercise("split_heads",
               "fn(x (B, L, E), num_heads) -> (B, H, L, E // H): head h gets the features "
               "h·D ... (h+1)·D - 1 of every position (D = E // H).")


def _split_variants(x, H):
    B, L, E = x.shape
    D = E // H
    return [
        (M_SPLIT_NO_T, lambda: x.reshape(B, H, L, D)),
        (M_SPLIT_FORGOT_T, lambda: x.reshape(B, L, H, D)),
        (M_SPLIT_INTERLEAVE, lambda: x.reshape(B, L, D, H).permute(0, 3, 1, 2)),
        ("You transposed to (B, H, D, L); each head must be (L, D), positions first.",
         lambda: x.reshape(B, L, H, D).permute(0, 2, 3, 1)),
    ]


def _sh_case(fn, x, H):
    out = _call(fn, x, H)
    _compare(out, _split_ref(x, H), "result", _split_variants(x, H))


@_part(SH, "values")
def _(fn, gen):
    _sh_case(fn, _randn(gen, 2, 5, 12), 3)


@_part(SH, "one_head")
def _(fn, gen):
    _sh_case(fn, _randn(gen, 2, 4, 6), 1)


@_part(SH, "non_contiguous")
def _(fn, gen):
    x = _randn(gen, 2, 8, 6).transpose(1, 2)  # (B, L=6, E=8), not contiguous
    _sh_case(fn, x, 4)


MH = _exercise("merge_heads",
               "fn(x (B, H, L, D)) -> (B, L, H·D): the inverse of split_heads, head h's features at "
               "h·D ... (h+1)·D - 1.")


def _merge_variants(x):
    B, H, L, D = x.shape
    return [
        ("You reshaped (B, H, L, D) straight to (B, L, H·D) without moving the heads back next to the "
         "width: `.transpose(1, 2)` to (B, L, H, D) first, then reshape.", lambda: x.reshape(B, L, H * D)),
        ("You interleaved the heads' features (order (D, H)); head h must own the contiguous block "
         "h·D ... (h+1)·D - 1: transpose to (B, L, H, D), then reshape.",
         lambda: x.permute(0, 2, 3, 1).reshape(B, L, H * D)),
        ("You forgot to merge: transpose to (B, L, H, D) and reshape to (B, L, H·D).",
         lambda: x.transpose(1, 2)),
    ]


def _mh_case(fn, x):
    out = _call(fn, x)
    _compare(out, _merge_ref(x), "result", _merge_variants(x))


@_part(MH, "values")
def _(fn, gen):
    _mh_case(fn, _randn(gen, 2, 3, 5, 4))


@_part(MH, "round_trip")
def _(fn, gen):
    x = _randn(gen, 3, 4, 8)  # (B, L, E)
    out = _call(fn, _split_ref(x, 2))
    if not _same(out, x):
        _mh_case(fn, _split_ref(x, 2))  # names the mistake if it can
        raise _Wrong("merge_heads(split_heads(x)) should give x back, and does not.")


@_part(MH, "one_head")
def _(fn, gen):
    _mh_case(fn, _randn(gen, 2, 1, 4, 6))


MHF = _exercise(
    "multi_head_forward",
    "EITHER a function fn(query (B, L, E), key (B, S, E), value (B, S, E), W_q, W_k, W_v, W_o, "
    "num_heads, mask=None) -> output (B, L, E), with weights (E, E) applied as in nn.Linear without "
    "bias (x @ W.T), mask bool broadcastable to (B, 1, L, S) (True = may attend); "
    "OR an nn.Module class built as cls(embed_dim, num_heads) whose forward(query, key, value, "
    "mask=None) returns the output (B, L, E) (or a tuple starting with it), with four Linear(E, E) "
    "layers registered in the order q, k, v, out, or a fused (3E, E) q/k/v weight and an out layer; "
    "biases are set to zero for grading.")


def _mha_ref(query, key, value, W_q, W_k, W_v, W_o, H, mask=None, *, split=_split_ref,
             merge=_merge_ref, scale=None, out_proj=True):
    q = split(query @ W_q.T, H)  # (B, H, L, D)
    k = split(key @ W_k.T, H)  # (B, H, S, D)
    v = split(value @ W_v.T, H)  # (B, H, S, D)
    m = None if mask is None else (mask if mask.dim() == 4 else mask[:, None])  # (B, 1, L or 1, S)
    out = attention(q, k, v, m, scale=scale)[0]  # (B, H, L, D)
    out = merge(out)  # (B, L, E)
    return out @ W_o.T if out_proj else out


M_NO_OUT = ("Your output skips the output projection W_o: after merging the heads, mix them with "
            "`output @ W_o.T` (an `nn.Linear(E, E)`).")


def _mha_variants(args, H, mask):
    query, key, value, W_q, W_k, W_v, W_o = args
    B, L, E = query.shape
    D = E // H

    def nosplit(x, H):
        return x.reshape(x.shape[0], H, x.shape[1], -1)

    return [
        (M_NO_OUT, lambda: _mha_ref(*args, H, mask, out_proj=False)),
        (M_SPLIT_NO_T, lambda: _mha_ref(*args, H, mask, split=nosplit,
                                        merge=lambda o: o.reshape(B, L, E))),
        (M_SPLIT_NO_T, lambda: _mha_ref(*args, H, mask, split=nosplit)),
        ("Merging the heads: you reshaped (B, H, L, D) to (B, L, E) without `.transpose(1, 2)` first.",
         lambda: _mha_ref(*args, H, mask, merge=lambda o: o.reshape(B, L, E))),
        (M_NO_SCALE.replace("√E (the square root of the query/key width)", "√D (the per-head width)"),
         lambda: _mha_ref(*args, H, mask, scale=1.0)),
        ("You scaled by 1/√E with E the model width; each head's scores are scaled by 1/√D, "
         "D = E // H the per-head width.", lambda: _mha_ref(*args, H, mask, scale=1 / math.sqrt(E))),
        ("You applied the weights as x @ W; nn.Linear computes x @ W.T.",
         lambda: _mha_ref(query, key, value, W_q.T, W_k.T, W_v.T, W_o.T, H, mask)),
        ("You ran one head over the full width: split the projected q, k, v into H heads of width D.",
         lambda: _mha_ref(*args, 1, mask, scale=1 / math.sqrt(D))),
        (M_POLARITY, lambda: _mha_ref(*args, H, ~mask) if mask is not None else None),
    ]


def _mhf_inputs(gen, B=2, L=3, S=5, E=8):
    args = (_randn(gen, B, L, E), _randn(gen, B, S, E), _randn(gen, B, S, E),
            *(_randn(gen, E, E) / math.sqrt(E) for _ in range(4)))
    return args


def _is_module_class(fn) -> bool:
    return isinstance(fn, type) and issubclass(fn, nn.Module)


def _mhf_function_case(fn, args, H, mask):
    ref = _mha_ref(*args, H, mask)
    extra = () if mask is None else (mask.clone(),)
    out = _call(fn, *(a.clone() for a in args), H, *extra, hints=_matmul_hint)
    _compare(out, ref, "output", _mha_variants(args, H, mask))


def _plain_lists(module: nn.Module) -> list[str]:
    found = []
    for name, value in vars(module).items():
        if name.startswith("_"):  # nn.Module's own bookkeeping (_modules, _parameters, ...)
            continue
        if isinstance(value, (list, tuple)) and any(isinstance(v, nn.Module) for v in value):
            found.append(name)
        if isinstance(value, dict) and any(isinstance(v, nn.Module) for v in value.values()):
            found.append(name)
    return found


def _build_module(cls, E, H) -> nn.Module:
    module = _call(cls, E, H)
    if not isinstance(module, nn.Module):
        raise _Wrong(f"`{cls.__name__}(embed_dim, num_heads)` did not build an nn.Module.")
    lists = _plain_lists(module)
    n_params = sum(p.numel() for p in module.parameters())
    if lists:
        raise _Wrong(f"Your sub-layers are kept in a plain Python list/dict ({', '.join(lists)}): PyTorch "
                     f"does not register them, so the module has {n_params} registered parameters, the "
                     "optimizer never trains them and `.to(device)` never moves them. Use "
                     "`nn.ModuleList([...])` (or `nn.ModuleDict`).")
    if n_params == 0:
        raise _Wrong("Your module has 0 registered parameters: assign its layers as attributes "
                     "(`self.q_proj = nn.Linear(E, E)`) or keep them in an `nn.ModuleList`.")
    return module


@_part(MHF, "values")
def _(fn, gen):
    H = 2
    if _is_module_class(fn):
        _mhf_module_values(fn, gen, H, mask=False)
        return
    _mhf_function_case(fn, _mhf_inputs(gen), H, None)


@_part(MHF, "mask")
def _(fn, gen):
    H = 4
    if _is_module_class(fn):
        _mhf_module_values(fn, gen, H, mask=True)
        return
    args = _mhf_inputs(gen, B=2, L=4, S=6, E=8)
    _mhf_function_case(fn, args, H, _rand_mask(gen, 2, 4, 6, fully_masked_rows=1))


@_part(MHF, "structure")
def _(fn, gen):
    E, H = 8, 2
    if not _is_module_class(fn):
        # a function: check that it really uses all four weights, one at a time
        args = _mhf_inputs(gen)
        for i, name in ((3, "W_q"), (4, "W_k"), (5, "W_v"), (6, "W_o")):
            changed = list(args)
            changed[i] = changed[i] + 0.5 * _randn(gen, E, E)
            out_a = _call(fn, *(a.clone() for a in args), H, hints=_matmul_hint)
            out_b = _call(fn, *(a.clone() for a in changed), H, hints=_matmul_hint)
            if isinstance(out_a, Tensor) and _same(out_a, out_b):
                raise _Wrong((M_NO_OUT if name == "W_o" else f"Your output does not depend on {name}: "
                              "use it to project the inputs."))
        return
    module = _build_module(fn, E, H)
    shapes = [tuple(p.shape) for p in module.parameters() if p.dim() == 2]
    blocks = shapes.count((E, E)) + 3 * shapes.count((3 * E, E))  # (E, E) projections
    if blocks == 3:
        raise _Wrong(M_NO_OUT.replace("`output @ W_o.T`", "a final `nn.Linear(E, E)`"))
    if blocks < 4:
        raise _Wrong(f"Expected four (E, E) projections (q, k, v and the output projection); your module "
                     f"has weights of shapes {shapes}.")


def _projection_weights(module: nn.Module, E: int) -> list[Tensor] | None:
    """The module's (E, E) or fused (3E, E) projection weights, in registration order.

    Accepted layouts: four (E, E) weights q, k, v, out (e.g. four ``nn.Linear(E, E)``), or a fused
    (3E, E) weight with rows q, k, v followed by an (E, E) output weight (as
    ``nn.MultiheadAttention`` and ``attnbook.multihead.MultiHeadAttention`` store them).
    """
    weights = [p for p in module.parameters() if p.dim() == 2]
    shapes = [tuple(p.shape) for p in weights]
    if shapes == [(E, E)] * 4 or shapes == [(3 * E, E), (E, E)]:
        return weights
    return None


def _mhf_module_values(cls, gen, H, mask: bool):
    E, B, L, S = 8, 2, 3, 5
    module = _build_module(cls, E, H)
    weights = _projection_weights(module, E)
    if weights is None:
        shapes = [tuple(p.shape) for p in module.parameters() if p.dim() == 2]
        if shapes.count((E, E)) == 3 or shapes == [(3 * E, E)]:
            raise _Wrong(M_NO_OUT.replace("`output @ W_o.T`", "a final `nn.Linear(E, E)`"))
        raise _Wrong("To grade your module, give it four Linear(E, E) layers registered in the order q, "
                     f"k, v, out (or a fused (3E, E) weight and an out layer); found weights {shapes}.")
    args = _mhf_inputs(gen, B, L, S, E)
    with torch.no_grad():
        if len(weights) == 4:
            for weight, W in zip(weights, args[3:]):
                weight.copy_(W)
        else:
            weights[0].copy_(torch.cat(args[3:6], dim=0))  # (3E, E): rows q, k, v
            weights[1].copy_(args[6])
        for p in module.parameters():
            if p.dim() == 1:
                p.zero_()  # biases
    module.eval()
    m = _rand_mask(gen, B, L, S, fully_masked_rows=1) if mask else None
    ref = _mha_ref(*args, H, m)
    extra = {} if m is None else {"mask": m}
    with torch.no_grad():
        out = _call(module, *args[:3], hints=_matmul_hint, **extra)
    if isinstance(out, tuple) and out and isinstance(out[0], Tensor):
        out = out[0]  # (output, weights) is accepted from a module, as nn.MultiheadAttention does
    _compare(out, ref, "output", _mha_variants(args, H, m))


# --------------------------------------------------------------------------------------------
# seq2seq attention step, final state, masked mean, padding mask
# --------------------------------------------------------------------------------------------

S2S = _exercise("seq2seq_attention_step",
                "fn(decoder_state (B, D), encoder_states (B, S, D), source_mask (B, S) bool, True = real "
                "token) -> (context (B, D), weights (B, S)), with the dot score "
                "score_j = decoder_state · encoder_states[:, j] (no scaling); padding gets zero weight.")


def _s2s_ref(h, enc, mask, scale=1.0, m=None):
    m = mask if m is None else m
    context, weights = attention(h[:, None, :], enc, enc, m[:, None, :], scale=scale)
    return context[:, 0], weights[:, 0]  # (B, D), (B, S)


def _s2s_variants(h, enc, mask, which):
    D = h.shape[-1]
    scores = (enc @ h[:, :, None])[..., 0]  # (B, S)

    def pick(pair):
        return pair[which]

    def with_context(w):  # weights (B, S) -> (context (B, D), weights)
        return (w[:, :, None] * enc).sum(1), w

    return [
        ("You scaled the dot score by 1/√D; this step uses the plain dot score (Luong's 'dot').",
         lambda: pick(_s2s_ref(h, enc, mask, 1 / math.sqrt(D)))),
        (M_POLARITY, lambda: pick(_s2s_ref(h, enc, mask, m=~mask))),
        (M_IGNORED + " Padding positions must get zero weight.",
         lambda: pick(_s2s_ref(h, enc, mask, m=torch.ones_like(mask)))),
        ("The softmax runs over the batch (dim=0): each sentence's weights must sum to 1 over its "
         "source positions, so use `dim=-1`.",
         lambda: pick(with_context(masked_softmax(scores, mask, dim=0)))),
        (M_AFTER, lambda: pick(with_context(torch.softmax(scores, -1) * mask))),
        (M_NAN_ROWS.replace("Such a query", "A source with no real token"),
         lambda: pick(with_context(torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)))),
        ("Your context sums over the wrong axis: it is Σ_j weights[:, j] · encoder_states[:, j], "
         "a (B, D) vector.",
         lambda: (masked_softmax(scores, mask)[:, :, None] * enc).sum(2) if which == 0 else None),
    ]


def _s2s_case(fn, h, enc, mask):
    ref_c, ref_w = _s2s_ref(h, enc, mask)
    out = _call(fn, h.clone(), enc.clone(), mask.clone(), hints=_matmul_hint)
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise _Wrong(f"Your function returned {type(out).__name__}; it should return a pair "
                     "(context (B, D), weights (B, S)).")
    _compare(out[1], ref_w, "weights", _s2s_variants(h, enc, mask, 1))
    _compare(out[0], ref_c, "context", _s2s_variants(h, enc, mask, 0))


@_part(S2S, "values")
def _(fn, gen):
    B, S, D = 3, 6, 4
    _s2s_case(fn, _randn(gen, B, D), _randn(gen, B, S, D), torch.ones(B, S, dtype=torch.bool))


@_part(S2S, "padding")
def _(fn, gen):
    B, S, D = 3, 7, 5
    _s2s_case(fn, _randn(gen, B, D), _randn(gen, B, S, D), padding_mask([7, 4, 2], max_len=S))


@_part(S2S, "empty_source")
def _(fn, gen):
    B, S, D = 2, 4, 3
    _s2s_case(fn, _randn(gen, B, D), _randn(gen, B, S, D), padding_mask([3, 0], max_len=S))


FS = _exercise("final_state",
               "fn(outputs (B, S, D), lengths (B,) int64) -> (B, D): for each sequence, the encoder "
               "output at its last real position, lengths[b] - 1 (later positions are padding).")


def _fs_case(fn, outputs, lengths):
    ref = outputs[torch.arange(outputs.shape[0]), lengths - 1]  # (B, D)
    out = _call(fn, outputs.clone(), lengths.clone(), hints=lambda e: (
        "An index went past the end: you took position lengths[b], one past the last real token; "
        "positions count from 0, so the last real one is lengths[b] - 1."
        if isinstance(e, IndexError) or "out of bounds" in str(e) else None))
    variants = [
        ("You took the last position of the padded tensor, `outputs[:, -1]`; for a shorter sequence "
         "that is padding. Take position lengths[b] - 1 of each sequence.", lambda: outputs[:, -1]),
        ("You took position lengths[b], one past the last real token: positions count from 0, so the "
         "last one is lengths[b] - 1.",
         lambda: outputs[torch.arange(outputs.shape[0]), lengths.clamp(max=outputs.shape[1] - 1)]),
        ("You took the first position; the summary of a sequence is its LAST real state.",
         lambda: outputs[:, 0]),
    ]
    _compare(out, ref, "final states", variants)


@_part(FS, "values")
def _(fn, gen):
    _fs_case(fn, _randn(gen, 3, 6, 4), torch.tensor([4, 6, 2]))


@_part(FS, "full_length")
def _(fn, gen):
    _fs_case(fn, _randn(gen, 2, 5, 3), torch.tensor([5, 5]))


@_part(FS, "length_one")
def _(fn, gen):
    _fs_case(fn, _randn(gen, 3, 4, 2), torch.tensor([1, 3, 1]))


MM = _exercise("masked_mean",
               "fn(outputs (B, S, D), mask (B, S) bool, True = real token) -> (B, D): the mean of the "
               "real positions of each sequence; a sequence with no real position gives zeros.")


def _mm_ref(outputs, mask):
    weights = masked_softmax(torch.zeros(mask.shape), mask)  # (B, S): uniform over the real tokens
    return (weights[:, :, None] * outputs).sum(1)  # (B, D)


def _mm_case(fn, outputs, mask):
    m = mask[:, :, None].to(outputs.dtype)
    variants = [
        ("You averaged over all S positions, padding included: divide the sum over the real "
         "positions by the number of real positions (mask.sum).", lambda: outputs.mean(1)),
        ("You divided by S, padding included, instead of by each sequence's number of real tokens.",
         lambda: (outputs * m).sum(1) / outputs.shape[1]),
        ("You summed without dividing by the number of real tokens.", lambda: (outputs * m).sum(1)),
        ("A sequence with no real token gives 0/0 = NaN: return zeros for it (e.g. divide by "
         "`count.clamp(min=1)`).", lambda: (outputs * m).sum(1) / m.sum(1)),
        (M_POLARITY, lambda: _mm_ref(outputs, ~mask)),
    ]
    out = _call(fn, outputs.clone(), mask.clone())
    _compare(out, _mm_ref(outputs, mask), "means", variants)


@_part(MM, "values")
def _(fn, gen):
    _mm_case(fn, _randn(gen, 3, 6, 4), padding_mask([6, 2, 4], max_len=6))


@_part(MM, "no_padding")
def _(fn, gen):
    _mm_case(fn, _randn(gen, 2, 4, 3), padding_mask([4, 4]))


@_part(MM, "empty")
def _(fn, gen):
    _mm_case(fn, _randn(gen, 3, 5, 2), padding_mask([3, 0, 5], max_len=5))


PM = _exercise("padding_mask",
               "fn(lengths (B,) int64, S) -> (B, S) bool, True on the real tokens (position < length), "
               "False on padding.")


def _pm_case(fn, lengths, S):
    ref = padding_mask(lengths, max_len=S)
    pos = torch.arange(S)[None, :]  # (1, S)
    variants = [
        (M_POLARITY.replace("the scores to hide are where the mask is False (`~mask`), not where it is "
                            "True.", "True marks real tokens and False the padding."),
         lambda: ~ref),
        ("Off by one: position p is real when p < length (positions count from 0), not p <= length.",
         lambda: pos <= lengths[:, None]),
        ("Off by one: position p is real when p < length; you also dropped the last real token.",
         lambda: pos < lengths[:, None] - 1),
    ]
    out = _call(fn, lengths.clone(), S)
    _compare(out, ref, "mask", variants)


@_part(PM, "values")
def _(fn, gen):
    _pm_case(fn, torch.tensor([3, 5, 1]), 5)


@_part(PM, "longer_S")
def _(fn, gen):
    _pm_case(fn, torch.tensor([2, 4]), 7)


@_part(PM, "zero_length")
def _(fn, gen):
    _pm_case(fn, torch.tensor([0, 3]), 4)


# --------------------------------------------------------------------------------------------
# Scores: scaled dot, variance, bilinear, additive, parameter counts, widths
# --------------------------------------------------------------------------------------------

SDS = _exercise("scaled_dot_scores",
                "fn(q (..., L, E), k (..., S, E)) -> scores (..., L, S) = q kᵀ / √E.")


def _sds_case(fn, q, k):
    E = q.shape[-1]
    ref = q @ k.transpose(-2, -1) / math.sqrt(E)  # (..., L, S)
    raw = q @ k.transpose(-2, -1)
    variants = [
        (M_NO_SCALE, lambda: raw),
        (M_SCALE_D, lambda: raw / E),
        ("You multiplied by √E; divide by it.", lambda: raw * math.sqrt(E)),
        ("You scaled by √S (the number of keys); scale by √E, the width.", lambda: raw / math.sqrt(k.shape[-2])),
        ("You returned the scores key-by-query (..., S, L): compute q @ kᵀ, not k @ qᵀ.",
         lambda: k @ q.transpose(-2, -1) / math.sqrt(E)),
        ("Keys transposed on the wrong axes: `.T` (or `.transpose(0, 1)`) on a batch of keys moves the "
         "batch axis too; use `k.transpose(-2, -1)`.", lambda: q @ k.T / math.sqrt(E)),
        ("You applied a softmax: this function returns the raw scaled scores.",
         lambda: torch.softmax(raw / math.sqrt(E), -1)),
    ]
    out = _call(fn, q.clone(), k.clone(), hints=_matmul_hint)
    _compare(out, ref, "scores", variants)


@_part(SDS, "values")
def _(fn, gen):
    _sds_case(fn, _randn(gen, 2, 3, 16), _randn(gen, 2, 5, 16))


@_part(SDS, "heads")
def _(fn, gen):
    _sds_case(fn, _randn(gen, 2, 3, 4, 9), _randn(gen, 2, 3, 6, 9))


@_part(SDS, "unbatched")
def _(fn, gen):
    _sds_case(fn, _randn(gen, 4, 25), _randn(gen, 7, 25))


SV = _exercise("score_variance",
               "fn(E) -> (var_dot, var_scaled): for q and k with independent standard-normal entries "
               "of width E, the variance of q·k and of q·k / √E.")


@_part(SV, "unscaled")
def _(fn, gen):
    for E in (4, 64, 512):
        ans = _call(fn, E)
        if not (isinstance(ans, (tuple, list)) and len(ans) == 2):
            raise _Wrong(f"For E={E} your function returned {ans!r:.60}; expected two numbers (var_dot, var_scaled).")
        _check_int(ans[0], E, f"the variance of q·k with E={E}", [
            ("That is the standard deviation √E; the variance is the sum of E variances of 1, so E.",
             math.sqrt(E)),
            ("Each product q_i k_i has variance 1, and q·k sums E of them: the variances add up to E.", 1),
            ("The variance of a sum of E independent terms of variance 1 is E, not E².", E * E),
        ])


@_part(SV, "scaled")
def _(fn, gen):
    for E in (4, 64, 512):
        ans = _call(fn, E)
        if not (isinstance(ans, (tuple, list)) and len(ans) == 2):
            raise _Wrong(f"For E={E} your function returned {ans!r:.60}; expected two numbers (var_dot, var_scaled).")
        _check_int(ans[1], 1, f"the variance of q·k/√E with E={E}", [
            ("Dividing by √E divides the variance by (√E)² = E, so E/E = 1.", 1 / math.sqrt(E)),
            ("Dividing by √E divides the variance by E (a constant c scales the variance by c²), giving 1.",
             math.sqrt(E)),
            ("Dividing by √E divides the variance by E, giving 1; 1/E is what dividing by E would give.", 1 / E),
            ("You kept the unscaled variance E; dividing by √E divides it by E.", E),
        ])


BS = _exercise("bilinear_score",
               "fn(queries (B, L, Dq), weight (Dq, Dk), keys (B, S, Dk)) -> scores (B, L, S), "
               "scores[b, i, j] = queries[b, i] @ weight @ keys[b, j] (Luong's 'general' score, as "
               "attnbook.scores.BilinearScore).")


def _bs_ref(queries, weight, keys):
    score = _scores_module("BilinearScore", weight.shape[0], weight.shape[1])
    with torch.no_grad():
        score.weight.copy_(weight)
        return score(queries, keys)  # (B, L, S)


def _scores_module(name: str, *args) -> nn.Module:
    from . import scores
    return getattr(scores, name)(*args)


def _bs_case(fn, queries, weight, keys):
    ref = _bs_ref(queries, weight, keys)
    variants = [
        ("You used the transposed weight: the score is q W kᵀ with W of shape (Dq, Dk), so "
         "`queries @ weight @ keys.transpose(1, 2)`.", lambda: queries @ weight.T @ keys.transpose(1, 2)),
        ("You scaled the bilinear score; this exercise asks for the plain q W kᵀ.",
         lambda: ref / math.sqrt(keys.shape[-1])),
        ("You returned the scores key-by-query (B, S, L): the rows must be the queries.",
         lambda: ref.transpose(1, 2)),
        ("You applied a softmax: this function returns the raw scores.", lambda: torch.softmax(ref, -1)),
        ("You dropped the weight: that is the dot score q kᵀ.", lambda: queries @ keys.transpose(1, 2)),
    ]
    out = _call(fn, queries.clone(), weight.clone(), keys.clone(), hints=lambda e: (
        "If `weight` were an nn.Linear you would call it, `w(x)`; here it is a plain (Dq, Dk) tensor: "
        "`queries @ weight @ keys.transpose(1, 2)`." if isinstance(e, TypeError) else _matmul_hint(e)))
    _compare(out, ref, "scores", variants)


@_part(BS, "values")
def _(fn, gen):
    _bs_case(fn, _randn(gen, 2, 3, 4), _randn(gen, 4, 6), _randn(gen, 2, 5, 6))


@_part(BS, "square")
def _(fn, gen):
    _bs_case(fn, _randn(gen, 2, 4, 5), _randn(gen, 5, 5), _randn(gen, 2, 6, 5))


@_part(BS, "batch")
def _(fn, gen):
    _bs_case(fn, _randn(gen, 4, 1, 3), _randn(gen, 3, 2), _randn(gen, 4, 7, 2))


BED = _exercise("bilinear_equals_dot",
                "fn(D) -> weight (D, D) float32 such that the bilinear score q W kᵀ equals the scaled dot "
                "score q kᵀ / √D for every q and k.")


@_part(BED, "values")
def _(fn, gen):
    for D in (4, 9):
        ref = torch.eye(D) / math.sqrt(D)
        out = _call(fn, D)
        if isinstance(out, Tensor) and out.dtype != torch.float32 and out.dtype.is_floating_point:
            out = out.float()
        _compare(out, ref, f"weight for D={D}", [
            ("The identity gives the UNSCALED dot score q kᵀ; the scaled one needs I / √D.",
             lambda: torch.eye(D)),
            ("I / D scales by 1/D; the scaled dot score divides by √D: I / √D.", lambda: torch.eye(D) / D),
            ("A matrix of ones adds up every pair q_a k_b; the dot product only pairs equal indices: "
             "use a (scaled) identity.", lambda: torch.ones(D, D) / math.sqrt(D)),
        ])


@_part(BED, "check")
def _(fn, gen):
    D = 6
    W = _call(fn, D)
    if not isinstance(W, Tensor) or tuple(W.shape) != (D, D):
        raise _Wrong(f"For D={D} expected a (D, D) tensor; got {getattr(W, 'shape', type(W).__name__)}.")
    q, k = _randn(gen, 2, 3, D), _randn(gen, 2, 4, D)
    got = _bs_ref(q, W.float(), k)
    ref = _scores_module("ScaledDotScore")(q, k)
    if not _same(got, ref):
        raise _Wrong("With your weight the bilinear score differs from the scaled dot score on random "
                     "queries and keys.")


AS = _exercise("additive_score",
               "fn(queries (B, L, Dq), keys (B, S, Dk), W_q (Dh, Dq), W_k (Dh, Dk), v (Dh,)) -> scores "
               "(B, L, S), scores[b, i, j] = v · tanh(W_q q_i + W_k k_j) (Bahdanau's additive score, "
               "no bias; weights stored (out, in) as in nn.Linear).")


def _as_ref(queries, keys, W_q, W_k, v):
    Dh, Dq = W_q.shape
    score = _scores_module("AdditiveScore", Dq, W_k.shape[1], Dh)
    with torch.no_grad():
        score.query_proj.weight.copy_(W_q)
        score.key_proj.weight.copy_(W_k)
        score.key_proj.bias.zero_()
        score.v.weight.copy_(v[None, :])
        return score(queries, keys)  # (B, L, S)


def _as_case(fn, queries, keys, W_q, W_k, v):
    ref = _as_ref(queries, keys, W_q, W_k, v)
    q = (queries @ W_q.T)[:, :, None, :]  # (B, L, 1, Dh)
    k = (keys @ W_k.T)[:, None, :, :]  # (B, 1, S, Dh)
    variants = [
        ("You left out the tanh: the score is vᵀ tanh(W_q q + W_k k); without it the score is linear "
         "and adds nothing to a dot product.", lambda: (q + k) @ v),
        ("You applied the weights as x @ W; with weights stored (out, in) as in nn.Linear it is "
         "x @ W.T.", lambda: torch.tanh((queries @ W_q)[:, :, None] + (keys @ W_k)[:, None]) @ v),
        ("You returned the scores key-by-query (B, S, L): the rows must be the queries.",
         lambda: ref.transpose(1, 2)),
        ("You multiplied the projected query and key; the additive score ADDS them before the tanh.",
         lambda: torch.tanh(q * k) @ v),
        ("You used ReLU; Bahdanau's additive score uses tanh.", lambda: torch.relu(q + k) @ v),
        ("You applied a softmax: this function returns the raw scores.", lambda: torch.softmax(ref, -1)),
    ]
    out = _call(fn, queries.clone(), keys.clone(), W_q.clone(), W_k.clone(), v.clone(),
                hints=lambda e: (_matmul_hint(e) or
                                 "Check the weight shapes: W_q is (Dh, Dq), so project with queries @ W_q.T."))
    _compare(out, ref, "scores", variants)


@_part(AS, "values")
def _(fn, gen):
    _as_case(fn, _randn(gen, 2, 3, 4), _randn(gen, 2, 5, 6), _randn(gen, 7, 4), _randn(gen, 7, 6),
             _randn(gen, 7))


@_part(AS, "square")
def _(fn, gen):
    _as_case(fn, _randn(gen, 2, 4, 5), _randn(gen, 2, 6, 5), _randn(gen, 5, 5), _randn(gen, 5, 5),
             _randn(gen, 5))


@_part(AS, "one_query")
def _(fn, gen):
    _as_case(fn, _randn(gen, 3, 1, 3), _randn(gen, 3, 4, 2), _randn(gen, 6, 3), _randn(gen, 6, 2),
             _randn(gen, 6))


AC = _exercise("additive_concat",
               "fn(W_q (Dh, Dq), W_k (Dh, Dk)) -> W (Dh, Dq + Dk) such that W @ concat(q, k) = "
               "W_q @ q + W_k @ k (the concatenated form of the additive score).")


@_part(AC, "values")
def _(fn, gen):
    W_q, W_k = _randn(gen, 5, 3), _randn(gen, 5, 4)
    ref = torch.cat([W_q, W_k], dim=1)  # (Dh, Dq + Dk)
    out = _call(fn, W_q.clone(), W_k.clone(), hints=lambda e: (
        "torch.cat needs equal sizes in every other dim: W_q and W_k have the same number of rows Dh, "
        "so put them side by side along dim=1." if "Sizes of tensors must match" in str(e) else None))
    _compare(out, ref, "W", [
        ("The blocks are in the wrong order: [q; k] puts the query first, so W = [W_q, W_k].",
         lambda: torch.cat([W_k, W_q], dim=1)),
        ("You stacked the blocks along dim 0 (more rows); they go side by side along dim 1, one column per "
         "input feature.", lambda: torch.cat([W_q, W_k], dim=0)),
    ])


@_part(AC, "check")
def _(fn, gen):
    W_q, W_k = _randn(gen, 4, 2), _randn(gen, 4, 6)
    W = _call(fn, W_q.clone(), W_k.clone())
    q, k = _randn(gen, 2), _randn(gen, 6)
    if not isinstance(W, Tensor) or tuple(W.shape) != (4, 8):
        raise _Wrong(f"Expected W of shape (Dh, Dq + Dk) = (4, 8); got {getattr(W, 'shape', type(W).__name__)}.")
    if not _same(W @ torch.cat([q, k]), W_q @ q + W_k @ k):
        raise _Wrong("W @ [q; k] differs from W_q q + W_k k: check the order of the blocks.")


SPC = _exercise("score_parameter_count",
                "fn(Dq, Dk, Dh) -> dict {'dot': int, 'scaled_dot': int, 'bilinear': int, 'additive': int}: "
                "the number of learned parameters of each score as the package defines it "
                "(AdditiveScore: W_q without bias, W_k with bias, v).")


def _spc_get(fn, Dq, Dk, Dh, name):
    ans = _call(fn, Dq, Dk, Dh)
    if not isinstance(ans, dict) or name not in ans:
        raise _Wrong(f"Your function returned {ans!r:.80}; expected a dict with the keys 'dot', "
                     "'scaled_dot', 'bilinear', 'additive'.")
    return ans[name]


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@_part(SPC, "dot")
def _(fn, gen):
    for name, cls in (("dot", "DotScore"), ("scaled_dot", "ScaledDotScore")):
        _check_int(_spc_get(fn, 4, 4, 3, name), _count(_scores_module(cls)), f"{name!r}", [
            ("The dot score has no weights at all; and the scale 1/√E is a fixed number, not learned.", 1),
        ])


@_part(SPC, "bilinear")
def _(fn, gen):
    for Dq, Dk, Dh in ((4, 6, 3), (5, 5, 2)):
        _check_int(_spc_get(fn, Dq, Dk, Dh, "bilinear"), _count(_scores_module("BilinearScore", Dq, Dk)),
                   f"'bilinear' with Dq={Dq}, Dk={Dk}", [
                       ("W has shape (Dq, Dk): Dq·Dk entries, not Dq + Dk.", Dq + Dk),
                       ("W has shape (Dq, Dk): it does not depend on Dh.", Dq * Dh),
                   ])


@_part(SPC, "additive")
def _(fn, gen):
    for Dq, Dk, Dh in ((4, 6, 3), (2, 2, 5)):
        ref = _count(_scores_module("AdditiveScore", Dq, Dk, Dh))
        _check_int(_spc_get(fn, Dq, Dk, Dh, "additive"), ref, f"'additive' with Dq={Dq}, Dk={Dk}, Dh={Dh}", [
            ("You forgot the bias of W_k (Dh numbers).", ref - Dh),
            ("You forgot v (Dh numbers).", ref - Dh),
            ("You forgot both the bias and v.", ref - 2 * Dh),
            ("You counted a bias for W_q too; the package has only one (in W_k).", ref + Dh),
        ])


SW = _exercise("score_widths",
               "answer: the set of score names among {'dot', 'scaled_dot', 'bilinear', 'additive'} that "
               "accept queries and keys of different widths (Dq != Dk); part 'can' checks none is "
               "missing, part 'cannot' that none is wrongly included.")


def _sw_sets(answer) -> tuple[set, set]:
    try:
        got = {str(a).strip().lower() for a in answer}
    except TypeError:
        raise _Wrong(f"Your answer is {answer!r:.60}; expected a set of names such as {{'dot'}}.") from None
    if not got:
        raise _Wrong("Your answer is empty: put in it the names of the scores that accept Dq != Dk.")
    ref = set()
    q, k = torch.zeros(1, 2, 3), torch.zeros(1, 4, 5)
    for name, make in (("dot", lambda: _scores_module("DotScore")),
                       ("scaled_dot", lambda: _scores_module("ScaledDotScore")),
                       ("bilinear", lambda: _scores_module("BilinearScore", 3, 5)),
                       ("additive", lambda: _scores_module("AdditiveScore", 3, 5, 4))):
        try:
            make()(q, k)
            ref.add(name)
        except ValueError:
            pass
    return got, ref


@_part(SW, "can")
def _(answer, gen):
    got, ref = _sw_sets(answer)
    notes = [{"bilinear": "'bilinear' can: W has shape (Dq, Dk), it maps one width to the other",
              "additive": "'additive' can: W_q and W_k project both into the same hidden width Dh"}[name]
             for name in sorted(ref - got)]
    if notes:
        raise _Wrong("Not quite: " + "; ".join(notes) + ".")


@_part(SW, "cannot")
def _(answer, gen):
    got, ref = _sw_sets(answer)
    notes = [f"{name!r} cannot: a dot product pairs the i-th entry of q with the i-th entry of k, so both "
             "need the same width" if "dot" in name else f"{name!r} is not a score name here"
             for name in sorted(got - ref)]
    if notes:
        raise _Wrong("Not quite: " + "; ".join(notes) + ".")


# --------------------------------------------------------------------------------------------
# Queries, keys and values; self-attention
# --------------------------------------------------------------------------------------------

QKV = _exercise("qkv_projection",
                "fn(x (B, L, E), W_q (D, E), W_k (D, E), W_v (Dv, E)) -> (q (B, L, D), k (B, L, D), "
                "v (B, L, Dv)), each weight applied as in nn.Linear without bias: x @ W.T.")


def _qkv_case(fn, x, W_q, W_k, W_v):
    refs = (x @ W_q.T, x @ W_k.T, x @ W_v.T)
    out = _call(fn, x.clone(), W_q.clone(), W_k.clone(), W_v.clone(), hints=lambda e: (
        "nn.Linear stores its weight as (out, in): project with `x @ W.T`." if "shapes cannot be multiplied"
        in str(e) or "size of tensor" in str(e) or "size mismatch" in str(e) else None))
    if not (isinstance(out, (tuple, list)) and len(out) == 3):
        raise _Wrong(f"Your function returned {type(out).__name__}; expected three tensors (q, k, v).")
    for name, got, ref, W in zip("qkv", out, refs, (W_q, W_k, W_v)):
        others = [(f"Your {name} is the projection with another weight: {name} = x @ W_{o}.T.",
                   lambda r=r: r) for o, r in zip("qkv", refs) if o != name]
        _compare(got, ref, name, [
            (f"You computed {name} as x @ W_{name}; nn.Linear stores (out, in), so it is x @ W_{name}.T.",
             lambda W=W: x @ W),
            (f"You returned x itself for {name}: project it with W_{name}.", lambda: x),
            *others,
        ])


@_part(QKV, "shapes")
def _(fn, gen):
    _qkv_case(fn, _randn(gen, 2, 5, 6), _randn(gen, 4, 6), _randn(gen, 4, 6), _randn(gen, 3, 6))


@_part(QKV, "square")
def _(fn, gen):
    _qkv_case(fn, _randn(gen, 2, 4, 5), _randn(gen, 5, 5), _randn(gen, 5, 5), _randn(gen, 5, 5))


SA = _exercise("self_attention",
               "fn(x (B, L, E), W_q (D, E), W_k (D, E), W_v (Dv, E), mask=None (bool, broadcastable to "
               "(B, L, L), True = may attend)) -> output (B, L, Dv): scaled dot-product attention of the "
               "projections q = x @ W_q.T, k = x @ W_k.T, v = x @ W_v.T.")


def _sa_case(fn, x, Ws, mask):
    q, k, v = (x @ W.T for W in Ws)
    ref = attention(q, k, v, mask)[0]
    full = mask if mask is not None else torch.ones(x.shape[0], x.shape[1], x.shape[1], dtype=torch.bool)
    variants = [
        ("You attended over x itself: first project it, q = x @ W_q.T, k = x @ W_k.T, v = x @ W_v.T.",
         lambda: attention(x, x, x, mask)[0]),
        ("You projected the values with W_k (or the keys with W_v): v = x @ W_v.T.",
         lambda: attention(q, v, k, mask)[0]),
        ("You used the same projection for queries and keys; each has its own weight.",
         lambda: attention(q, q, v, mask)[0]),
        *_sdpa_variants(q, k, v, full),
    ]
    extra = () if mask is None else (mask.clone(),)
    out = _call(fn, x.clone(), *(W.clone() for W in Ws), *extra, hints=_matmul_hint)
    _compare(out, ref, "output", variants)


@_part(SA, "values")
def _(fn, gen):
    _sa_case(fn, _randn(gen, 2, 5, 6), (_randn(gen, 4, 6), _randn(gen, 4, 6), _randn(gen, 3, 6)), None)


@_part(SA, "mask")
def _(fn, gen):
    _sa_case(fn, _randn(gen, 2, 5, 6), (_randn(gen, 4, 6), _randn(gen, 4, 6), _randn(gen, 3, 6)),
             causal_mask(5))


# --------------------------------------------------------------------------------------------
# Attention at scale: online softmax and KV-cache size
# --------------------------------------------------------------------------------------------

OSM = _exercise("online_softmax_merge",
                "fn(state_a, state_b) -> state: merge two partial results of attention over two blocks "
                "of keys; a state is (m (..., L) the running max score, l (..., L) the sum of "
                "exp(score - m), acc (..., L, Dv) the sum of exp(score - m) · value). A block with no "
                "key has m = -inf, l = 0, acc = 0; merging with it must not produce NaN.")


def _osm_state(scores, mask, v):
    """Partial state of a block: scores (..., L, Sb), mask (..., L, Sb), v (..., Sb, Dv)."""
    s = scores.masked_fill(~mask, float("-inf"))
    m = s.amax(-1)  # (..., L)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m_safe[..., None])  # (..., L, Sb)
    return m, p.sum(-1), p @ v  # (..., L), (..., L), (..., L, Dv)


def _osm_ref(a, b):
    (m1, l1, o1), (m2, l2, o2) = a, b
    m = torch.maximum(m1, m2)  # (..., L)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    c1, c2 = torch.exp(m1 - m_safe), torch.exp(m2 - m_safe)  # (..., L)
    return m, c1 * l1 + c2 * l2, c1[..., None] * o1 + c2[..., None] * o2


def _osm_variants(a, b):
    (m1, l1, o1), (m2, l2, o2) = a, b
    m = torch.maximum(m1, m2)
    c1, c2 = torch.exp(m1 - m), torch.exp(m2 - m)
    return [
        ("You added the two partial sums without rescaling them: each was computed relative to its own "
         "max, so multiply block a's l and acc by exp(m_a - m) and block b's by exp(m_b - m), "
         "m = max(m_a, m_b).", lambda: (m, l1 + l2, o1 + o2)),
        ("You rescaled l but not acc: acc is a sum of exp(score - m) · value too, so it needs the same "
         "factors exp(m_a - m) and exp(m_b - m).", lambda: (m, c1 * l1 + c2 * l2, o1 + o2)),
        ("The factors are the wrong way round: block a is rescaled by exp(m_a - m), which is at most 1.",
         lambda: (m, l1 / c1 + l2 / c2, o1 / c1[..., None] + o2 / c2[..., None])),
        ("Merging with an empty block (m = -inf) gives NaN: exp(-inf - (-inf)) is NaN. When m is -inf, "
         "use 0 in its place before subtracting.", lambda: (m, c1 * l1 + c2 * l2,
                                                            c1[..., None] * o1 + c2[..., None] * o2)),
    ]


def _osm_compare(out, ref, variants):
    if not (isinstance(out, (tuple, list)) and len(out) == 3):
        raise _Wrong(f"Your function returned {type(out).__name__}; expected a state (m, l, acc).")
    named = None
    for cand_msg, make in variants:
        try:
            cand = make()
        except Exception:
            continue
        if all(_same(x, y) for x, y in zip(out, cand)) and not all(_same(x, y) for x, y in zip(out, ref)):
            named = cand_msg
            break
    for name, got, want in zip(("m", "l", "acc"), out, ref):
        try:
            _compare(got, want, name)
        except _Wrong as wrong:
            raise _Wrong(named or str(wrong)) from None


def _osm_blocks(gen, L=3, S1=4, S2=5, Dv=2, empty_b=False):
    scores = _randn(gen, 2, L, S1 + S2) * 3
    mask = _rand_mask(gen, 2, L, S1 + S2)
    v = _randn(gen, 2, S1 + S2, Dv)
    if empty_b:
        mask[..., S1:] = False  # block b has no key at all
        mask[0, 0] = False  # and query 0 of batch 0 has no key in either block
    a = _osm_state(scores[..., :S1], mask[..., :S1], v[:, :S1])
    b = _osm_state(scores[..., S1:], mask[..., S1:], v[:, S1:])
    return scores, mask, v, a, b


@_part(OSM, "values")
def _(fn, gen):
    _, _, _, a, b = _osm_blocks(gen)
    out = _call(fn, tuple(t.clone() for t in a), tuple(t.clone() for t in b))
    _osm_compare(out, _osm_ref(a, b), _osm_variants(a, b))


@_part(OSM, "empty_block")
def _(fn, gen):
    _, _, _, a, b = _osm_blocks(gen, empty_b=True)
    out = _call(fn, tuple(t.clone() for t in a), tuple(t.clone() for t in b))
    _osm_compare(out, _osm_ref(a, b), _osm_variants(a, b))


@_part(OSM, "attention")
def _(fn, gen):
    scores, mask, v, a, b = _osm_blocks(gen, L=4, S1=3, S2=6, Dv=3)
    out = _call(fn, tuple(t.clone() for t in a), tuple(t.clone() for t in b))
    if not (isinstance(out, (tuple, list)) and len(out) == 3 and all(isinstance(t, Tensor) for t in out)):
        raise _Wrong(f"Your function returned {type(out).__name__}; expected a state (m, l, acc).")
    m, l, o = out
    ref = masked_softmax(scores, mask) @ v  # (B, L, Dv): attention over all keys at once
    try:
        got = o / l[..., None]
    except Exception as exc:
        raise _Wrong(f"acc / l failed on your state: {type(exc).__name__}: {exc}") from None
    named = _match(got, [(msg, (lambda mk=mk: (lambda s: s[2] / s[1][..., None])(mk())))
                         for msg, mk in _osm_variants(a, b)])
    _compare(got, ref, "attention output acc / l", [(named, lambda: got)] if named else [])


KVB = _exercise("kv_cache_bytes",
                "fn(B, H, S, D, num_layers, dtype) -> int: the bytes a KV cache needs to hold S positions "
                "of keys AND values for every layer, each (B, H, S, D) of dtype `dtype`.")


@_part(KVB, "float32")
def _(fn, gen):
    _kvb_cases(fn, ((1, 4, 16, 8, 2, torch.float32), (2, 3, 7, 5, 4, torch.float32)))


@_part(KVB, "half")
def _(fn, gen):
    _kvb_cases(fn, ((2, 8, 128, 64, 12, torch.float16), (3, 2, 10, 4, 1, torch.bfloat16)))


def _kvb_cases(fn, cases):
    from .efficient import KVCache
    for B, H, S, D, layers, dtype in cases:
        cache = KVCache(B, H, S, D, dtype=dtype, device="cpu")
        keys, values = cache.append(torch.zeros(B, H, S, D, dtype=dtype), torch.zeros(B, H, S, D, dtype=dtype))
        per_layer = (keys.numel() + values.numel()) * keys.element_size()
        ref = per_layer * layers
        item = torch.tensor([], dtype=dtype).element_size()
        _check_int(_call(fn, B, H, S, D, layers, dtype), ref,
                   f"B={B}, H={H}, S={S}, D={D}, num_layers={layers}, dtype={dtype}", [
                       ("You counted the keys only: the cache stores keys AND values, twice as much.", ref // 2),
                       ("You forgot the number of layers: every layer keeps its own cache.", per_layer),
                       ("You counted elements, not bytes: multiply by the size of one element "
                        "(`torch.tensor([], dtype=dtype).element_size()`).", ref // item),
                       ("You counted bits: one byte is 8 bits.", ref * 8),
                       ("You assumed 4 bytes per element; float16 and bfloat16 take 2.",
                        ref // item * 4 if item != 4 else -1),
                   ])
