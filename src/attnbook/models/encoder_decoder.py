"""A small Transformer encoder-decoder.

The encoder reads the source with self-attention over every position (padding masked out of the
keys); the decoder writes the target one token at a time with causal self-attention and
*cross-attention*, whose queries come from the decoder and whose keys and values come from the
encoder's output (Vaswani et al., 2017). Both stacks are built from :mod:`attnbook.block`;
positions are the fixed sinusoids of :func:`attnbook.positions.sinusoidal_positions`.

It is trained on the dates task (:mod:`attnbook.tasks.dates`) by
:mod:`attnbook_tools.dates_model`, which also ships the book's checkpoint.

Shapes:
    B batch, S source length, L target length, E width, H heads, V vocabulary size.
    EncoderDecoder: src (B, S), key_mask (B, S) (True on real source tokens), tgt_in (B, L)
    -> logits (B, L, V)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

from attnbook import _checks as check
from attnbook.block import DecoderBlock, TransformerBlock
from attnbook.positions import sinusoidal_positions
from attnbook.tasks import dates

__all__ = ["Attentions", "EncoderDecoder", "next_token"]


def _check_sampling(where, logits, temperature, top_k):
    """Logits (B, V) to choose from, a finite ``temperature`` >= 0 and ``top_k`` None or in 1..V."""
    check.tensor(where, "logits", logits, "B, V", floating=True)
    check.number(where, "temperature", temperature, "a finite number >= 0", lambda t: 0 <= t < math.inf)
    check.that(top_k is None or type(top_k) is int and 1 <= top_k <= logits.shape[-1], where,
               lambda: f"`top_k` must be None or an int in 1..{logits.shape[-1]} (the vocabulary size); got {top_k!r}")


def next_token(
    logits: Tensor,
    *,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Choose each sequence's next token from its logits.

    ``temperature=0`` takes the most likely token (greedy decoding).
    A positive temperature samples from ``softmax(logits / T)``:
    below 1 sharper, above 1 flatter, as the scale of chapter 0
    sharpened or flattened attention's weights. ``top_k`` keeps
    the k most likely tokens (and any tied with the k-th) first.

    Shapes:
        logits (B, V) -> tokens (B,)
    """
    _check_sampling("next_token", logits, temperature, top_k)
    if temperature == 0:
        return logits.argmax(dim=-1)  # (B,)
    if top_k is not None:  # the k-th largest logit of each row
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, -math.inf)
    probabilities = torch.softmax(logits / temperature, dim=-1)
    sample = torch.multinomial(probabilities, 1, generator=generator)
    return sample[:, 0]  # (B,)


class Attentions(NamedTuple):
    """Every attention's weights, one (B, H, queries, keys) tensor per layer.

    Shapes:
        encoder: layers x (B, H, S, S); decoder_self: layers x (B, H, L, L);
        cross: layers x (B, H, L, S)
    """

    encoder: list[Tensor]
    decoder_self: list[Tensor]
    cross: list[Tensor]


