"""A tiny decoder-only (causal) transformer.

The model: token embedding + positions (learned, sinusoidal, rotary or none), then ``num_layers`` pre-norm blocks
(``x + attention(norm(x))``, then ``x + mlp(norm(x))``), a final layer norm and a linear read-out to
the vocabulary. The attention is :class:`attnbook.multihead.CausalSelfAttention`, so the model can
decode with a :class:`attnbook.kv_cache.KVCache` per layer, through the same forward.

It learns the repeat task of :mod:`attnbook.tasks.repeat`.

Shapes:
    B batch, L tokens (new tokens when decoding with caches), S positions seen so far, E width,
    H heads, V vocabulary size.
    TinyTransformer: tokens (B, L) -> logits (B, L, V)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbook import _checks as check
from attnbook.block import TransformerBlock
from attnbook.kv_cache import KVCache
from attnbook.positions import LearnedPositions, sinusoidal_positions

__all__ = ["TinyTransformer"]

POSITIONS = ("learned", "sinusoidal", "rotary", "none")


class TinyTransformer(nn.Module):
    """A small pre-norm causal transformer language model.

    Args:
        vocab_size: V.
        max_len: the most positions (prompt and generated tokens together).
        embed_dim: E.
        num_heads: H.
        num_layers: the number of blocks.
        mlp_ratio: the MLP's hidden width is ``mlp_ratio * embed_dim``.
        dropout: dropout in attention and MLP, in training only.
        backend: "math" (can return weights) or "sdpa" (fused).
        positions: how the model knows where a token is: "learned" (a trained vector per position,
            added to the token's), "sinusoidal" (the fixed vectors of
            :func:`attnbook.positions.sinusoidal_positions`, added), "rotary" (nothing added; queries
            and keys are rotated in every layer, :func:`attnbook.positions.apply_rotary`) or "none"
            (only the causal mask tells positions apart).
        num_kv_heads, window: grouped-query heads and a sliding window, see
            :class:`attnbook.multihead.CausalSelfAttention`. ``window`` is one W for every layer, or
            one entry per layer, None for a global layer: Gemma 3 interleaves five local layers and
            one global (``[W] * 5 + [None]``), gpt-oss alternates them (``[W, None] * n``).
        block: further options of every :class:`attnbook.block.TransformerBlock` (e.g.
            ``{"normalization": "rmsnorm", "activation": "swiglu", "bias": False}``, today's block).

    Shapes:
        forward: tokens (B, L) -> logits (B, L, V); with ``need_weights=True`` also a list with one
        (B, H, L, S) tensor per layer.
    """

    def __init__(
        self,
        vocab_size: int,
        max_len: int,
        *,
        embed_dim: int = 64,
        num_heads: int = 4,
        num_layers: int = 2,
        mlp_ratio: int = 4,
        dropout: float = 0.0,
        backend: str = "math",
        positions: str = "learned",
        num_kv_heads: int | None = None,
        window: int | None | list[int | None] = None,
        block: dict | None = None,
    ) -> None:
        super().__init__()
        check.positive_ints("TinyTransformer", vocab_size=vocab_size, max_len=max_len, num_layers=num_layers)
        windows = list(window) if isinstance(window, (list, tuple)) else [window] * num_layers
        check.that(len(windows) == num_layers, "TinyTransformer", lambda: f"`window` must be one W or None, or "
                   f"{num_layers} of them (one per layer); got {len(windows)}")
        check.instance("TinyTransformer", "block", block, (dict, type(None)), "a dict of TransformerBlock options")
        check.one_of("TinyTransformer", "positions", positions, POSITIONS)
        self.vocab_size, self.max_len, self.position_kind = vocab_size, max_len, positions
        self.embed_dim, self.num_heads, self.num_layers = embed_dim, num_heads, num_layers
        self.token_embedding = nn.Embedding(vocab_size, embed_dim)
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        if positions == "learned":
            self.positions = LearnedPositions(max_len, embed_dim)
        elif positions == "sinusoidal":
            self.register_buffer("sinusoids", sinusoidal_positions(max_len, embed_dim), persistent=False)  # (max_len, E)
        self.blocks = nn.ModuleList(
            TransformerBlock(embed_dim, num_heads, mlp_ratio=mlp_ratio, dropout=dropout, backend=backend,
                             max_len=max_len, num_kv_heads=num_kv_heads, rotary=positions == "rotary", window=w,
                             **(block or {}))
            for w in windows
        )
        self.norm = nn.RMSNorm(embed_dim) if (block or {}).get("normalization") == "rmsnorm" else nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, vocab_size)

    def new_caches(self, batch_size: int, max_len: int | None = None) -> list[KVCache]:
        """One empty :class:`KVCache` per layer, for ``batch_size`` sequences of up to ``max_len``
        positions (default: the model's ``max_len``).

        Shapes:
            -> num_layers caches, each holding up to (B, H, max_len, D)
        """
        max_len = self.max_len if max_len is None else max_len
        check.positive_int("TinyTransformer.new_caches", "max_len", max_len)
        check.that(max_len <= self.max_len, "TinyTransformer.new_caches",
                   lambda: f"`max_len` must be an int in 1..{self.max_len}; got {max_len}")
        return [block.attn.new_cache(batch_size, max_len) for block in self.blocks]

    def forward(
        self, tokens: Tensor, *, caches: list[KVCache] | None = None, need_weights: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """Next-token logits for every position of ``tokens``.

        With ``caches`` (from :meth:`new_caches`), ``tokens`` are the L tokens that follow the S
        already cached: their positions start at the cache length, their keys and values are
        appended, and they attend to the whole prefix.

        Shapes:
            tokens (B, L) -> logits (B, L, V) [, weights: num_layers x (B, H, L, S)]
        """
        check.decoder_call("TinyTransformer.forward", self, tokens, caches, KVCache, need_weights)
        offset = 0 if caches is None else len(caches[0])  # the position of the first token
        x = self.token_embedding(tokens)  # (B, L, E)
        if self.position_kind == "learned":
            x = self.positions(x, offset=offset)
        elif self.position_kind == "sinusoidal":
            x = x + self.sinusoids[offset : offset + tokens.shape[1]]
        all_weights = []
        for block, cache in zip(self.blocks, caches or [None] * self.num_layers):
            x, weights = block(x, cache=cache, need_weights=need_weights)  # (B, L, E), (B, H, L, S)
            all_weights.append(weights)
        logits = self.head(self.norm(x))  # (B, L, V)
        if need_weights:
            return logits, all_weights
        return logits

    @torch.no_grad()
    def generate(
        self,
        prompt: Tensor,
        num_new_tokens: int,
        *,
        use_cache: bool = True,
        return_logits: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Greedy decoding: append the most likely next token ``num_new_tokens`` times.

        With ``use_cache`` the prompt is run once and each step feeds only the newest token (its
        keys and values go to the caches); without it every step re-runs the whole sequence. Both
        give the same tokens. Runs in eval mode (no dropout) and restores the mode afterwards.

        Shapes:
            prompt (B, L0) -> tokens (B, L0 + N) [, logits (B, N, V) that chose the N new tokens]
        """
        check.generate_call("TinyTransformer.generate", self, prompt, num_new_tokens, use_cache, return_logits)
        was_training = self.training
        self.eval()
        try:
            caches = self.new_caches(prompt.shape[0], prompt.shape[1] + num_new_tokens) if use_cache else None
            tokens, fed, steps = prompt, prompt, []  # fed: what the next forward reads
            for _ in range(num_new_tokens):
                logits = self(fed, caches=caches)[:, -1]  # (B, V): the prediction at the last position
                next_token = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
                tokens = torch.cat([tokens, next_token], dim=1)  # (B, L0 + t + 1)
                fed = next_token if use_cache else tokens  # with a cache: only the newest token
                steps.append(logits)
        finally:
            self.train(was_training)
        if return_logits:
            empty = prompt.new_zeros((prompt.shape[0], 0, self.vocab_size), dtype=self.head.weight.dtype)
            return tokens, torch.stack(steps, dim=1) if steps else empty  # (B, L0 + N), (B, N, V)
        return tokens
