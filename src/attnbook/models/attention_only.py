"""A two-layer attention-only transformer: the model in which induction heads are easiest to see.

Embeddings of tokens and positions start a residual stream; each layer is one
:class:`attnbook.multihead.CausalSelfAttention` whose output is added to the stream; a linear
read-out turns the stream into next-token logits. No MLP and no normalisation: everything the model
computes, its attention heads compute (Elhage et al., 2021).

A head can be knocked out: ``knock_out={(layer, head), ...}`` zeroes that head's output (its D
columns of the merged heads, before the output projection), so its contribution to the residual
stream is gone and the rest of the model runs as trained.

Shapes:
    B batch, L tokens, E width, H heads, D = E / H, V vocabulary size.
    AttentionOnlyTransformer: tokens (B, L) -> logits (B, L, V)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from attnbook import _checks as check
from attnbook.multihead import CausalSelfAttention
from attnbook.positions import LearnedPositions

__all__ = ["AttentionOnlyTransformer"]


class AttentionOnlyTransformer(nn.Module):
    """Embeddings, ``num_layers`` causal self-attention layers added to a residual stream, a read-out.

    Args:
        vocab_size: V.
        max_len: the most positions.
        embed_dim: E.
        num_heads: H.
        num_layers: the number of attention layers.

    Shapes:
        forward: tokens (B, L) -> logits (B, L, V); with ``need_weights=True`` also a list with one
        (B, H, L, L) tensor per layer, every head's weights.
    """

    def __init__(self, vocab_size: int, max_len: int, *, embed_dim: int = 64, num_heads: int = 4,
                 num_layers: int = 2) -> None:
        super().__init__()
        check.positive_ints("AttentionOnlyTransformer", vocab_size=vocab_size, max_len=max_len,
                            num_layers=num_layers)
        self.vocab_size, self.max_len = vocab_size, max_len
        self.num_heads, self.num_layers = num_heads, num_layers
        self.token_embedding = nn.Embedding(vocab_size, embed_dim)
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        self.positions = LearnedPositions(max_len, embed_dim)
        self.layers = nn.ModuleList(CausalSelfAttention(embed_dim, num_heads, max_len=max_len)
                                    for _ in range(num_layers))
        self.head = nn.Linear(embed_dim, vocab_size)

    def forward(
        self,
        tokens: Tensor,
        *,
        need_weights: bool = False,
        knock_out: Iterable[tuple[int, int]] = (),
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Next-token logits at every position; ``knock_out``
        lists (layer, head) pairs whose output is zeroed.

        Shapes:
            tokens (B, L) -> logits (B, L, V)
            [, weights: num_layers x (B, H, L, L)]
        """
        knock_out = self._knock_outs(tokens, need_weights, knock_out)
        # the residual stream: token and position embeddings
        x = self.positions(self.token_embedding(tokens))  # (B, L, E)
        all_weights = []
        for index, layer in enumerate(self.layers):
            silenced = [h for i, h in knock_out if i == index]
            with _silenced(layer, silenced):
                out, weights = layer(x, need_weights=need_weights,
                                     average_attn_weights=False)
            x = x + out  # (B, L, E): each layer adds to the stream
            all_weights.append(weights)  # (B, H, L, L) or None
        logits = self.head(x)  # (B, L, V)
        if need_weights:
            return logits, all_weights
        return logits

    def _knock_outs(self, tokens, need_weights, knock_out) -> set[tuple[int, int]]:
        where = "AttentionOnlyTransformer.forward"
        check.token_ids(where, "tokens", tokens, self.vocab_size)
        check.flag(where, "need_weights", need_weights)
        knock_out = set(knock_out)
        check.that(all(isinstance(p, tuple) and len(p) == 2 and p[0] in range(self.num_layers)
                       and p[1] in range(self.num_heads) for p in knock_out), where,
                   lambda: f"`knock_out` must hold (layer, head) pairs with layer in 0..{self.num_layers - 1} "
                   f"and head in 0..{self.num_heads - 1}; got {sorted(knock_out, key=repr)}")
        return knock_out


@contextmanager
def _silenced(layer: CausalSelfAttention, heads: list[int]) -> Iterator[None]:
    """While inside, ``layer``'s output projection reads zeros in the D columns of each head in
    ``heads`` (a forward pre-hook, removed on leaving)."""
    if not heads:
        yield
        return
    D = layer.head_dim

    def zero_heads(module: nn.Module, args: tuple[Tensor]) -> tuple[Tensor]:
        merged = args[0]  # (B, L, E): head h in columns h·D .. h·D + D - 1
        keep = torch.ones(merged.shape[-1], dtype=merged.dtype, device=merged.device)  # (E,)
        for h in heads:
            keep[h * D : (h + 1) * D] = 0
        return (merged * keep,)  # (B, L, E)

    hook = layer.out_proj.register_forward_pre_hook(zero_heads)
    try:
        yield
    finally:
        hook.remove()
