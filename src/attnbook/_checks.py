"""Argument checks shared by the whole package, so that each public function shows its idea first.

One kind of mistake, one exception type, everywhere:

* ``TypeError``: the argument has the wrong type or dtype (a list for a tensor, a float for an int,
  integer scores, a float mask of another dtype, the string ``"float32"`` for a dtype);
* ``ValueError``: the type is right but the shape or value is not (a 2-D tensor where 3-D is
  needed, widths that differ, ``num_heads=0``, a token id outside the vocabulary, ``dim=5``).

Every message names the function, the argument, what it got and what was expected. These helpers
are private: the public functions call them with their own names (``where``).

Shapes:
    B batch, H heads, L queries, S keys/values, D query/key width per head, Dv value width.
"""

from __future__ import annotations

import math
from numbers import Real

import torch
from torch import Tensor

__all__: list[str] = []  # private: import the module, not names from it


def shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def described(value: object) -> str:
    """A short description of what a caller passed: a tensor's shape and dtype, else its type."""
    if isinstance(value, Tensor):
        return f"a {value.dtype} tensor of shape {shape(value)}"
    return f"{type(value).__name__} {value!r}" if isinstance(value, (int, float, str)) else type(value).__name__


def broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape that ``shapes`` broadcast to, as PyTorch broadcasts, or None if they do not.
    (``torch.broadcast_shapes`` does the same in Python, several times slower.)"""
    result: list[int] = []
    for sizes in zip(*(((1,) * (max(map(len, shapes)) - len(s)) + tuple(s)) for s in shapes)):
        others = {n for n in sizes if n != 1}
        if len(others) > 1:
            return None
        result.append(others.pop() if others else 1)
    return tuple(result)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ----------------------------------------------------------------------------- numbers and flags
def positive_int(where: str, name: str, value: object) -> int:
    """``value`` if it is an int > 0; TypeError for a non-int, ValueError for an int <= 0."""
    if not _is_int(value):
        raise TypeError(f"{where}: `{name}` must be a positive int; got {described(value)}")
    if value <= 0:
        raise ValueError(f"{where}: `{name}` must be a positive int; got {value}")
    return value


def nonnegative_int(where: str, name: str, value: object) -> int:
    """``value`` if it is an int >= 0; TypeError for a non-int, ValueError for a negative int."""
    if not _is_int(value):
        raise TypeError(f"{where}: `{name}` must be an int >= 0; got {described(value)}")
    if value < 0:
        raise ValueError(f"{where}: `{name}` must be an int >= 0; got {value}")
    return value


def flag(where: str, name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{where}: `{name}` must be a bool; got {described(value)}")
    return value


def probability(where: str, name: str, value: object) -> float:
    """A dropout probability in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{where}: `{name}` must be a number in [0, 1); got {described(value)}")
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{where}: `{name}` must be a number in [0, 1); got {value!r}")
    return float(value)


def scale(where: str, value: object, width: int) -> float:
    """The score scale: ``value`` if it is a finite real number, else 1/sqrt(width) for None
    (1 for width 0, where every score is 0 anyway)."""
    if value is None:
        return 1.0 / math.sqrt(width) if width else 1.0
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{where}: `scale` must be a real number or None; got {described(value)}")
    if not math.isfinite(value):
        raise ValueError(f"{where}: `scale` must be finite; got {value!r}")
    return float(value)


def one_of(where: str, name: str, value: object, choices: tuple) -> object:
    if value not in choices:
        raise ValueError(f"{where}: `{name}` must be one of {choices}; got {value!r}")
    return value


def dim(where: str, name: str, value: object, ndim: int) -> int:
    """A dimension index valid for a tensor of ``ndim`` dims (negative counts from the end)."""
    if not _is_int(value):
        raise TypeError(f"{where}: `{name}` must be an int; got {described(value)}")
    if not -max(ndim, 1) <= value < max(ndim, 1):
        raise ValueError(
            f"{where}: `{name}`={value} is out of range for a tensor of {ndim} dims "
            f"(expected {-ndim}..{ndim - 1})"
        )
    return value


