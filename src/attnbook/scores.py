"""Attention score functions: how well each query matches each key.

Every score maps queries (B, L, Dq) and keys (B, S, Dk) to scores (B, L, S); a softmax over S
then turns each row into attention weights.

    DotScore         q · k                       Luong et al. 2015 ("dot")
    ScaledDotScore   q · k / sqrt(D)             Vaswani et al. 2017
    BilinearScore    q W kᵀ                      Luong et al. 2015 ("general")
    AdditiveScore    vᵀ tanh(W_q q + W_k k)      Bahdanau et al. 2015 ("concat")

Shapes:
    queries (B, L, Dq), keys (B, S, Dk) -> scores (B, L, S)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["DotScore", "ScaledDotScore", "BilinearScore", "AdditiveScore"]


def _check(where: str, queries: Tensor, keys: Tensor, same_width: bool,
           query_dim: int | None = None, key_dim: int | None = None) -> None:
    for name, t in (("queries", queries), ("keys", keys)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{where}: `{name}` must be a tensor; got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(
                f"{where}: `{name}` must be 3-D ({'B, L, Dq' if name == 'queries' else 'B, S, Dk'}); "
                f"got shape {tuple(t.shape)}"
            )
    if queries.shape[0] != keys.shape[0]:
        raise ValueError(
            f"{where}: `queries` and `keys` must have the same batch size B; got "
            f"{tuple(queries.shape)} and {tuple(keys.shape)}"
        )
    if same_width and queries.shape[-1] != keys.shape[-1]:
        raise ValueError(
            f"{where}: `queries` and `keys` must have the same width for a dot product; got "
            f"{tuple(queries.shape)} and {tuple(keys.shape)} (use BilinearScore or AdditiveScore "
            f"when the widths differ)"
        )
    if query_dim is not None and queries.shape[-1] != query_dim:
        raise ValueError(
            f"{where}: `queries` must have width query_dim={query_dim}; got shape {tuple(queries.shape)}"
        )
    if key_dim is not None and keys.shape[-1] != key_dim:
        raise ValueError(
            f"{where}: `keys` must have width key_dim={key_dim}; got shape {tuple(keys.shape)}"
        )


def _positive_int(where: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{where}: `{name}` must be a positive int; got {value!r}")
    return value


class DotScore(nn.Module):
    """The dot product of each query with each key: ``scores[b, i, j] = q_i · k_j``."""

    def forward(self, queries: Tensor, keys: Tensor) -> Tensor:
        _check("DotScore", queries, keys, same_width=True)
        return queries @ keys.transpose(1, 2)  # (B, L, S)


class ScaledDotScore(nn.Module):
    """The dot product divided by sqrt(D), so that scores keep unit variance as D grows."""

    def forward(self, queries: Tensor, keys: Tensor) -> Tensor:
        _check("ScaledDotScore", queries, keys, same_width=True)
        return queries @ keys.transpose(1, 2) / math.sqrt(queries.shape[-1])  # (B, L, S)


class BilinearScore(nn.Module):
    """A learned bilinear form ``q W kᵀ`` (Luong's "general" score).

    ``weight`` has shape (Dq, Dk), so queries and keys may have different widths. With
    W = I it is the dot product.
    """

    def __init__(self, query_dim: int, key_dim: int) -> None:
        super().__init__()
        self.query_dim = _positive_int("BilinearScore", "query_dim", query_dim)
        self.key_dim = _positive_int("BilinearScore", "key_dim", key_dim)
        self.weight = nn.Parameter(torch.empty(query_dim, key_dim))  # (Dq, Dk)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.xavier_uniform_(self.weight)

    def extra_repr(self) -> str:
        return f"query_dim={self.query_dim}, key_dim={self.key_dim}"

    def forward(self, queries: Tensor, keys: Tensor) -> Tensor:
        _check("BilinearScore", queries, keys, same_width=False,
               query_dim=self.query_dim, key_dim=self.key_dim)
        return queries @ self.weight @ keys.transpose(1, 2)  # (B, L, Dk) @ (B, Dk, S) -> (B, L, S)


class AdditiveScore(nn.Module):
    """Bahdanau's additive ("concat") score ``vᵀ tanh(W [q; k])``.

    Splitting W into a query part and a key part, ``W [q; k] = W_q q + W_k k``, so the projected
    queries (B, L, 1, Dh) and projected keys (B, 1, S, Dh) are added by broadcasting: the
    (B, L·S, Dq + Dk) tensor of concatenated pairs is never built. :meth:`forward_concat`
    computes the same scores the literal way, for comparison.
    """

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.query_dim = _positive_int("AdditiveScore", "query_dim", query_dim)
        self.key_dim = _positive_int("AdditiveScore", "key_dim", key_dim)
        self.hidden_dim = _positive_int("AdditiveScore", "hidden_dim", hidden_dim)
        self.query_proj = nn.Linear(query_dim, hidden_dim, bias=False)  # W_q
        self.key_proj = nn.Linear(key_dim, hidden_dim, bias=True)  # W_k (and the bias of W)
        self.v = nn.Linear(hidden_dim, 1, bias=False)  # vᵀ

    def extra_repr(self) -> str:
        return f"query_dim={self.query_dim}, key_dim={self.key_dim}, hidden_dim={self.hidden_dim}"

    def forward(self, queries: Tensor, keys: Tensor) -> Tensor:
        _check("AdditiveScore", queries, keys, same_width=False,
               query_dim=self.query_dim, key_dim=self.key_dim)
        q = self.query_proj(queries).unsqueeze(2)  # (B, L, 1, Dh)
        k = self.key_proj(keys).unsqueeze(1)  # (B, 1, S, Dh)
        return self.v(torch.tanh(q + k)).squeeze(-1)  # (B, L, S)

    def forward_concat(self, queries: Tensor, keys: Tensor) -> Tensor:
        """The same scores, built the literal way: concatenate every (query, key) pair.

        Materialises a (B, L·S, Dq + Dk) tensor; kept to show why :meth:`forward` avoids it.
        """
        _check("AdditiveScore", queries, keys, same_width=False,
               query_dim=self.query_dim, key_dim=self.key_dim)
        B, L, _ = queries.shape
        S = keys.shape[1]
        pairs = torch.cat(
            [
                queries.repeat_interleave(S, dim=1),  # (B, L·S, Dq): q_0 S times, q_1 S times, ...
                keys.repeat(1, L, 1),  # (B, L·S, Dk): k_0 .. k_{S-1}, L times
            ],
            dim=-1,
        )  # (B, L·S, Dq + Dk)
        weight = torch.cat([self.query_proj.weight, self.key_proj.weight], dim=1)  # (Dh, Dq + Dk)
        hidden = torch.tanh(pairs @ weight.T + self.key_proj.bias)  # (B, L·S, Dh)
        return self.v(hidden).view(B, L, S)  # (B, L, S)
