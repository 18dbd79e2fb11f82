"""Checks of tensors and masks, beneath :mod:`attnbook._checks`, which hands them on (a caller
imports ``_checks`` only, whose rules hold here), with the two helpers every check uses, :func:`that`
and :func:`described`. Shapes are compared as plain tuples (never through ``torch.broadcast_shapes``,
which costs tens of µs); any group of :func:`tensors` first passes a quick comparison, the explaining
checks running only when it fails; a floating mask's values are checked by one reduction. Tensors that
go together are checked by one helper, :func:`tensors`, from their shapes written as in the docstrings
("B, L, E"): one letter is one size in every tensor.

Shapes:
    B batch, H heads, L queries, S keys/values, D query/key width per head, Dv value width.
"""

import math

import torch
from torch import Tensor


def described(value):
    """A short description of what a caller passed: a tensor's shape and dtype, else its type."""
    return (f"a {value.dtype} tensor of shape {tuple(value.shape)}" if isinstance(value, Tensor) else
            f"{type(value).__name__} {value!r}" if isinstance(value, (int, float, str)) else type(value).__name__)


def _broadcast(*shapes):
    """The shape that ``shapes`` (tuples of sizes) broadcast to, or None where they do not: aligned
    from the right, each size is 1 or the one size of its column. Plain Python on the tuples, as
    ``torch.broadcast_shapes`` (which costs tens of µs) would compute it."""
    if shapes and shapes.count(shapes[0]) == len(shapes):  # the usual case: one shape
        return tuple(shapes[0])
    out = [1] * max(map(len, shapes), default=0)
    for shape in shapes:
        for i, size in enumerate(shape, len(out) - len(shape)):
            if size != 1:
                if out[i] != 1 and out[i] != size:
                    return None
                out[i] = size
    return tuple(out)


def that(condition, where, message, error=ValueError):
    """Raise ``error("where: message")`` unless ``condition`` holds (``message`` may be a lambda)."""
    if not condition:
        raise error(f"{where}: {message() if callable(message) else message}")

# ----------------------------------------------------------------------------- tensors and masks
def tensor(where, name, value, letters=None, *, floating=False, min_ndim=0, dtype=None, sizes=()):
    """A tensor: with ``len(letters)`` dims (``letters`` such as "B, L, E" name them in the message)
    or at least ``min_ndim``; floating, or of ``dtype`` (or one in a tuple), if asked; with the
    ``sizes`` given as (dim, size, name) triples, such as ``(-1, E, "embed_dim")`` (None: unchecked)."""
    that(isinstance(value, Tensor), where, lambda: f"`{name}` must be a tensor; got {described(value)}", TypeError)
    ndim = value.dim() if letters is None else letters.count(",") + 1
    that(value.dim() == ndim >= min_ndim, where, lambda: f"`{name}` must " + (f"be {ndim}-D ({letters})" if letters
         else f"have at least {min_ndim} dims") + f"; got shape {tuple(value.shape)}")
    dtypes = dtype if isinstance(dtype, tuple) else (dtype,)
    that(value.dtype in dtypes if dtype else value.dtype.is_floating_point or not floating, where, lambda: f"`{name}` "
         f"must {f'have dtype {dtypes[0]}' if dtype else 'be floating point'}; got dtype {value.dtype}", TypeError)
    for d, size, size_name in sizes:
        that(size in (None, value.shape[d]), where, lambda: f"`{name}` must have {size_name}={size}; got shape "
             f"{tuple(value.shape)}")


_letters = {}  # a shape as written ("..., L, D") -> (its letters, whether leading dims may come first)


def _parse(shape):
    if shape not in _letters:
        _letters[shape] = (tuple(shape.removeprefix("..., ").split(", ")), "..." in shape)
    return _letters[shape]


def _tensors_fit(named, dtype, known):
    """Whether :func:`tensors` passes, computed on the shape tuples alone (its quick path)."""
    seen, first = {}, None
    for t, shape in named.values():
        if not isinstance(t, Tensor):
            return False
        letters, leading = _letters.get(shape) or _parse(shape)
        sizes, n = t.shape, len(letters)
        if len(sizes) != n and not (leading and len(sizes) > n):
            return False
        if first is None:  # the first tensor's dtype, which every other one shares
            first = t.dtype
            if not (first in dtype if isinstance(dtype, tuple) else first == dtype if dtype else
                    first.is_floating_point):
                return False
        elif t.dtype != first:
            return False
        for i, x in enumerate(letters, len(sizes) - n):
            if seen.setdefault(x, sizes[i]) != sizes[i]:
                return False
    for x, (size, _) in known.items():
        if size is not None and seen.get(x, size) != size:
            return False
    return True


