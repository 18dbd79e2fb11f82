"""Encoder-decoder (seq2seq) models with GRUs, with and without attention.

* :class:`Encoder` reads the source and returns one state per source token.
* :class:`BottleneckDecoder` sees only the encoder's final state: the whole source must fit
  in one vector (the bottleneck).
* :class:`AttentionDecoder` looks back at every encoder state at every step, through
  :func:`attention_step` with any score from :mod:`attnbook.scores`.
* :class:`Seq2Seq` puts an encoder and a decoder together: ``forward`` for training with
  teacher forcing, :meth:`Seq2Seq.greedy_decode` for inference.
* :func:`attnbook.models.builder.build_model` makes the models the book compares, by score name.

Shapes:
    B batch, S source length, L target length, vocab_size the vocabulary's size,
    E embedding width, Dq decoder state width, Dk encoder state width.
    src (B, S), src_lengths (B,), tgt_in (B, L)
    -> logits (B, L, vocab_size), weights (B, L, S) (attention models) or None
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnbook import _checks as check
from attnbook.attention import Attention
from attnbook.masks import padding_mask
from attnbook.tasks.reversal import EOS, PAD, SOS, VOCAB_SIZE

__all__ = [
    "attention_step",
    "Encoder",
    "BottleneckDecoder",
    "AttentionDecoder",
    "Seq2Seq",
]


def attention_step(
    decoder_state: Tensor,
    encoder_states: Tensor,
    score: nn.Module,
    key_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """One attention step of a seq2seq decoder.

    The decoder state ``s`` is the query; the encoder states
    ``h_1 .. h_S`` are both keys and values. Score every encoder
    state against ``s``, normalise the scores with a softmax over the
    source positions that are not padding, and return the weighted
    sum of the encoder states (the context) with the weights.

    Args:
        decoder_state: the current decoder state ``s``.
        encoder_states: every encoder state ``h_j``.
        score: a score module from :mod:`attnbook.scores` (or an
            :class:`attnbook.attention.Attention` wrapping one).
        key_mask: bool, True on real source tokens and False on
            padding (:func:`attnbook.masks.padding_mask`); None when
            nothing is padded.

    Returns:
        (context, weights). Padded positions get weight exactly 0.

    Shapes:
        decoder_state (B, Dq), encoder_states (B, S, Dk),
        key_mask (B, S) -> context (B, Dk), weights (B, S)
    """
    _check_step(decoder_state, encoder_states, score, key_mask)
    if isinstance(score, Attention):
        attend = score
    else:
        attend = Attention(score)
    # one query per sequence
    queries = decoder_state.unsqueeze(1)  # (B, 1, Dq)
    # (B, 1, Dk), (B, 1, S)
    context, weights = attend(
        queries, encoder_states, encoder_states, key_mask=key_mask
    )
    return context.squeeze(1), weights.squeeze(1)  # (B, Dk), (B, S)


def token_gru(
    vocab_size: int, embed_dim: int, hidden_dim: int
) -> tuple[nn.Embedding, nn.GRU]:
    """The token embedding (PAD embeds to zeros) and the GRU that
    reads the embedded tokens, as :class:`Encoder` and
    :class:`BottleneckDecoder` both use them.

    Shapes:
        embedding: tokens (B, S) -> (B, S, E)
        GRU: (B, S, E) -> states (B, S, hidden_dim)
    """
    embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=PAD)
    return embedding, nn.GRU(embed_dim, hidden_dim, batch_first=True)


class Encoder(nn.Module):
    """Embed the source tokens and run a GRU over them.

    ``forward`` returns every encoder state (zero on padded
    positions) and the final state, the state after each sequence's
    last real token. Because the GRU reads left to right, a padded
    token can change only states at padded positions, and those are
    zeroed here and masked by the decoder.

    Shapes:
        src (B, S), src_lengths (B,)
        -> states (B, S, Dk), final (B, Dk)
    """

    def __init__(
        self,
        vocab_size: int = VOCAB_SIZE,
        embed_dim: int = 64,
        hidden_dim: int = 64,
    ) -> None:
        super().__init__()
        self.embedding, self.rnn = token_gru(
            vocab_size, embed_dim, hidden_dim
        )
        self.hidden_dim = hidden_dim

    def forward(
        self, src: Tensor, src_lengths: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Every encoder state (zero on padding) and each sequence's
        final state.

        Shapes:
            src (B, S), src_lengths (B,)
            -> states (B, S, Dk), final (B, Dk)
        """
        vocab_size = self.embedding.num_embeddings
        _check_source("Encoder", src, src_lengths, vocab_size)
        B, S = src.shape
        states, _ = self.rnn(self.embedding(src))  # (B, S, Dk)
        real = padding_mask(src_lengths, max_len=S)  # (B, S)
        # zero on padding
        states = states * real.unsqueeze(-1)  # (B, S, Dk)
        rows = torch.arange(B, device=src.device)  # (B,)
        final = states[rows, src_lengths - 1]  # (B, Dk)
        return states, final


