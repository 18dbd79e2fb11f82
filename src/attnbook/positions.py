"""Positions: self-attention without a mask cannot tell where a token sits (a causal mask leaks some order), so
positions are added to the inputs, or the queries and keys are rotated.

Two common choices add a vector to the inputs: fixed sinusoids (Vaswani et al., 2017) and a
learned table (one trainable vector per position, as in GPT-style models and
:class:`attnbook.models.transformer.TinyTransformer`). Today's models rotate the queries and keys
instead (rotary positions, Su et al., 2021, as in Llama and most models since): :func:`apply_rotary` turns each pair of
coordinates by an angle proportional to the position, so that the score of a query and a key
depends only on how far apart they are.

Shapes:
    L positions, E model width, D per-head width.
    sinusoidal_positions -> (L, E)
    LearnedPositions: x (B, L, E) -> (B, L, E)
    apply_rotary: x (..., L, D), positions (L,) -> (..., L, D), either layout of the pairs
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnbook import _checks as check

__all__ = ["sinusoidal_positions", "LearnedPositions", "apply_rotary"]


def sinusoidal_positions(
    num_positions: int,
    embed_dim: int,
    *,
    base: float = 10000.0,
    offset: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """The fixed sinusoidal position vectors of Vaswani et al. (2017).

    Column pair (2i, 2i+1) of row p holds ``sin(p / base^(2i/E))`` and ``cos(p / base^(2i/E))``:
    each pair turns at its own speed, from one turn every 2π positions down to very slow ones.

    Args:
        num_positions: L, how many positions.
        embed_dim: E, an even width.
        base: the slowest pair turns at ``base^(-(E-2)/E)`` radians per position, close to
            ``1 / base`` only for a wide E.
        offset: the first position (for tokens that follow a cached prefix).

    Shapes:
        -> (L, E)
    """
    where = "sinusoidal_positions"
    check.nonnegative_ints(where, num_positions=num_positions, embed_dim=embed_dim, offset=offset)
    check.that(embed_dim % 2 == 0, where, f"`embed_dim` must be even (sin/cos pairs); got {embed_dim}")
    check.number(where, "base", base, "a number > 1", lambda b: b > 1)
    check.floating_dtype(where, "dtype", dtype)
    check.device(where, "device", device)
    position = torch.arange(offset, offset + num_positions, dtype=torch.float64, device=device)[:, None]  # (L, 1)
    rates = torch.exp(
        -math.log(base) * torch.arange(0, embed_dim, 2, dtype=torch.float64, device=device) / embed_dim
    )  # (E/2,)
    angles = position * rates  # (L, E/2)
    table = torch.stack([angles.sin(), angles.cos()], dim=-1).reshape(num_positions, embed_dim)  # (L, E)
    return table.to(dtype)


class LearnedPositions(nn.Module):
    """A trainable vector per position, added to the inputs.

    Args:
        max_len: the number of positions in the table.
        embed_dim: E.

    Shapes:
        forward: x (B, L, E), offset -> x + table[offset : offset + L], (B, L, E)
    """

    def __init__(self, max_len: int, embed_dim: int) -> None:
        super().__init__()
        check.positive_ints("LearnedPositions", max_len=max_len, embed_dim=embed_dim)
        self.max_len = max_len
        self.table = nn.Embedding(max_len, embed_dim)
        nn.init.normal_(self.table.weight, std=0.02)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """Add the vectors of positions offset .. offset + L - 1.

        Shapes:
            x (B, L, E), offset -> (B, L, E)
        """
        L = x.shape[-2]
        check.that(0 <= offset and offset + L <= self.max_len, "LearnedPositions",
                   lambda: f"positions {offset}..{offset + L - 1} do not fit in max_len={self.max_len}")
        return x + self.table.weight[offset : offset + L]  # (B, L, E)


def apply_rotary(x: Tensor, positions: Tensor,
                 base: float = 10000.0, *,
                 layout: str = "half") -> Tensor:
    """Rotary positions: turn each pair of coordinates of ``x`` by an
    angle that grows with the position.

    Pair n, n = 0 .. D/2 - 1, turns by
    ``angle_n = position · base^(-2n/D)``. Rotating queries and keys
    this way makes their dot product depend on the positions only
    through their offset: a query at p and a key at p - k score as
    they would at any other p with the same k.

    Which coordinates form pair n is a convention; two are in use:

    * ``layout="half"``: coordinates n and n + D/2 (the first half
      of the vector with the second half), as in GPT-NeoX and
      Hugging Face's ``rotate_half``;
    * ``layout="interleaved"``: coordinates 2n and 2n + 1, as in
      RoFormer and Meta's reference Llama code.

    The two give the same scores once the rows of W_Q and W_K are
    permuted to match (Hugging Face's conversion of Meta's Llama
    weights does this); with the same weights they do not.

    The angles are computed in float64 (float32 on Apple's MPS, which
    has no float64), then cast to ``x``'s dtype, so that a float64
    ``x`` is rotated exactly as a float64 reference would.

    Args:
        x: queries or keys, D even.
        positions: the integer position of each of the L rows of
            ``x``.
        base: the slowest pair turns at ``base^(-(D-2)/D)`` radians
            per position (Llama's ``rope_theta``): close to
            ``1 / base`` only for wide heads (1.2e-4 for D = 128 and
            base 10000, but 1e-3 for D = 8).
        layout: "half" or "interleaved": which coordinates pair up.

    Shapes:
        x (..., L, D), positions (L,) -> (..., L, D)
    """
    check.rotary_inputs("apply_rotary", x, positions, base, layout)
    D = x.shape[-1]
    mps = x.device.type == "mps"  # MPS has no float64
    exact = torch.float32 if mps else torch.float64
    pairs = torch.arange(0, D, 2, dtype=exact, device=x.device)  # 2n
    rates = 1.0 / base ** (pairs / D)  # (D/2,)
    angles = positions.to(exact)[:, None] * rates  # (L, D/2)
    cos = angles.cos().to(x.dtype)  # (L, D/2)
    sin = angles.sin().to(x.dtype)  # (L, D/2)
    if layout == "half":  # coordinate n pairs with n + D/2
        x1, x2 = x[..., : D // 2], x[..., D // 2 :]  # (..., L, D/2)
    else:  # coordinate 2n pairs with 2n + 1
        x1, x2 = x[..., 0::2], x[..., 1::2]  # (..., L, D/2) each
    turned_1 = x1 * cos - x2 * sin  # (..., L, D/2)
    turned_2 = x2 * cos + x1 * sin  # (..., L, D/2)
    if layout == "half":
        return torch.cat([turned_1, turned_2], dim=-1)  # (..., L, D)
    both = torch.stack([turned_1, turned_2], -1)  # (..., L, D/2, 2)
    return both.flatten(-2)  # (..., L, D): 2n, 2n + 1 side by side
