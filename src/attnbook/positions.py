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
    rope_frequencies -> inv_freq (D/2,), attention_factor
    interleaved_to_half: weight (H·D, E) -> (H·D, E)

For sequences longer than training saw, :func:`rope_frequencies` gives the tables of today's
long-context recipes (position interpolation, YaRN, Llama 3.1), which ``apply_rotary`` takes as
``inv_freq``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnbook import _checks as check

__all__ = ["sinusoidal_positions", "LearnedPositions", "apply_rotary", "rope_frequencies",
           "interleaved_to_half"]


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
                 layout: str = "half",
                 inv_freq: Tensor | None = None) -> Tensor:
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
        inv_freq: the turning speed of every pair, (D/2,), in place
            of the table from ``base`` (a scaled table from
            :func:`rope_frequencies`).

    Shapes:
        x (..., L, D), positions (L,), inv_freq (D/2,)
        -> (..., L, D)
    """
    check.rotary_inputs("apply_rotary", x, positions, base, layout,
                        inv_freq)
    D = x.shape[-1]
    mps = x.device.type == "mps"  # MPS has no float64
    exact = torch.float32 if mps else torch.float64
    if inv_freq is None:
        # 2n for every pair n
        pairs = torch.arange(0, D, 2, dtype=exact, device=x.device)
        rates = 1.0 / base ** (pairs / D)  # (D/2,)
    else:
        rates = inv_freq.to(x.device, exact)  # (D/2,)
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


def rope_frequencies(head_dim: int, base: float = 10000.0,
                     scaling: dict | None = None) -> tuple[Tensor, float]:
    """The turning speed of each rotary pair, plain or scaled for
    sequences longer than training saw, as Hugging Face computes it.

    Plain: ``inv_freq[n] = base^(-2n/D)``; pair n repeats every
    ``2π / inv_freq[n]`` positions (its wavelength). ``scaling`` is a
    Hugging Face ``rope_parameters`` dict; its ``"rope_type"`` picks:

    * ``"linear"`` (position interpolation, Chen et al., 2023): every
      speed divided by ``factor``, as if positions were p / factor;
    * ``"llama3"`` (Llama 3.1): pairs slower than
      ``original_max_position_embeddings / low_freq_factor`` (in
      wavelength) divided by ``factor``, pairs faster than
      ``... / high_freq_factor`` kept, a linear blend between;
    * ``"yarn"`` (Peng et al., 2024): the same idea counted in turns
      over the original length (``beta_fast``, default 32, and
      ``beta_slow``, default 1, bound the blend; ``truncate``,
      default True, rounds the bounds outward), and an attention
      factor ``0.1 ln(factor) + 1`` (``mscale``/``mscale_all_dim``
      or ``attention_factor`` when given) that multiplies cos and
      sin: apply it as ``apply_rotary(...) * attention_factor``.

    The dict's ``"rope_theta"``, when present, is the base. Computed
    in float64 (Hugging Face computes in float32).

    Args:
        head_dim: D, the rotated width, even.
        base: ``rope_theta``.
        scaling: None or a rope-parameters dict, as above.

    Shapes:
        -> inv_freq (D/2,) float64, attention_factor (a float)
    """
    where = "rope_frequencies"
    check.that(isinstance(head_dim, int) and head_dim > 0 and head_dim % 2 == 0, where,
               lambda: f"`head_dim` must be an even int > 0; got {head_dim!r}")
    check.that(scaling is None or isinstance(scaling, dict), where,
               lambda: f"`scaling` must be None or a dict; got {check.described(scaling)}", TypeError)
    scaling = dict(scaling or {"rope_type": "default"})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    check.one_of(where, 'scaling["rope_type"]', kind, ("default", "linear", "yarn", "llama3"))
    base = scaling.get("rope_theta", base)
    check.number(where, "base", base, "a number > 1", lambda b: b > 1)
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # (D/2,)
    if kind == "default":
        return inv_freq, 1.0
    needs = {"linear": ["factor"], "yarn": ["factor", "original_max_position_embeddings"],
             "llama3": ["factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"]}[kind]
    check.that(all(key in scaling for key in needs), where,
               lambda: f"`scaling` of rope_type {kind!r} needs the keys {needs}; got {sorted(scaling)}", KeyError)
    factor = scaling["factor"]
    check.number(where, 'scaling["factor"]', factor, "a number >= 1", lambda f: f >= 1)
    if kind == "linear":  # every pair slowed down: positions p / factor
        return inv_freq / factor, 1.0
    old = scaling["original_max_position_embeddings"]  # the length trained on
    if kind == "llama3":  # by wavelength: slow pairs / factor, fast pairs kept, a blend between
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        smooth = ((old * inv_freq / (2 * math.pi) - low) / (high - low)).clamp(0, 1)  # 0: slow, 1: fast
        return (1 - smooth) * inv_freq / factor + smooth * inv_freq, 1.0

    def pair_with_turns(turns):  # the (fractional) pair that turns `turns` times over the old length
        return head_dim * math.log(old / (turns * 2 * math.pi)) / (2 * math.log(base))

    fast, slow = pair_with_turns(scaling.get("beta_fast") or 32), pair_with_turns(scaling.get("beta_slow") or 1)
    if scaling.get("truncate", True):
        fast, slow = math.floor(fast), math.ceil(slow)
    fast, slow = max(fast, 0), min(slow, head_dim - 1)
    slow += 0.001 if fast == slow else 0  # as Hugging Face: no division by zero
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - fast) / (slow - fast)).clamp(0, 1)  # 1: slow
    factor_of = lambda m: 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0  # noqa: E731
    attention = scaling.get("attention_factor")
    if attention is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention = factor_of(m) / factor_of(m_all) if m and m_all else factor_of(1)
    return ramp * inv_freq / factor + (1 - ramp) * inv_freq, float(attention)


def interleaved_to_half(weight: Tensor, num_heads: int) -> Tensor:
    """The rows of a query or key projection, reordered from the
    interleaved layout to the half layout.

    In each head, row 2n (the first of pair n, interleaved) goes to
    row n, and row 2n + 1 to row n + D/2, so that pair n meets
    ``apply_rotary(..., layout="half")`` where it met the interleaved
    rotation: the scores are the same (Hugging Face's conversion of
    Meta's Llama weights, ``permute``, does this).

    Shapes:
        weight (H·D, E) -> (H·D, E)
    """
    where = "interleaved_to_half"
    check.tensor(where, "weight", weight, "H·D, E")
    check.that(isinstance(num_heads, int) and num_heads > 0 and weight.shape[0] % (2 * num_heads) == 0, where,
               lambda: f"`num_heads` must be an int > 0 with an even D = rows / num_heads; got {num_heads!r} "
                       f"for {weight.shape[0]} rows")
    HD, E = weight.shape
    per_head = weight.view(num_heads, HD // num_heads // 2, 2, E)  # (H, D/2, 2, E): pair n, its 2 rows
    return per_head.transpose(1, 2).reshape(HD, E)  # (H·D, E): each head's first rows, then its second
