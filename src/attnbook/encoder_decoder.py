"""A small Transformer encoder-decoder, its training on the dates task, and its command line.

The encoder reads the source with self-attention over every position (padding masked out of the
keys); the decoder writes the target one token at a time with causal self-attention and
*cross-attention*, whose queries come from the decoder and whose keys and values come from the
encoder's output (Vaswani et al., 2017). Both stacks are built from :mod:`attnbook.block`;
positions are the fixed sinusoids of :func:`attnbook.positions.sinusoidal_positions`.

Train and ship the book's dates model from the repository root::

    python -m attnbook.encoder_decoder --steps 2000 --out data

It writes ``dates_model.pt`` (configuration and state_dict) and ``dates_results.json`` (test
accuracy per format, training loss, training time) into ``data/`` and records them in the
manifest (:mod:`attnbook.datafiles`). With ``--dropout-study`` it runs instead the dropout study
of :mod:`attnbook.dropout_study`.

Shapes:
    B batch, S source length, L target length, E width, H heads, V vocabulary size.
    EncoderDecoder: src (B, S), src_key_mask (B, S), tgt_in (B, L) -> logits (B, L, V)
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import time
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import _checks as check
from . import dates
from .block import DecoderBlock, TransformerBlock
from .datafiles import DATA_DIR, load_checkpoint_file, load_json_file, record
from .positions import sinusoidal_positions
from .transformer import train_steps

__all__ = [
    "Attentions",
    "EncoderDecoder",
    "train_dates",
    "evaluate_dates",
    "DATES_CONFIG",
    "DATES_CHECKPOINT",
    "DATES_RESULTS",
    "save_model",
    "round_to_float16",
    "load_model",
    "load_dates_results",
    "main",
]


class Attentions(NamedTuple):
    """Every attention's weights, one (B, H, queries, keys) tensor per layer.

    encoder: (B, H, S, S) per encoder layer; decoder_self: (B, H, L, L) and cross: (B, H, L, S)
    per decoder layer.
    """

    encoder: list[Tensor]
    decoder_self: list[Tensor]
    cross: list[Tensor]


def _shape(t: object) -> object:
    return tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__


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
        forward: src (B, S), src_key_mask (B, S), tgt_in (B, L) -> logits (B, L, V)
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
        for name, value in (("vocab_size", vocab_size), ("max_len", max_len), ("embed_dim", embed_dim),
                            ("num_encoder_layers", num_encoder_layers), ("num_decoder_layers", num_decoder_layers)):
            check.positive_int("EncoderDecoder", name, value)
        if embed_dim % 2:
            raise ValueError(f"EncoderDecoder: `embed_dim` must be even (sinusoidal positions); got {embed_dim}")
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

    # ------------------------------------------------------------------ checks
    def _check_tokens(self, where: str, name: str, tokens: object) -> Tensor:
        check.token_ids(where, name, tokens, self.vocab_size)
        if not 1 <= tokens.shape[1] <= self.max_len:
            raise ValueError(f"{where}: `{name}` has length {tokens.shape[1]}; expected 1..max_len={self.max_len}")
        return tokens

    def _check_source(self, where: str, src: object, src_key_mask: object) -> None:
        src = self._check_tokens(where, "src", src)
        if src_key_mask is None:
            return
        if not isinstance(src_key_mask, Tensor) or src_key_mask.dtype != torch.bool:
            got = src_key_mask.dtype if isinstance(src_key_mask, Tensor) else type(src_key_mask).__name__
            raise TypeError(f"{where}: `src_key_mask` must be a bool tensor (True = real token); got {got}")
        if src_key_mask.shape != src.shape:
            raise ValueError(
                f"{where}: `src_key_mask` must have the shape of `src` (B, S) = {_shape(src)}; got {_shape(src_key_mask)}"
            )
        if src.shape[0] and not bool(src_key_mask.any(dim=1).all()):
            row = int((~src_key_mask.any(dim=1)).nonzero()[0])
            raise ValueError(f"{where}: `src_key_mask` row {row} is all False: every source needs a real token")

    # ------------------------------------------------------------------ the two stacks
    def _embed(self, embedding: nn.Embedding, tokens: Tensor) -> Tensor:
        return embedding(tokens) + self.positions[: tokens.shape[1]]  # (B, L, E)

    def encode(
        self, src: Tensor, src_key_mask: Tensor | None = None, *, need_weights: bool = False
    ) -> tuple[Tensor, list[Tensor]]:
        """Run the encoder: every source position attends to every real source position.

        Shapes:
            src (B, S), src_key_mask (B, S) -> memory (B, S, E), weights: layers x (B, H, S, S)
        """
        self._check_source("EncoderDecoder.encode", src, src_key_mask)
        x = self._embed(self.src_embedding, src)  # (B, S, E)
        weights = []
        for block in self.encoder:
            x, w = block(x, key_mask=src_key_mask, need_weights=need_weights)  # (B, S, E), (B, H, S, S)
            weights.append(w)
        return self.encoder_norm(x), weights  # (B, S, E)

    def decode(
        self, tgt_in: Tensor, memory: Tensor, src_key_mask: Tensor | None = None, *, need_weights: bool = False
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """Run the decoder over ``tgt_in`` (causal), reading the encoder's ``memory`` through
        cross-attention; return next-token logits at every target position.

        Shapes:
            tgt_in (B, L), memory (B, S, E), src_key_mask (B, S)
            -> logits (B, L, V), self weights: layers x (B, H, L, L), cross weights: layers x (B, H, L, S)
        """
        where = "EncoderDecoder.decode"
        tgt_in = self._check_tokens(where, "tgt_in", tgt_in)
        if not isinstance(memory, Tensor) or memory.dim() != 3 or memory.shape[-1] != self.embed_dim:
            raise ValueError(f"{where}: `memory` must be the encoder's output (B, S, E={self.embed_dim}); got {_shape(memory)}")
        if memory.shape[0] != tgt_in.shape[0]:
            raise ValueError(
                f"{where}: `tgt_in` and `memory` must have the same batch size B; got {_shape(tgt_in)} and {_shape(memory)}"
            )
        x = self._embed(self.tgt_embedding, tgt_in)  # (B, L, E)
        self_weights, cross_weights = [], []
        for block in self.decoder:
            x, ws, wc = block(x, memory, memory_key_mask=src_key_mask, need_weights=need_weights)  # (B, L, E)
            self_weights.append(ws)
            cross_weights.append(wc)
        logits = self.head(self.decoder_norm(x))  # (B, L, V)
        return logits, self_weights, cross_weights

    def forward(
        self,
        src: Tensor,
        src_key_mask: Tensor | None,
        tgt_in: Tensor,
        *,
        need_weights: bool = False,
    ) -> Tensor | tuple[Tensor, Attentions]:
        """Teacher forcing: the logits for every target position
        given the source and the target so far.

        Shapes:
            src (B, S), src_key_mask (B, S), tgt_in (B, L)
            -> logits (B, L, V)
            [, Attentions: encoder layers x (B, H, S, S),
            decoder_self layers x (B, H, L, L),
            cross layers x (B, H, L, S)]
        """
        where = "EncoderDecoder.forward"
        if not isinstance(need_weights, bool):
            raise TypeError(f"{where}: `need_weights` must be a "
                            f"bool; got {need_weights!r}")
        if (isinstance(src, Tensor) and isinstance(tgt_in, Tensor)
                and src.dim() == 2 and tgt_in.dim() == 2
                and src.shape[0] != tgt_in.shape[0]):
            raise ValueError(
                f"{where}: `src` and `tgt_in` must have the same "
                f"batch size B; got {_shape(src)} and "
                f"{_shape(tgt_in)}"
            )
        memory, encoder_weights = self.encode(  # (B, S, E)
            src, src_key_mask, need_weights=need_weights)
        logits, self_weights, cross_weights = self.decode(
            tgt_in, memory, src_key_mask, need_weights=need_weights)
        if need_weights:
            return logits, Attentions(
                encoder_weights, self_weights, cross_weights)
        return logits  # (B, L, V)

    @torch.no_grad()
    def generate(
        self,
        src: Tensor,
        src_key_mask: Tensor | None,
        max_new_tokens: int,
        *,
        sos_id: int = dates.SOS,
        eos_id: int = dates.EOS,
        pad_id: int = dates.PAD,
    ) -> Tensor:
        """Greedy decoding: encode once, then write the most likely token ``max_new_tokens`` times,
        re-running the decoder over the target so far at each step. After a sequence's ``eos_id``
        every position holds ``pad_id``; decoding stops early when every sequence has ended.
        Runs in eval mode and restores the mode afterwards.

        Shapes:
            src (B, S), src_key_mask (B, S) -> tokens (B, N) without the start token, N <= max_new_tokens
        """
        where = "EncoderDecoder.generate"
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens < self.max_len:
            raise ValueError(f"{where}: `max_new_tokens` must be an int in 1..{self.max_len - 1}; got {max_new_tokens!r}")
        was_training = self.training
        self.eval()
        try:
            memory, _ = self.encode(src, src_key_mask)  # (B, S, E)
            B = src.shape[0]
            tokens = torch.full((B, 1), sos_id, dtype=torch.long, device=src.device)  # (B, 1)
            done = torch.zeros(B, dtype=torch.bool, device=src.device)  # (B,)
            for _ in range(max_new_tokens):
                logits, _, _ = self.decode(tokens, memory, src_key_mask)  # (B, t, V)
                next_token = logits[:, -1].argmax(dim=-1)  # (B,)
                next_token = next_token.masked_fill(done, pad_id)  # (B,)
                tokens = torch.cat([tokens, next_token[:, None]], dim=1)  # (B, t + 1)
                done |= next_token == eos_id
                if bool(done.all()):
                    break
        finally:
            self.train(was_training)
        return tokens[:, 1:]  # (B, N)


# ----------------------------------------------------------------------------- dates
DATES_CONFIG = {
    "vocab_size": dates.VOCAB_SIZE, "max_len": 32, "embed_dim": 64, "num_heads": 4,
    "num_encoder_layers": 2, "num_decoder_layers": 2, "mlp_ratio": 4,
}
DATES_CHECKPOINT = "dates_model.pt"
DATES_RESULTS = "dates_results.json"


def _sequence_loss(logits: Tensor, tgt_out: Tensor) -> Tensor:
    """Mean cross-entropy over every target position. logits (B, L, V), tgt_out (B, L) -> ()."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1))


