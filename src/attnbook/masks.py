"""Boolean attention masks. Convention everywhere in the book: True means "may attend".

Shapes:
    B batch, L queries, S keys/values.
    padding_mask -> (B, S)
    causal_mask  -> (L, S)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["padding_mask", "causal_mask", "combine_masks", "check_mask"]


def _shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def padding_mask(lengths: Tensor | Sequence[int], max_len: int | None = None) -> Tensor:
    """True where a position holds a real token, False on padding.

    Args:
        lengths: the true length of each sequence, a 1-D integer tensor or a list of ints.
        max_len: the padded length S; defaults to the longest length.

    Shapes:
        lengths (B,) -> mask (B, S)

    >>> padding_mask([3, 1], max_len=4)
    tensor([[ True,  True,  True, False],
            [ True, False, False, False]])
    """
    if not isinstance(lengths, Tensor):
        try:
            lengths = list(lengths)
            lengths = torch.as_tensor(lengths, dtype=torch.long) if not lengths else torch.as_tensor(lengths)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"padding_mask: `lengths` must be a 1-D tensor or a list of ints; got {lengths!r}"
            ) from exc
    if lengths.dtype == torch.bool or lengths.dtype.is_floating_point or lengths.dtype.is_complex:
        raise TypeError(
            f"padding_mask: `lengths` must hold integers; got dtype {lengths.dtype}"
        )
    if lengths.dim() != 1:
        raise ValueError(
            f"padding_mask: `lengths` must be 1-D (B,); got shape {_shape(lengths)}"
        )
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError(
            f"padding_mask: `lengths` must be >= 0; got {lengths.tolist()}"
        )
    longest = int(lengths.max()) if lengths.numel() else 0
    if max_len is None:
        max_len = longest
    if isinstance(max_len, bool) or not isinstance(max_len, int):
        raise TypeError(f"padding_mask: `max_len` must be an int; got {max_len!r}")
    if max_len < 0:
        raise ValueError(f"padding_mask: `max_len` must be >= 0; got {max_len}")
    if longest > max_len:
        raise ValueError(
            f"padding_mask: a length is longer than `max_len`={max_len}; got lengths {lengths.tolist()}"
        )
    positions = torch.arange(max_len, device=lengths.device)  # (S,)
    return positions[None, :] < lengths[:, None]  # (B, S)


def causal_mask(L: int, S: int | None = None, device: torch.device | str | None = None) -> Tensor:
    """True where query i may attend to key j, aligned to the bottom right.

    Query i sees key j when ``j <= i + (S - L)``: the last query sees every key. With L = S this is
    the lower triangle including its diagonal. With one new query and a cache of S keys (L = 1) the
    query sees all S keys. (PyTorch's ``is_causal=True`` aligns to the top left instead when L != S.)

    Shapes:
        -> (L, S)
    """
    if S is None:
        S = L
    for name, value in (("L", L), ("S", S)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"causal_mask: `{name}` must be an int; got {value!r}")
        if value < 0:
            raise ValueError(f"causal_mask: `{name}` must be >= 0; got {value}")
    i = torch.arange(L, device=device)[:, None]  # (L, 1)
    j = torch.arange(S, device=device)[None, :]  # (1, S)
    return j <= i + (S - L)  # (L, S)


def check_mask(mask: Tensor, name: str = "mask", where: str = "combine_masks") -> None:
    """Raise a clear TypeError unless ``mask`` is a boolean tensor."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"{where}: `{name}` must be a bool tensor or None; got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{where}: `{name}` must be a bool tensor (True = may attend); got dtype {mask.dtype}"
        )


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """AND together any number of boolean masks; ``None`` means "no restriction" and is skipped.

    Returns None when every mask is None. The result has the broadcast shape of the inputs.

    >>> combine_masks(None, causal_mask(2), None)
    tensor([[ True, False],
            [ True,  True]])
    """
    result = None
    for index, mask in enumerate(masks):
        if mask is None:
            continue
        check_mask(mask, name=f"masks[{index}]")
        if result is None:
            result = mask
            continue
        try:
            torch.broadcast_shapes(result.shape, mask.shape)
        except RuntimeError as exc:
            raise ValueError(
                f"combine_masks: `masks[{index}]` of shape {_shape(mask)} does not broadcast with "
                f"the masks before it, of shape {_shape(result)}"
            ) from exc
        result = result & mask
    return result