class BottleneckDecoder(nn.Module):
    """A GRU decoder that starts from the encoder's final state and
    never sees the encoder again.

    ``step`` and ``forward`` take the encoder states and the key mask
    only to share one interface with :class:`AttentionDecoder`; they
    ignore them.

    Shapes:
        step: token (B,), state (B, Dq)
              -> logits (B, vocab_size), state (B, Dq), None
        forward: tgt_in (B, L), initial state (B, Dq)
                 -> logits (B, L, vocab_size), None
    """

    uses_attention = False

    def __init__(
        self,
        vocab_size: int = VOCAB_SIZE,
        embed_dim: int = 64,
        hidden_dim: int = 64,
    ) -> None:
        super().__init__()
        self.embedding, self.rnn = token_gru(
            vocab_size, embed_dim, hidden_dim
        )
        self.out = nn.Linear(hidden_dim, vocab_size)

    def step(
        self,
        token: Tensor,
        state: Tensor,
        encoder_states: Tensor | None = None,
        key_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, None]:
        """One decoding step from the previous token.

        Shapes:
            token (B,), state (B, Dq)
            -> logits (B, vocab_size), state (B, Dq), None
        """
        inputs = self.embedding(token).unsqueeze(1)  # (B, 1, E)
        # (B, 1, Dq)
        output, _ = self.rnn(inputs, state.unsqueeze(0))
        state = output.squeeze(1)  # (B, Dq)
        return self.out(state), state, None

    def forward(
        self,
        tgt_in: Tensor,
        initial_state: Tensor,
        encoder_states: Tensor | None = None,
        key_mask: Tensor | None = None,
    ) -> tuple[Tensor, None]:
        """Teacher forcing over a whole target.

        Shapes:
            tgt_in (B, L), initial_state (B, Dq)
            -> logits (B, L, vocab_size), None
        """
        # Teacher forcing: every input token is known, so one GRU
        # call runs all L steps.
        inputs = self.embedding(tgt_in)  # (B, L, E)
        # (B, L, Dq)
        outputs, _ = self.rnn(inputs, initial_state.unsqueeze(0))
        return self.out(outputs), None  # (B, L, vocab_size)


