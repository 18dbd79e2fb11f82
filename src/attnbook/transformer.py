"""A tiny decoder-only (causal) transformer, the problem that teaches it to look back, and its training loop.

The model: token embedding + learned positions, then ``num_layers`` pre-norm blocks
(``x + attention(norm(x))``, then ``x + mlp(norm(x))``), a final layer norm and a linear read-out to
the vocabulary. The attention is :class:`attnbook.multihead.CausalSelfAttention`, so the model can
decode with a :class:`attnbook.efficient.KVCache` per layer.

The problem (:func:`repeat_batch`): N random tokens followed by the same N tokens again. The first
half cannot be predicted; the second half can be, perfectly, but only by looking back N positions:
the problem forces an attention head that looks back.

Shapes:
    B batch, L tokens (new tokens when decoding with caches), S positions seen so far, E width,
    H heads, V vocabulary size.
    TinyTransformer: tokens (B, L) -> logits (B, L, V)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .efficient import KVCache
from .multihead import CausalSelfAttention
from .positions import LearnedPositions

__all__ = [
    "TransformerBlock",
    "TinyTransformer",
    "repeat_batch",
    "repeat_loss",
    "train_repeat",
    "evaluate_repeat",
]


class TransformerBlock(nn.Module):
    """One pre-norm block: causal multi-head self-attention and an MLP, each with a residual.

    Shapes:
        forward: x (B, L, E) -> (B, L, E), weights (B, H, L, S) or None
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        mlp_ratio: int = 4,
        dropout: float = 0.0,
        backend: str = "math",
        max_len: int | None = None,
    ) -> None:
        super().__init__()
        if isinstance(mlp_ratio, bool) or not isinstance(mlp_ratio, int) or mlp_ratio <= 0:
            raise ValueError(f"TransformerBlock: `mlp_ratio` must be a positive int; got {mlp_ratio!r}")
        self.norm1 = nn.LayerNorm(embed_dim)
        self.attn = CausalSelfAttention(embed_dim, num_heads, dropout=dropout, backend=backend, max_len=max_len)
        self.norm2 = nn.LayerNorm(embed_dim)
        layers = [nn.Linear(embed_dim, mlp_ratio * embed_dim), nn.GELU(), nn.Linear(mlp_ratio * embed_dim, embed_dim)]
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        self.mlp = nn.Sequential(*layers)

    def forward(
        self, x: Tensor, *, cache: KVCache | None = None, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        attended, weights = self.attn(
            self.norm1(x), cache=cache, need_weights=need_weights, average_attn_weights=False
        )  # (B, L, E), (B, H, L, S)
        x = x + attended  # (B, L, E)
        x = x + self.mlp(self.norm2(x))  # (B, L, E)
        return x, weights

    def _decode_plan(self) -> tuple:
        """What :meth:`_decode` needs, looked up once per :meth:`TinyTransformer.generate` call."""
        n1, n2 = self.norm1, self.norm2
        up, act, down = tuple(self.mlp._modules.values())[:3]  # dropout, if any, is off in eval mode
        return (
            self.attn, n1.normalized_shape, n1.weight, n1.bias, n1.eps, n2.weight, n2.bias, n2.eps,
            up.weight, up.bias, act.approximate, down.weight, down.bias,
        )

    @staticmethod
    def _decode(x: Tensor, cache: KVCache | None, plan: tuple) -> Tensor:
        """:meth:`forward` in eval mode without weights, for a decoding step whose inputs the
        model already checked: the same operations, called directly (``plan`` from :meth:`_decode_plan`).

        Shapes:
            x (B, L, E) -> (B, L, E)
        """
        attn, shape, w1, b1, eps1, w2, b2, eps2, up_w, up_b, approximate, down_w, down_b = plan
        h = F.layer_norm(x, shape, w1, b1, eps1)  # (B, L, E)
        attended, _ = attn._attend(h, cache, cache is not None, False, False)  # (B, L, E)
        x = x + attended  # (B, L, E)
        h = F.layer_norm(x, shape, w2, b2, eps2)  # (B, L, E)
        h = F.gelu(F.linear(h, up_w, up_b), approximate=approximate)  # (B, L, r*E)
        return x + F.linear(h, down_w, down_b)  # (B, L, E)


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

    Shapes:
        forward: tokens (B, L) -> logits (B, L, V); with ``need_weights=True`` also a list with one
        (B, H, L, S) tensor per layer.
    """

    def __init__(
        self,
        vocab_size: int,
        max_len: int,
        embed_dim: int = 64,
        num_heads: int = 4,
        num_layers: int = 2,
        mlp_ratio: int = 4,
        dropout: float = 0.0,
        *,
        backend: str = "math",
    ) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("max_len", max_len), ("num_layers", num_layers)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"TinyTransformer: `{name}` must be a positive int; got {value!r}")
        self.vocab_size, self.max_len = vocab_size, max_len
        self.embed_dim, self.num_heads, self.num_layers = embed_dim, num_heads, num_layers
        self.token_embedding = nn.Embedding(vocab_size, embed_dim)
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        self.positions = LearnedPositions(max_len, embed_dim)
        self.blocks = nn.ModuleList(
            TransformerBlock(
                embed_dim, num_heads, mlp_ratio=mlp_ratio, dropout=dropout, backend=backend, max_len=max_len
            )
            for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, vocab_size)

    def new_caches(self, batch_size: int, max_len: int | None = None) -> list[KVCache]:
        """One empty :class:`KVCache` per layer, for ``batch_size`` sequences of up to ``max_len``
        positions (default: the model's ``max_len``).

        Shapes:
            -> num_layers caches, each holding up to (B, H, max_len, D)
        """
        max_len = self.max_len if max_len is None else max_len
        if isinstance(max_len, bool) or not isinstance(max_len, int) or not 0 < max_len <= self.max_len:
            raise ValueError(
                f"TinyTransformer.new_caches: `max_len` must be an int in 1..{self.max_len}; got {max_len!r}"
            )
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
        where = "TinyTransformer.forward"
        if not isinstance(tokens, Tensor):
            raise TypeError(f"{where}: `tokens` must be a tensor; got {type(tokens).__name__}")
        if tokens.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"{where}: `tokens` must hold integer ids (int64); got dtype {tokens.dtype}")
        if tokens.dim() != 2:
            raise ValueError(f"{where}: `tokens` must be 2-D (B, L); got shape {tuple(tokens.shape)}")
        if caches is not None and (not isinstance(caches, (list, tuple)) or len(caches) != self.num_layers):
            got = len(caches) if isinstance(caches, (list, tuple)) else type(caches).__name__
            raise ValueError(f"{where}: `caches` must be a list of {self.num_layers} KVCache (one per layer); got {got}")
        offset = 0 if caches is None else len(caches[0])
        if offset + tokens.shape[1] > self.max_len:
            raise ValueError(
                f"{where}: {offset} cached + {tokens.shape[1]} new positions exceed max_len={self.max_len}"
            )
        x = self.positions(self.token_embedding(tokens), offset=offset)  # (B, L, E)
        all_weights = []
        for i, block in enumerate(self.blocks):
            x, weights = block(x, cache=None if caches is None else caches[i], need_weights=need_weights)
            all_weights.append(weights)
        logits = self.head(self.norm(x))  # (B, L, V)
        if need_weights:
            return logits, all_weights
        return logits

    def _decode_plan(self) -> tuple:
        """What :meth:`_decode` needs, looked up once per :meth:`generate` call."""
        n = self.norm
        return (
            self.token_embedding.weight, self.positions.table.weight,
            [block._decode_plan() for block in self.blocks],
            n.normalized_shape, n.weight, n.bias, n.eps, self.head.weight, self.head.bias,
        )

    @staticmethod
    def _decode(tokens: Tensor, caches: list[KVCache] | None, offset: int, plan: tuple) -> Tensor:
        """:meth:`forward` in eval mode for one step of :meth:`generate`, whose checks already
        cover ``tokens``, ``caches`` and ``offset`` (``plan`` from :meth:`_decode_plan`).

        Shapes:
            tokens (B, L) -> logits (B, L, V)
        """
        embedding, table, blocks, shape, norm_w, norm_b, eps, head_w, head_b = plan
        x = F.embedding(tokens, embedding)  # (B, L, E)
        x = x + table[offset : offset + tokens.shape[1]]  # (B, L, E)
        if caches is None:
            for block in blocks:
                x = TransformerBlock._decode(x, None, block)  # (B, L, E)
        else:
            for block, cache in zip(blocks, caches):
                x = TransformerBlock._decode(x, cache, block)  # (B, L, E)
        x = F.layer_norm(x, shape, norm_w, norm_b, eps)  # (B, L, E)
        return F.linear(x, head_w, head_b)  # (B, L, V)

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
        where = "TinyTransformer.generate"
        if not isinstance(prompt, Tensor) or prompt.dim() != 2 or prompt.shape[1] == 0:
            got = tuple(prompt.shape) if isinstance(prompt, Tensor) else type(prompt).__name__
            raise ValueError(f"{where}: `prompt` must be a non-empty (B, L0) tensor of token ids; got {got}")
        if isinstance(num_new_tokens, bool) or not isinstance(num_new_tokens, int) or num_new_tokens < 0:
            raise ValueError(f"{where}: `num_new_tokens` must be an int >= 0; got {num_new_tokens!r}")
        total = prompt.shape[1] + num_new_tokens
        if total > self.max_len:
            raise ValueError(
                f"{where}: prompt length {prompt.shape[1]} + num_new_tokens {num_new_tokens} = {total} "
                f"exceeds max_len={self.max_len}"
            )
        was_training = self.training
        self.eval()
        try:
            L0, steps = prompt.shape[1], []
            tokens = prompt.new_empty((prompt.shape[0], total))  # (B, L0 + N), filled as we go
            tokens[:, :L0] = prompt
            caches = self.new_caches(prompt.shape[0], total) if use_cache else None
            plan = self._decode_plan()
            for step in range(num_new_tokens):
                end = L0 + step
                if step == 0:  # the prompt, through the checked forward
                    logits = self(tokens[:, :end], caches=caches)[:, -1]  # (B, V)
                elif use_cache:  # only the newest token; the first step checked the rest
                    logits = self._decode(tokens[:, end - 1 : end], caches, end - 1, plan)[:, -1]  # (B, V)
                else:  # the whole sequence again
                    logits = self._decode(tokens[:, :end], None, 0, plan)[:, -1]  # (B, V)
                steps.append(logits)
                tokens[:, end] = logits.argmax(dim=-1)  # (B,)
        finally:
            self.train(was_training)
        if return_logits:
            V = self.vocab_size
            logits = torch.stack(steps, dim=1) if steps else prompt.new_zeros((prompt.shape[0], 0, V), dtype=torch.float32)
            return tokens, logits  # (B, L0 + N), (B, N, V)
        return tokens


# ----------------------------------------------------------------------------- the repeat problem
def repeat_batch(
    batch_size: int, half_len: int, vocab_size: int, *, generator: torch.Generator | None = None
) -> Tensor:
    """Sequences of ``half_len`` random tokens followed by the same tokens again.

    Shapes:
        -> tokens (B, 2N) with N = half_len
    """
    for name, value in (("batch_size", batch_size), ("half_len", half_len), ("vocab_size", vocab_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"repeat_batch: `{name}` must be a positive int; got {value!r}")
    first = torch.randint(vocab_size, (batch_size, half_len), generator=generator)  # (B, N)
    return torch.cat([first, first], dim=1)  # (B, 2N)


def repeat_loss(logits: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """Cross-entropy and accuracy of predicting the second half of a :func:`repeat_batch`.

    The logits at position t predict token t + 1, so positions N-1 .. 2N-2 predict the second half.

    Shapes:
        logits (B, 2N, V), tokens (B, 2N) -> loss (), accuracy ()
    """
    N = tokens.shape[1] // 2
    predicted = logits[:, N - 1 : -1]  # (B, N, V)
    target = tokens[:, N:]  # (B, N)
    flat_logits, flat_target = predicted.reshape(-1, predicted.shape[-1]), target.reshape(-1)  # (B*N, V), (B*N,)
    loss = F.cross_entropy(flat_logits, flat_target)
    accuracy = (predicted.argmax(dim=-1) == target).float().mean()
    return loss, accuracy


def train_repeat(
    model: TinyTransformer,
    *,
    steps: int = 200,
    batch_size: int = 32,
    half_len: int = 12,
    lr: float = 3e-3,
    weight_decay: float = 0.01,
    seed: int = 0,
) -> list[float]:
    """Train ``model`` on the repeat problem with AdamW; return the loss of every step.

    Shapes:
        batches of tokens (batch_size, 2 * half_len)
    """
    if 2 * half_len > model.max_len:
        raise ValueError(f"train_repeat: 2 * half_len = {2 * half_len} exceeds the model's max_len={model.max_len}")
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    model.train()
    losses = []
    for _ in range(steps):
        tokens = repeat_batch(batch_size, half_len, model.vocab_size, generator=generator)  # (B, 2N)
        loss, _ = repeat_loss(model(tokens), tokens)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses


@torch.no_grad()
def evaluate_repeat(
    model: TinyTransformer, *, num_sequences: int = 1000, half_len: int = 12, seed: int = 1
) -> tuple[float, float]:
    """Loss and accuracy on the second half of ``num_sequences`` fresh sequences (eval mode).

    Shapes:
        tokens (num_sequences, 2 * half_len) -> loss, accuracy (floats)
    """
    was_training = model.training
    model.eval()
    tokens = repeat_batch(num_sequences, half_len, model.vocab_size, generator=torch.Generator().manual_seed(seed))
    loss, accuracy = repeat_loss(model(tokens), tokens)
    model.train(was_training)
    return loss.item(), accuracy.item()