class EncoderDecoder(nn.Module):
    """A Transformer encoder-decoder with pre-norm blocks, for sequences of token ids.

    Args:
        vocab_size: V, shared by source and target.
        max_len: the longest source and the longest target it accepts.
        embed_dim: E.
        num_heads: H.
        num_encoder_layers, num_decoder_layers: the depth of each stack.
        mlp_ratio: each MLP is ``mlp_ratio * embed_dim`` wide.
        dropout: in training only (see :class:`attnbook.block.TransformerBlock`).
        backend: "math" (can return weights) or "sdpa".

    Shapes:
        forward: src (B, S), key_mask (B, S), tgt_in (B, L) -> logits (B, L, V)
    """

    def __init__(
        self,
        vocab_size: int,
        max_len: int,
        *,
        embed_dim: int = 64,
        num_heads: int = 4,
        num_encoder_layers: int = 2,
        num_decoder_layers: int = 2,
        mlp_ratio: int = 4,
        dropout: float = 0.0,
        backend: str = "math",
    ) -> None:
        super().__init__()
        check.positive_ints("EncoderDecoder", vocab_size=vocab_size, max_len=max_len, embed_dim=embed_dim,
                            num_encoder_layers=num_encoder_layers, num_decoder_layers=num_decoder_layers)
        check.that(embed_dim % 2 == 0, "EncoderDecoder",
                   lambda: f"`embed_dim` must be even (sinusoidal positions); got {embed_dim}")
        self.vocab_size, self.max_len, self.embed_dim, self.num_heads = vocab_size, max_len, embed_dim, num_heads
        E = embed_dim
        options = {"mlp_ratio": mlp_ratio, "dropout": dropout, "backend": backend}
        self.src_embedding = nn.Embedding(vocab_size, E)
        self.tgt_embedding = nn.Embedding(vocab_size, E)
        self.register_buffer("positions", sinusoidal_positions(max_len, E), persistent=False)  # (max_len, E)
        self.encoder = nn.ModuleList(
            TransformerBlock(E, num_heads, causal=False, **options) for _ in range(num_encoder_layers)
        )
        self.encoder_norm = nn.LayerNorm(E)
        self.decoder = nn.ModuleList(
            DecoderBlock(E, num_heads, max_len=max_len, **options) for _ in range(num_decoder_layers)
        )
        self.decoder_norm = nn.LayerNorm(E)
        self.head = nn.Linear(E, vocab_size)

    def _embed(self, embedding: nn.Embedding, tokens: Tensor) -> Tensor:
        """Token embeddings plus sinusoidal positions. (B, L) -> (B, L, E)."""
        return embedding(tokens) + self.positions[: tokens.shape[1]]  # (B, L, E)

    def encode(
        self, src: Tensor, key_mask: Tensor | None = None, *, need_weights: bool = False
    ) -> tuple[Tensor, list[Tensor]]:
        """Run the encoder: every source position attends to every real source position.

        Shapes:
            src (B, S), key_mask (B, S) -> memory (B, S, E), weights: layers x (B, H, S, S)
        """
        check.encode_call("EncoderDecoder.encode", self, src, key_mask)
        x = self._embed(self.src_embedding, src)  # (B, S, E)
        weights = []
        for block in self.encoder:
            x, w = block(x, key_mask=key_mask, need_weights=need_weights)  # (B, S, E), (B, H, S, S)
            weights.append(w)
        return self.encoder_norm(x), weights  # (B, S, E)

    def decode(
        self, tgt_in: Tensor, memory: Tensor, key_mask: Tensor | None = None, *, need_weights: bool = False
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """Run the decoder over ``tgt_in`` (causal), reading the encoder's ``memory`` through
        cross-attention, whose ``key_mask`` marks the source's padding; return next-token logits
        at every target position.

        Shapes:
            tgt_in (B, L), memory (B, S, E), key_mask (B, S)
            -> logits (B, L, V), self weights: layers x (B, H, L, L), cross weights: layers x (B, H, L, S)
        """
        check.decode_call("EncoderDecoder.decode", self, tgt_in, memory)
        x = self._embed(self.tgt_embedding, tgt_in)  # (B, L, E)
        self_weights, cross_weights = [], []
        for block in self.decoder:
            x, ws, wc = block(x, memory, key_mask=key_mask, need_weights=need_weights)  # (B, L, E)
            self_weights.append(ws)
            cross_weights.append(wc)
        logits = self.head(self.decoder_norm(x))  # (B, L, V)
        return logits, self_weights, cross_weights

    def forward(
        self,
        src: Tensor,
        key_mask: Tensor | None,
        tgt_in: Tensor,
        *,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Attentions]:
        """Teacher forcing: the logits for every target position
        given the source and the target so far.

        Shapes:
            src (B, S), key_mask (B, S), tgt_in (B, L)
            -> logits (B, L, V)
            [, Attentions: encoder layers x (B, H, S, S),
            decoder_self layers x (B, H, L, L),
            cross layers x (B, H, L, S)]
        """
        where = "EncoderDecoder.forward"
        check.flag(where, "need_weights", need_weights)
        memory, encoder_weights = self.encode(  # (B, S, E)
            src, key_mask, need_weights=need_weights)
        logits, self_weights, cross_weights = self.decode(
            tgt_in, memory, key_mask, need_weights=need_weights)
        if need_weights:
            return logits, Attentions(
                encoder_weights, self_weights, cross_weights)
        return logits  # (B, L, V)

    @torch.no_grad()
    def generate(
        self,
        src: Tensor,
        key_mask: Tensor | None,
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        sos_id: int = dates.SOS,
        eos_id: int = dates.EOS,
        pad_id: int = dates.PAD,
    ) -> Tensor:
        """Decoding: encode once, then write a token ``max_new_tokens`` times, re-running the
        decoder over the target so far at each step. Each token is :func:`next_token` of the last
        position's logits: the most likely one by default (greedy decoding), or a sample at
        ``temperature`` from the ``top_k`` most likely, drawn with ``generator``. After a
        sequence's ``eos_id`` every position holds ``pad_id``; decoding stops early when every
        sequence has ended. Runs in eval mode and restores the mode afterwards.

        Shapes:
            src (B, S), key_mask (B, S) -> tokens (B, N) without the start token, N <= max_new_tokens
        """
        check.that(check.positive_int("EncoderDecoder.generate", "max_new_tokens", max_new_tokens) < self.max_len,
                   "EncoderDecoder.generate",
                   lambda: f"`max_new_tokens` must be an int in 1..{self.max_len - 1}; got {max_new_tokens}")
        was_training = self.training
        self.eval()
        try:
            memory, _ = self.encode(src, key_mask)  # (B, S, E)
            B = src.shape[0]
            tokens = torch.full((B, 1), sos_id, dtype=torch.long, device=src.device)  # (B, 1)
            done = torch.zeros(B, dtype=torch.bool, device=src.device)  # (B,)
            for _ in range(max_new_tokens):
                logits, _, _ = self.decode(tokens, memory, key_mask)  # (B, t, V)
                chosen = next_token(logits[:, -1], temperature=temperature, top_k=top_k,
                                    generator=generator)  # (B,)
                chosen = chosen.masked_fill(done, pad_id)  # (B,)
                tokens = torch.cat([tokens, chosen[:, None]], dim=1)  # (B, t + 1)
                done |= chosen == eos_id
                if bool(done.all()):
                    break
        finally:
            self.train(was_training)
        return tokens[:, 1:]  # (B, N)