class AttentionDecoder(nn.Module):
    """A GRU decoder that attends over every encoder state at every step.

    One step, from decoder state ``s`` and previous token ``y``:

    1. score every encoder state against ``s``,
    2. normalise the scores (softmax over real source tokens),
    3. sum the encoder states with those weights into a context ``c``
       (steps 1-3 are :func:`attention_step`),
    4. compute the next state ``s' = GRUCell([embed(y); c], s)``,

    then predict the next token from ``[s'; c]``.

    Args:
        score: any score module from :mod:`attnbook.scores`, with query width ``hidden_dim``
            and key width ``encoder_dim``.

    Shapes:
        step: token (B,), state (B, Dq), encoder_states (B, S, Dk), key_mask (B, S)
              -> logits (B, vocab_size), state (B, Dq), weights (B, S)
        forward: tgt_in (B, L), ... -> logits (B, L, vocab_size), weights (B, L, S)
    """

    uses_attention = True

    def __init__(self, score: nn.Module, *, vocab_size: int = VOCAB_SIZE, embed_dim: int = 64,
                 hidden_dim: int = 64, encoder_dim: int | None = None) -> None:
        super().__init__()
        check.instance("AttentionDecoder", "score", score, nn.Module,
                       "a score module such as attnbook.scores.DotScore()")
        encoder_dim = hidden_dim if encoder_dim is None else encoder_dim
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=PAD)
        self.attention = Attention(score)
        self.cell = nn.GRUCell(embed_dim + encoder_dim, hidden_dim)
        self.out = nn.Linear(hidden_dim + encoder_dim, vocab_size)

    def step(
        self,
        token: Tensor,
        state: Tensor,
        encoder_states: Tensor,
        key_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """One decoding step: attend, update the state, predict.

        Shapes:
            token (B,), state (B, Dq), encoder_states (B, S, Dk),
            key_mask (B, S)
            -> logits (B, vocab_size), state (B, Dq), weights (B, S)
        """
        # (B, Dk), (B, S)
        context, weights = attention_step(
            state, encoder_states, self.attention, key_mask
        )
        # (B, E + Dk)
        inputs = torch.cat([self.embedding(token), context], dim=-1)
        state = self.cell(inputs, state)  # (B, Dq)
        # (B, Dq + Dk)
        features = torch.cat([state, context], dim=-1)
        logits = self.out(features)  # (B, vocab_size)
        return logits, state, weights

    def forward(self, tgt_in: Tensor, initial_state: Tensor, encoder_states: Tensor,
                key_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Teacher forcing over a whole target, one step at a time.

        Shapes:
            tgt_in (B, L), initial_state (B, Dq), encoder_states (B, S, Dk), key_mask (B, S)
            -> logits (B, L, vocab_size), weights (B, L, S)
        """
        state = initial_state  # (B, Dq)
        all_logits, all_weights = [], []
        for t in range(tgt_in.shape[1]):
            logits, state, weights = self.step(tgt_in[:, t], state, encoder_states, key_mask)
            all_logits.append(logits)
            all_weights.append(weights)
        return torch.stack(all_logits, dim=1), torch.stack(all_weights, dim=1)  # (B, L, vocab_size), (B, L, S)


class Seq2Seq(nn.Module):
    """An encoder and a decoder (bottleneck or attention) as one model.

    Shapes:
        forward: src (B, S), src_lengths (B,), tgt_in (B, L)
                 -> logits (B, L, vocab_size), weights (B, L, S) or None
        greedy_decode: src (B, S), src_lengths (B,) -> tokens (B, L'), weights (B, L', S) or None
    """

    def __init__(self, encoder: Encoder, decoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    @property
    def uses_attention(self) -> bool:
        """Whether the decoder attends to the encoder states.

        Shapes:
            no tensors
        """
        return bool(getattr(self.decoder, "uses_attention", False))

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor) -> tuple[Tensor, Tensor | None]:
        """Teacher forcing: the decoder reads the true previous token at every step.

        Shapes:
            src (B, S), src_lengths (B,), tgt_in (B, L) -> logits (B, L, vocab_size), weights (B, L, S) or None
        """
        _check_source("Seq2Seq", src, src_lengths, self.encoder.embedding.num_embeddings)
        check.token_ids("Seq2Seq", "tgt_in", tgt_in, self.decoder.embedding.num_embeddings)
        check.that(len(tgt_in) == len(src), "Seq2Seq", lambda: f"`tgt_in` {tuple(tgt_in.shape)} and `src` "
                   f"{tuple(src.shape)} must have the same batch size B")
        encoder_states, final = self.encoder(src, src_lengths)  # (B, S, Dk), (B, Dk)
        key_mask = padding_mask(src_lengths, max_len=src.shape[1])  # (B, S)
        return self.decoder(tgt_in, final, encoder_states, key_mask)

    @torch.no_grad()
    def greedy_decode(self, src: Tensor, src_lengths: Tensor,
                      max_len: int | None = None) -> tuple[Tensor, Tensor | None]:
        """Decode by always taking the most likely next token, starting from SOS.

        Stops after ``max_len`` tokens (default: source length S + 1) or when every sequence
        has produced EOS; positions after a sequence's EOS hold PAD (and zero weights).

        Returns:
            (tokens without the SOS, attention weights per step or None)

        Shapes:
            src (B, S), src_lengths (B,) -> tokens (B, L'), weights (B, L', S) or None
        """
        _check_source("Seq2Seq.greedy_decode", src, src_lengths, self.encoder.embedding.num_embeddings)
        B, S = src.shape
        max_len = S + 1 if max_len is None else max_len
        check.positive_int("Seq2Seq.greedy_decode", "max_len", max_len)
        encoder_states, state = self.encoder(src, src_lengths)  # (B, S, Dk), (B, Dq)
        key_mask = padding_mask(src_lengths, max_len=S)  # (B, S)
        token = torch.full((B,), SOS, dtype=torch.long, device=src.device)  # (B,)
        finished = torch.zeros(B, dtype=torch.bool, device=src.device)  # (B,)
        tokens, all_weights = [], []
        for _ in range(max_len):
            logits, state, weights = self.decoder.step(token, state, encoder_states, key_mask)
            token = logits.argmax(dim=-1).masked_fill(finished, PAD)  # (B,)
            tokens.append(token)
            if weights is not None:
                all_weights.append(weights.masked_fill(finished.unsqueeze(-1), 0.0))  # (B, S)
            finished = finished | (token == EOS)
            if bool(finished.all()):
                break
        weights_out = torch.stack(all_weights, dim=1) if all_weights else None  # (B, L', S)
        return torch.stack(tokens, dim=1), weights_out  # (B, L')


def _check_step(decoder_state: object, encoder_states: object, score: object, key_mask: object) -> None:
    """The arguments of :func:`attention_step`, one check each."""
    where = "attention_step"
    check.tensor(where, "decoder_state", decoder_state, letters="B, Dq", floating=True)
    check.tensor(where, "encoder_states", encoder_states, letters="B, S, Dk", floating=True)
    check.that(len(decoder_state) == len(encoder_states), where, lambda: f"`decoder_state` "
               f"{tuple(decoder_state.shape)} and `encoder_states` {tuple(encoder_states.shape)} must have "
               "the same batch size B")
    check.instance(where, "score", score, nn.Module, "a score module such as attnbook.scores.DotScore()")
    check.key_mask(where, key_mask, (len(encoder_states), 1, encoder_states.shape[1]))


def _check_source(where: str, src: object, src_lengths: object, vocab_size: int) -> None:
    """A batch of padded sources: token ids (B, S) and their true lengths, a long tensor (B,) in 1..S."""
    check.token_ids(where, "src", src, vocab_size)
    check.tensor(where, "src_lengths", src_lengths, letters="B")
    check.that(src_lengths.dtype == torch.long, where,
               lambda: f"`src_lengths` must be a long tensor (B,); got dtype {src_lengths.dtype}", TypeError)
    B, S = src.shape
    check.that(len(src_lengths) == B, where, lambda: f"`src_lengths` must hold one length per sequence, "
               f"shape (B,) = ({B},); got {tuple(src_lengths.shape)}")
    check.that(B == 0 or 1 <= int(src_lengths.min()) <= int(src_lengths.max()) <= S, where,
               lambda: f"`src_lengths` must lie in 1..S = 1..{S}; got {src_lengths.tolist()}")