def train_dates(
    model: EncoderDecoder,
    *,
    steps: int = 2000,
    batch_size: int = 64,
    lr: float = 2e-3,
    warmup: int = 100,
    seed: int = 0,
    pool: Sequence[dates.DateExample] | None = None,
) -> list[float]:
    """Train ``model`` with AdamW (learning rate warmed up over ``warmup`` steps, then cosine decay
    to zero) and teacher forcing; return the loss of every step. Each batch holds fresh training
    dates of :mod:`attnbook.dates`, or, with ``pool``, examples drawn (with replacement) from that
    fixed training set. The batches are drawn from ``seed``.

    Shapes:
        batches src (batch_size, S), tgt_in and tgt_out (batch_size, 11)
    """
    for name, value in (("steps", steps), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"train_dates: `{name}` must be a positive int; got {value!r}")
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: min(1.0, (step + 1) / warmup) * 0.5 * (1.0 + math.cos(math.pi * step / steps)),
    )

    def batch_loss() -> Tensor:
        if pool is None:
            batch = dates.train_batch(batch_size, generator)
        else:
            batch = dates.make_batch([pool[i] for i in torch.randint(len(pool), (batch_size,), generator=generator)])
        return _sequence_loss(model(batch.src, batch.src_key_mask, batch.tgt_in), batch.tgt_out)

    return train_steps(model, optimizer, steps, batch_loss, schedule)