# ----------------------------------------------------------------------------- devices and dtypes
def device(where: str, name: str, value: object) -> torch.device | None:
    """None, a ``torch.device``, or a string or index that names one (``"cpu"``, ``"cuda:0"``)."""
    if value is None or isinstance(value, torch.device):
        return value
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise TypeError(f"{where}: `{name}` must be a torch.device, a string such as 'cpu', or None; "
                        f"got {described(value)}")
    try:
        result = torch.device(value)
    except RuntimeError:
        raise ValueError(
            f"{where}: `{name}`={value!r} is not a device PyTorch knows; use 'cpu', 'cuda', 'cuda:0', 'mps', ..."
        ) from None
    try:
        torch.empty(0, device=result)
    except (RuntimeError, AssertionError):
        raise ValueError(f"{where}: `{name}`={value!r} is not available on this machine") from None
    return result


def floating_dtype(where: str, name: str, value: object) -> torch.dtype | None:
    """None or a floating ``torch.dtype`` (``torch.float32``, not the string ``"float32"``)."""
    if value is None:
        return None
    if not isinstance(value, torch.dtype):
        hint = f" (write torch.{value})" if isinstance(value, str) and hasattr(torch, value) else ""
        raise TypeError(f"{where}: `{name}` must be a torch.dtype such as torch.float32 or None; "
                        f"got {described(value)}{hint}")
    if not value.is_floating_point:
        raise TypeError(f"{where}: `{name}` must be a floating dtype (float16, bfloat16, float32, float64); "
                        f"got {value}")
    return value


# ----------------------------------------------------------------------------- tensors
def tensor(where: str, name: str, value: object, *, letters: str | None = None, floating: bool = False,
           min_ndim: int = 0) -> Tensor:
    """``value`` if it is a tensor (floating if asked) with ``len(letters)`` dims (or at least
    ``min_ndim``); ``letters`` such as "B, L, E" also name the expected shape in the message."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{where}: `{name}` must be a tensor; got {described(value)}")
    if letters is not None and value.dim() != len(letters.split(",")):
        raise ValueError(f"{where}: `{name}` must be {len(letters.split(','))}-D ({letters}); "
                         f"got shape {shape(value)}")
    if value.dim() < min_ndim:
        raise ValueError(f"{where}: `{name}` must have at least {min_ndim} dims; got shape {shape(value)}")
    if floating and not value.dtype.is_floating_point:
        raise TypeError(f"{where}: `{name}` must be floating point; got dtype {value.dtype}")
    return value


def same_dtype(where: str, names: str, *tensors: Tensor) -> None:
    if len({t.dtype for t in tensors}) > 1:
        dtypes = ", ".join(str(t.dtype) for t in tensors)
        raise TypeError(f"{where}: {names} must share one dtype; got {dtypes}")


def broadcasts_to(where: str, name: str, t: Tensor, target: tuple[int, ...], target_text: str, hint: str = "") -> None:
    """Raise a ValueError unless ``t`` broadcasts to exactly ``target`` (described as ``target_text``)."""
    if broadcast(tuple(t.shape), tuple(target)) != tuple(target):
        raise ValueError(f"{where}: `{name}` of shape {shape(t)} does not broadcast to {target_text} = "
                         f"{tuple(target)}{hint}")


def mask(where: str, name: str, value: object, scores_shape: tuple[int, ...], dtype: torch.dtype | None,
         scores_text: str = "the scores' shape (..., L, S)") -> None:
    """A mask for scores of ``scores_shape``: bool (True = may attend) or floating of ``dtype``
    (added to the scores); None passes. ``dtype=None`` allows bool masks only."""
    if value is None:
        return
    kinds = "a bool tensor (True = may attend)" + ("" if dtype is None else " or a floating tensor (added to the scores)")
    if not isinstance(value, Tensor):
        raise TypeError(f"{where}: `{name}` must be {kinds} or None; got {described(value)}")
    if value.dtype != torch.bool:
        if dtype is None or not value.dtype.is_floating_point:
            raise TypeError(f"{where}: `{name}` must be {kinds}; got dtype {value.dtype}")
        if value.dtype != dtype:
            raise TypeError(f"{where}: a floating `{name}` must have the inputs' dtype {dtype} (or be bool, "
                            f"True = may attend); got {value.dtype}")
    hint = ""
    if value.dim() == 2 and len(scores_shape) >= 3 and tuple(value.shape) == (scores_shape[0], scores_shape[-1]):
        hint = " (a 2-D mask is (L, S); pass a (B, S) padding mask as `key_mask`)"
    broadcasts_to(where, name, value, scores_shape, scores_text, hint)


def combinable_masks(where: str, masks: tuple) -> list[Tensor]:
    """The masks that are not None, if each is a bool or floating tensor and they broadcast together."""
    present: list[Tensor] = []
    for index, value in enumerate(masks):
        if value is None:
            continue
        name = f"masks[{index}]"
        if not isinstance(value, Tensor) or not (value.dtype == torch.bool or value.dtype.is_floating_point):
            raise TypeError(f"{where}: `{name}` must be a bool tensor (True = may attend), a floating "
                            f"tensor (added to the scores) or None; got {described(value)}")
        if present and broadcast(*(shape(m) for m in present), shape(value)) is None:
            raise ValueError(f"{where}: `{name}` of shape {shape(value)} does not broadcast with "
                             f"the masks before it, of shapes {[shape(m) for m in present]}")
        present.append(value)
    return present


def key_mask(where: str, value: object, scores_shape: tuple[int, ...]) -> None:
    """``key_mask``: bool, True on real keys, shaped (B, S) (or (..., S) whose leading dims are the
    scores' first leading dims, or (S,))."""
    if value is None:
        return
    if not isinstance(value, Tensor):
        raise TypeError(f"{where}: `key_mask` must be a bool tensor (True = a real key) or None; "
                        f"got {described(value)}")
    if value.dtype != torch.bool:
        raise TypeError(f"{where}: `key_mask` must be bool (True = a real key, False = padding); "
                        f"got dtype {value.dtype}")
    lead, S = scores_shape[:-2], scores_shape[-1]
    ok = value.dim() >= 1 and value.shape[-1] in (1, S) and value.dim() - 1 <= len(lead)
    if ok:
        given = tuple(value.shape[:-1])
        ok = broadcast(given, tuple(lead[: len(given)])) == tuple(lead[: len(given)])
    if not ok:
        expected = f"({lead[0]}, {S})" if lead else f"({S},)"
        raise ValueError(f"{where}: `key_mask` must have shape (B, S) = {expected}; got {shape(value)}")


def attention_inputs(where: str, q: object, k: object, v: object) -> tuple[int, ...]:
    """Check query, key and value of scaled dot-product attention; return the scores' shape (..., L, S)."""
    for name, t in (("query", q), ("key", k), ("value", v)):
        tensor(where, name, t, floating=True, min_ndim=2)
    same_dtype(where, "`query`, `key` and `value`", q, k, v)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"{where}: `query` and `key` must have the same width D; got query {shape(q)} "
                         f"(D={q.shape[-1]}) and key {shape(k)} (D={k.shape[-1]})")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"{where}: `key` and `value` must have the same length S; got key {shape(k)} "
                         f"(S={k.shape[-2]}) and value {shape(v)} (S={v.shape[-2]})")
    lead = broadcast(tuple(q.shape[:-2]), tuple(k.shape[:-2]), tuple(v.shape[:-2]))
    if lead is None:
        raise ValueError(f"{where}: the leading dims of `query` {shape(q)}, `key` {shape(k)} and "
                         f"`value` {shape(v)} do not broadcast")
    return (*lead, q.shape[-2], k.shape[-2])