def tensors(where, named, *, dtype=None, names=None, **known):
    """Tensors that go together, ``named`` as {name: (tensor, shape)} with shapes written as in the
    docstrings: "B, L, E", or "..., L, D" for any leading dims. Each is a tensor of those dims,
    floating (or of ``dtype``), and all share one dtype. A letter is one size in every tensor;
    ``known`` gives some sizes with the name a message uses, ``E=(8, "embed_dim")``; ``names``
    overrides how a message calls a letter ("width D" and the like). The sizes are compared as
    plain tuples first; only a mistake goes through the checks below, which say what it is."""
    if _tensors_fit(named, dtype, known):
        return
    names, first = {"B": "batch size B", "L": "length L", "S": "length S", "D": "width D", **(names or {})}, {}
    for name, (t, shape) in named.items():
        letters = shape.removeprefix("..., ").split(", ")
        tensor(where, name, t, None if "..." in shape else shape, min_ndim=len(letters), floating=True,
               dtype=dtype, sizes=[(i - len(letters), *known[x]) for i, x in enumerate(letters) if x in known])
        for x, size in zip(letters, t.shape[-len(letters):]):
            other, u, s = first.setdefault(x, (name, t, size))  # the first tensor with a size x
            that(s == size, where, lambda: f"`{other}` and `{name}` must have the same {names.get(x, x)}; got "
                 f"{other} {tuple(u.shape)} ({x}={s}) and {name} {tuple(t.shape)} ({x}={size})")
    that(len({t.dtype for t, _ in named.values()}) == 1, where, lambda: " and ".join(f"`{n}`" for n in named)
         + f" must share one dtype; got {', '.join(str(t.dtype) for t, _ in named.values())}", TypeError)


def _nonfinite(value):
    """How many NaN and +inf a floating tensor holds, in words ("2 NaN and 1 +inf")."""
    counts = {"NaN": int(value.isnan().sum()), "+inf": int(value.isposinf().sum())}
    return " and ".join(f"{n} {kind}" for kind, n in counts.items() if n)


def mask_values(where, name, value):
    """None, a bool mask, or a floating mask whose values are finite or -inf (added to the scores, a
    NaN or a +inf would make a row of weights NaN)."""
    # one reduction: the largest value is below +inf unless the mask holds a NaN (max passes it on) or a +inf
    that(value is None or value.dtype == torch.bool or not value.numel() or value.max().item() < math.inf, where,
         lambda: f"`{name}` must hold finite values or -inf (it is added to the scores; -inf blocks a key); got "
         f"{described(value)} holding {_nonfinite(value)}")


def mask(where, name, value, scores_shape, dtype, text="the scores' shape (..., L, S)"):
    """None, or a mask that broadcasts to ``scores_shape``: bool (True = may attend) or floating of
    ``dtype`` (added to the scores), whose values are finite or -inf (a NaN or a +inf would make a
    row of weights NaN). ``dtype=None`` allows bool masks only."""
    that(value is None or isinstance(value, Tensor) and value.dtype in (torch.bool, dtype), where, lambda: f"`{name}` "
         f"must be a bool tensor (True = may attend){f' or a floating {dtype} one (added)' if dtype else ''} or None; "
         f"got {described(value)}", TypeError)
    mask_values(where, name, value)
    padding = value is not None and value.dim() == 2 and value.shape == (scores_shape[0], scores_shape[-1])
    that(value is None or _broadcast(value.shape, scores_shape) == tuple(scores_shape), where, lambda: f"`{name}` of "
         f"shape {tuple(value.shape)} does not broadcast to {text} = {tuple(scores_shape)}"
         + (" (a 2-D mask is (L, S); pass a (B, S) padding mask as `key_mask`)" if padding else ""))


def key_mask(where, value, scores_shape):
    """None, or a bool padding mask, True on real keys: (B, S), or (S,) for every sequence."""
    that(value is None or isinstance(value, Tensor) and value.dtype == torch.bool, where, lambda: "`key_mask` must "
         f"be a bool tensor (True = a real key, False = padding) or None; got {described(value)}", TypeError)
    lead, S, n = tuple(scores_shape[:-2]), scores_shape[-1], 0 if value is None else value.dim() - 1
    that(value is None or 0 <= n <= len(lead) and value.shape[-1] in (1, S) and _broadcast(value.shape[:-1], lead[:n])
         == lead[:n], where, lambda: f"`key_mask` must have shape (B, S) = {(*lead[:1], S)}; got {tuple(value.shape)}")


def combinable_masks(where, masks):
    """Each mask is None, bool or floating (finite values or -inf), and they broadcast together."""
    shapes = []
    for index, value in enumerate(masks):
        that(value is None or isinstance(value, Tensor) and (value.dtype == torch.bool or value.is_floating_point()),
             where, lambda: f"`masks[{index}]` must be a bool or a floating tensor, or None; got {described(value)}",
             TypeError)
        mask_values(where, f"masks[{index}]", value)
        that(value is None or _broadcast(*shapes, value.shape) is not None, where, lambda: f"`masks[{index}]` of "
             f"shape {tuple(value.shape)} does not broadcast with the masks before it, of shapes {shapes}")
        shapes += [] if value is None else [tuple(value.shape)]