@torch.no_grad()
def evaluate_dates(model: EncoderDecoder, examples: Sequence[dates.DateExample]) -> list[str]:
    """Greedy translations of ``examples`` (in eval mode), as strings.

    Shapes:
        B examples -> B strings
    """
    batch = dates.make_batch(examples)
    tokens = model.generate(batch.src, batch.src_key_mask, dates.ISO_LENGTH + 1)  # (B, <= 11)
    return [dates.decode(row) for row in tokens]


def save_model(model: nn.Module, path: str | pathlib.Path, config: dict) -> None:
    """Save ``model``'s state_dict, in float16 (half the bytes in ``data/``), with ``config`` (its
    constructor's arguments and how it was trained).

    The model's own weights are rounded to the saved values, so that whatever is measured on it
    afterwards is what the saved file gives. Loading into a float32 model restores float32 weights
    holding exactly those values.

    Shapes:
        every tensor of the state_dict is saved with its own shape
    """
    torch.save({"config": dict(config), "state_dict": round_to_float16(model)}, path)


def round_to_float16(model: nn.Module) -> dict[str, Tensor]:
    """Round ``model``'s floating-point weights to float16 values, in place (they keep their dtype),
    and return its state_dict in float16: what :func:`save_model` writes.

    Shapes:
        every tensor keeps its shape
    """
    state = {k: v.detach().to(torch.float16) if v.is_floating_point() else v.detach().clone()
             for k, v in model.state_dict().items()}
    model.load_state_dict(state)  # copies the rounded values back, in the model's own dtype
    return state


