"""Attention score functions: how well each query matches each key.

Every score maps queries (B, L, Dq) and keys (B, S, Dk) to scores (B, L, S); a softmax over S
then turns each row into attention weights.

    DotScore         q · k                       Luong et al. 2015 ("dot")
    ScaledDotScore   q · k / sqrt(D)             Vaswani et al. 2017
    BilinearScore    q W kᵀ                      Luong et al. 2015 ("general")
    AdditiveScore    vᵀ tanh(W [q; k])           Bahdanau et al. 2015; Luong's "concat"
                     = vᵀ tanh(W_q q + W_k k)

Shapes:
    queries (B, L, Dq), keys (B, S, Dk) -> scores (B, L, S)
    (the dot products need Dq = Dk = D; the learned scores allow Dq != Dk)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attnbook import _checks as check

__all__ = ["DotScore", "ScaledDotScore", "BilinearScore", "AdditiveScore"]


class DotScore(nn.Module):
    """The dot product of each query with each key: ``scores[b, i, j] = q_i · k_j``.

    No parameters. Its scores have variance D for unit-variance inputs, which saturates the
    softmax as D grows (see :class:`ScaledDotScore`).

    Shapes:
        queries (B, L, D), keys (B, S, D) -> scores (B, L, S)
    """

    def forward(self, queries: Tensor, keys: Tensor) -> Tensor:
        """The dot product of every query with every key.

        Shapes:
            queries (B, L, D), keys (B, S, D) -> scores (B, L, S)
        """
        check.score_inputs("DotScore", self, queries, keys)
        return queries @ keys.transpose(1, 2)  # (B, L, S)


class ScaledDotScore(nn.Module):
    """The dot product divided by sqrt(D): ``scores[b, i, j] = q_i · k_j / sqrt(D)``.

    For queries and keys with independent unit-variance entries the scores then have unit
    variance whatever D is. No parameters.

    Shapes:
        queries (B, L, D), keys (B, S, D) -> scores (B, L, S)
    """

    def forward(self, queries: Tensor, keys: Tensor) -> Tensor:
        """The dot product of every query with every key, divided by sqrt(D).

        Shapes:
            queries (B, L, D), keys (B, S, D) -> scores (B, L, S)
        """
        check.score_inputs("ScaledDotScore", self, queries, keys)
        return queries @ keys.transpose(1, 2) / math.sqrt(queries.shape[-1])  # (B, L, S)


class BilinearScore(nn.Module):
    """A learned bilinear form ``scores[b, i, j] = q_i W k_jᵀ``
    (Luong's "general" score).

    Args:
        query_dim: Dq, the width of the queries.
        key_dim: Dk, the width of the keys; it may differ from Dq.

    The parameter ``weight`` W has shape (Dq, Dk): Dq·Dk parameters.
    With Dq = Dk and W = I the score is the dot product.

    Shapes:
        queries (B, L, Dq), keys (B, S, Dk) -> scores (B, L, S)
    """

    def __init__(self, query_dim: int, key_dim: int) -> None:
        super().__init__()
        check.positive_ints("BilinearScore", query_dim=query_dim,
                            key_dim=key_dim)
        self.query_dim, self.key_dim = query_dim, key_dim
        # (Dq, Dk)
        self.weight = nn.Parameter(torch.empty(query_dim, key_dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform W.

        Shapes:
            weight (Dq, Dk)
        """
        nn.init.xavier_uniform_(self.weight)

    def extra_repr(self) -> str:
        return f"query_dim={self.query_dim}, key_dim={self.key_dim}"

    def forward(self, queries: Tensor, keys: Tensor) -> Tensor:
        """Map each query into key space with W, then take dot
        products with the keys.

        Shapes:
            queries (B, L, Dq), keys (B, S, Dk) -> scores (B, L, S)
        """
        check.score_inputs("BilinearScore", self, queries, keys)
        # each query mapped into key space
        projected = queries @ self.weight  # (B, L, Dk)
        return projected @ keys.transpose(1, 2)  # (B, L, S)


class AdditiveScore(nn.Module):
    """Bahdanau's additive score, Luong's "concat".

    ``scores[b, i, j] = tanh([q_i, k_j] W + b) wᵀ``, with rows as
    vectors (chapters/notation.md).

    Args:
        query_dim: Dq, the width of the queries.
        key_dim: Dk, the width of the keys; it may differ from Dq.
        hidden_dim: Dh, the width of the hidden layer.

    W (Dq + Dk, Dh) splits into a query block on top of a key block,
    ``[q, k] W = q W_q + k W_k``, so :meth:`forward` projects the L
    queries and the S keys once each and adds them by broadcasting,
    (B, L, 1, Dh) + (B, 1, S, Dh): the (B, L·S, Dq + Dk) tensor of
    concatenated pairs is never built. :meth:`forward_concat`
    computes the same scores the literal way. Parameters, stored
    (out, in) as nn.Linear stores them: ``query_proj`` (W_qᵀ, no
    bias), ``key_proj`` (W_kᵀ and the bias b), ``v`` (w).

    Shapes:
        queries (B, L, Dq), keys (B, S, Dk) -> scores (B, L, S)
    """

    def __init__(self, query_dim: int, key_dim: int,
                 hidden_dim: int) -> None:
        super().__init__()
        check.positive_ints("AdditiveScore", query_dim=query_dim,
                            key_dim=key_dim, hidden_dim=hidden_dim)
        self.query_dim, self.key_dim = query_dim, key_dim
        self.hidden_dim = hidden_dim
        self.query_proj = nn.Linear(
            query_dim, hidden_dim, bias=False
        )  # W_q
        self.key_proj = nn.Linear(
            key_dim, hidden_dim, bias=True
        )  # W_k and the bias b of W
        self.v = nn.Linear(hidden_dim, 1, bias=False)  # w

    def extra_repr(self) -> str:
        return (f"query_dim={self.query_dim}, "
                f"key_dim={self.key_dim}, "
                f"hidden_dim={self.hidden_dim}")

    def forward(self, queries: Tensor, keys: Tensor) -> Tensor:
        """Project queries and keys once each, add them by
        broadcasting, then tanh and w.

        Shapes:
            queries (B, L, Dq), keys (B, S, Dk) -> scores (B, L, S)
        """
        check.score_inputs("AdditiveScore", self, queries, keys)
        q = self.query_proj(queries).unsqueeze(2)  # (B, L, 1, Dh)
        k = self.key_proj(keys).unsqueeze(1)  # (B, 1, S, Dh)
        # (B, L, S, Dh), in place: one pair-sized tensor, not two
        hidden = (q + k).tanh_()
        return self.v(hidden).squeeze(-1)  # (B, L, S)

    def forward_concat(self, queries: Tensor,
                       keys: Tensor) -> Tensor:
        """The same scores, built the literal way: concatenate every
        (query, key) pair.

        Materialises (B, L·S, Dq + Dk) tensors; kept to show why
        :meth:`forward` avoids them.

        Shapes:
            queries (B, L, Dq), keys (B, S, Dk) -> scores (B, L, S)
        """
        check.score_inputs("AdditiveScore", self, queries, keys)
        B, L, _ = queries.shape
        S = keys.shape[1]
        pairs = torch.cat(
            [
                # (B, L·S, Dq): q_0 S times, q_1 S times, ...
                queries.repeat_interleave(S, dim=1),
                # (B, L·S, Dk): k_0 .. k_{S-1}, L times
                keys.repeat(1, L, 1),
            ],
            dim=-1,
        )  # (B, L·S, Dq + Dk)
        # Wᵀ stored as nn.Linear stores it: (Dh, Dq + Dk)
        weight = torch.cat([self.query_proj.weight,
                            self.key_proj.weight], dim=1)
        # (B, L·S, Dh)
        hidden = torch.tanh(pairs @ weight.T + self.key_proj.bias)
        return self.v(hidden).view(B, L, S)  # (B, L, S)