def attention_call(where: str, q, k, v, attn_mask, padding, is_causal, scale_value, dropout_p
                   ) -> tuple[tuple[int, ...], float]:
    """Check the arguments of an attention function (query, key, value, ``mask``, ``key_mask``,
    ``is_causal``, ``scale``, ``dropout_p``); return the scores' shape (..., L, S) and the scale."""
    scores_shape = attention_inputs(where, q, k, v)
    mask(where, "mask", attn_mask, scores_shape, q.dtype)
    key_mask(where, padding, scores_shape)
    flag(where, "is_causal", is_causal)
    probability(where, "dropout_p", dropout_p)
    return scores_shape, scale(where, scale_value, q.shape[-1])


def token_ids(where: str, name: str, value: object, vocab_size: int) -> Tensor:
    """A (B, L) tensor of integer token ids in 0..vocab_size-1."""
    if not isinstance(value, Tensor):
        raise TypeError(f"{where}: `{name}` must be a tensor of token ids; got {described(value)}")
    if value.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{where}: `{name}` must hold integer token ids (torch.long); got dtype {value.dtype}")
    if value.dim() != 2:
        raise ValueError(f"{where}: `{name}` must be 2-D (B, L); got shape {shape(value)}")
    if value.numel():
        low, high = int(value.min()), int(value.max())
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise ValueError(f"{where}: `{name}` holds the id {bad}, outside the vocabulary of "
                             f"vocab_size={vocab_size} (ids 0..{vocab_size - 1})")
    return value