def load_model(path: str | pathlib.Path = DATA_DIR / DATES_CHECKPOINT, expected: dict | None = None) -> tuple[EncoderDecoder, dict]:
    """Rebuild the model saved at ``path`` after checking its digest and configuration
    (:func:`attnbook.datafiles.load_checkpoint_file`); returns (model in eval mode, config).

    Shapes:
        the model maps src (B, S), src_key_mask (B, S), tgt_in (B, L) -> logits (B, L, V)
    """
    saved = load_checkpoint_file(path, {**DATES_CONFIG, **(expected or {})})
    config = saved["config"]
    model = EncoderDecoder(**{k: config[k] for k in DATES_CONFIG})
    model.load_state_dict(saved["state_dict"])
    return model.eval(), config


def load_dates_results(path: str | pathlib.Path = DATA_DIR / DATES_RESULTS) -> dict:
    """The results written by ``python -m attnbook.encoder_decoder`` (verified against the manifest).

    Shapes:
        no tensors
    """
    return load_json_file(path)


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: ``python -m attnbook.encoder_decoder --help``.

    Shapes:
        no tensors
    """
    parser = argparse.ArgumentParser(
        prog="python -m attnbook.encoder_decoder",
        description="Train the encoder-decoder on the dates task; save its checkpoint and results.",
    )
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 gives the same numbers on every machine)")
    parser.add_argument("--out", default=str(DATA_DIR))
    parser.add_argument("--dropout-study", action="store_true",
                        help="instead of the book's model, train the dropout study (a small fixed training set)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="seeds of the dropout study")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.dropout_study:
        from .dropout_study import run_dropout_study  # the study builds on this module

        run_dropout_study(args.seeds, out=args.out)
        return
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(args.seed)
    model = EncoderDecoder(**DATES_CONFIG)
    start, cpu = time.perf_counter(), time.process_time()
    losses = train_dates(model, steps=args.steps, seed=args.seed)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    config = {**DATES_CONFIG, "steps": args.steps, "seed": args.seed, "batch_size": 64, "lr": 2e-3}
    checkpoint, results_path = out / DATES_CHECKPOINT, out / DATES_RESULTS
    save_model(model, checkpoint, config)  # from here on the model holds the saved (rounded) weights
    examples = dates.test_set()
    predicted = evaluate_dates(model, examples)
    per_format: dict[str, list[int]] = {}
    for example, answer in zip(examples, predicted):
        per_format.setdefault(example.format, []).append(int(answer == example.iso))
    exact = sum(sum(v) for v in per_format.values()) / len(examples)
    results = {
        "config": config,
        "train_seconds": round(seconds, 1),
        "train_cpu_seconds": round(cpu, 1),
        "loss_every_10": [round(x, 4) for x in losses[::10]],
        "test_size": len(examples),
        "exact": exact,
        "exact_per_format": {name: sum(v) / len(v) for name, v in per_format.items()},
        "predictions": predicted,
    }
    results_path.write_text(json.dumps(results, indent=1) + "\n")
    record([checkpoint, results_path], out)
    print(f"dates model: {args.steps} steps in {seconds:.0f} s, exact match {exact:.3f} on {len(examples)} test dates")


if __name__ == "__main__":
    main()