# ----------------------------------------------------------------------------- models, tasks, training
# (used by attnbook.models, attnbook.tasks and attnbook.train)
def instance(where: str, name: str, value: object, kind: type | tuple[type, ...], what: str) -> object:
    """``value`` if it is an instance of ``kind`` (described to the reader as ``what``)."""
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise TypeError(f"{where}: `{name}` must be {what}; got {described(value)}")
    return value


def integer(where: str, name: str, value: object) -> int:
    """``value`` if it is an int (any sign, not a bool), such as a seed."""
    return instance(where, name, value, int, "an int")


def positive_number(where: str, name: str, value: object) -> float:
    """``value`` if it is a finite real number > 0 (a learning rate, a clipping norm)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{where}: `{name}` must be a positive finite number; got {described(value)}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{where}: `{name}` must be a positive finite number; got {value!r}")
    return value


def in_range(where: str, name: str, value: object, low: object, high: object, *, kind: type = int,
             what: str = "an int", why: str = "") -> object:
    """``value`` if it is a ``kind`` (an int unless told) in ``low..high``; ``why`` explains the bounds."""
    instance(where, name, value, kind, f"{what} in {low}..{high}{why}")
    if not low <= value <= high:
        raise ValueError(f"{where}: `{name}` must be {what} in {low}..{high}{why}; got {value!r}")
    return value


def subset(where: str, name: str, values: object, choices: tuple) -> tuple:
    """``values`` as a tuple, if it is a non-empty collection of names from ``choices``."""
    values = tuple(values) if isinstance(values, (list, tuple)) else (values,)
    if not values or any(v not in choices for v in values):
        raise ValueError(f"{where}: `{name}` must be names from {sorted(choices)}; got {list(values)}")
    return values


def size(where: str, name: str, t: Tensor, dim: int, expected: int, what: str) -> None:
    """Raise a ValueError unless ``t.shape[dim] == expected``; ``what`` names that size for the reader
    (``"the batch size B of `src`"``, ``"the width E"``)."""
    if t.shape[dim] != expected:
        raise ValueError(f"{where}: `{name}` must have {what} = {expected} (dim {dim}); got shape {shape(t)}")


def length(where: str, name: str, tokens: Tensor, low: int, high: int, why: str = "") -> None:
    """Raise a ValueError unless the sequences ``tokens`` (B, L) hold ``low..high`` positions each."""
    if not low <= tokens.shape[-1] <= high:
        raise ValueError(f"{where}: `{name}` holds {tokens.shape[-1]} positions per sequence; expected "
                         f"{low}..{high}{why}")


def lengths(where: str, name: str, value: object, B: int, S: int) -> Tensor:
    """The true lengths of B padded sequences of S positions: a long tensor (B,) of ints in 1..S."""
    tensor(where, name, value, letters="B")
    if value.dtype != torch.long:
        raise TypeError(f"{where}: `{name}` must be a long tensor (B,); got dtype {value.dtype}")
    size(where, name, value, 0, B, "one length per sequence, B")
    if B and (int(value.min()) < 1 or int(value.max()) > S):
        raise ValueError(f"{where}: `{name}` must lie in 1..S = 1..{S}; got {value.tolist()}")
    return value


def every_row_has_a_key(where: str, value: Tensor | None) -> None:
    """Raise a ValueError if a row of the (B, S) ``key_mask`` is all False (a source with no real token)."""
    if value is not None and value.numel() and not bool(value.any(dim=-1).all()):
        row = int((~value.any(dim=-1)).nonzero()[0, 0])
        raise ValueError(f"{where}: `key_mask` row {row} is all False: every source needs a real token")


def sequence_of(where: str, name: str, value: object, kind: type, count: int, what: str) -> list:
    """``value`` if it is a list or tuple of ``count`` instances of ``kind`` (``what`` describes it)."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, kind) for v in value):
        raise TypeError(f"{where}: `{name}` must be {what}; got {described(value)}")
    if len(value) != count:
        raise ValueError(f"{where}: `{name}` must hold {count} ({what}); got {len(value)}")
    return list(value)


def paired(where: str, a_name: str, a: object, b_name: str, b: object) -> None:
    """Raise a ValueError unless the collections ``a`` and ``b`` are non-empty and equally long."""
    if len(a) != len(b) or not len(a):
        raise ValueError(f"{where}: `{a_name}` and `{b_name}` must be non-empty and equally long; got "
                         f"{len(a)} and {len(b)}")
