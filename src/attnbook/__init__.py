"""attnbook: the library the attention book teaches. Read it in the book's order.

Reading map (chapter: module, what it holds)

    0    Attention at a glance ............. functional.attention   softmax(scores) @ values, one function
    1    The seq2seq bottleneck ............ tasks.reversal         the digit-reversal task, its batches
                                             models.seq2seq         GRU Encoder, BottleneckDecoder, Seq2Seq
                                             models.builder         build_model: the compared models by score
                                             train                  train_steps (the book's one training loop),
                                                                    train, sequence_loss, evaluate
    2    Attention in seq2seq .............. masks                  padding_mask (True on real tokens)
                                             functional             masked_softmax
                                             models.seq2seq         attention_step, AttentionDecoder
    3-5  Scaling, bilinear, additive ....... scores                 DotScore, ScaledDotScore, BilinearScore,
                                                                    AdditiveScore
                                             attention              Attention: a score, a masked softmax, a sum
    6    Queries, keys, values ............. positions              sinusoidal_positions, LearnedPositions
                                             multihead              MultiHeadAttention (projections, heads)
    7    Masking ........................... masks                  causal_mask, combine_masks, build_mask
    8    Multi-head attention .............. functional, multihead  split_heads, merge_heads,
                                                                    CausalSelfAttention
                                             tasks.repeat, train    the repeat task, train_repeat
    8b   The Transformer block ............. block                  TransformerBlock, DecoderBlock
                                             models.transformer     TinyTransformer
    8c   Cross-attention ................... models.encoder_decoder EncoderDecoder, next_token
                                                                    (greedy, temperature, top-k)
                                             tasks.dates            the dates task
    9    Attention at scale ................ tiled                  tiled_attention, online_softmax_step
                                                                    tiled_backward: the gradients, tile by tile
                                             kv_cache               KVCache
    11   Grouped-query, sliding windows .... multihead              CausalSelfAttention's num_kv_heads and window
                                             masks, kv_cache        causal_mask(window=W), the rolling KVCache
                                             interop                weight copies from and to other libraries:
                                                                    from_torch, to_torch, from_llama
    12   Induction heads ................... models.attention_only  AttentionOnlyTransformer (heads knocked out)
                                             tasks.induction        the induction task, head scores
                                             train                  train_induction
    13   Positions at length ............... positions              rope_frequencies (linear, YaRN, Llama 3.1),
                                                                    interleaved_to_half
                                             functional, multihead  sinks: a learned sink logit per head
    14   Attention in 2026 ................. multihead              CausalSelfAttention's qk_norm, gate,
                                                                    head_dim, scale, rotary_dim
                                             latent                 MultiHeadLatentAttention, LatentCache
                                             block                  SwiGLU, RMSNorm (today's block)
                                             interop                from_hf: the layers of transformers
    15   The bottleneck returns ............ linear                 linear_attention, gated_delta_rule

Shape letters used in every docstring and comment:
    B batch, H heads, L queries (query length), S keys/values (key length),
    E model width, D per-head width (E = H * D; the query/key width in attnbook.functional).

Masks: a boolean mask is True where a query may attend to a key; a floating mask is added to the
scores; a 2-D mask is (L, S); a (B, S) padding mask, True on real keys, goes in the argument
``key_mask`` everywhere (functions, modules, models and the dates batches).

The function ``attention`` lives in :mod:`attnbook.functional`; the package does not re-export it, so
that ``attnbook.attention`` stays the module that holds :class:`Attention`.
"""

from attnbook.attention import Attention
from attnbook.functional import masked_softmax
from attnbook.masks import causal_mask, combine_masks, padding_mask
from attnbook.models.builder import build_model
from attnbook.models.seq2seq import Seq2Seq, attention_step
from attnbook.models.transformer import TinyTransformer
from attnbook.multihead import CausalSelfAttention, MultiHeadAttention
from attnbook.scores import AdditiveScore, BilinearScore, DotScore, ScaledDotScore
from attnbook.tasks.reversal import ReversalTask
from attnbook import interop  # noqa: F401  (attaches from_torch, to_torch and from_llama to the classes)

__all__ = ["masked_softmax", "causal_mask", "combine_masks", "padding_mask",
           "Attention", "DotScore", "ScaledDotScore", "BilinearScore", "AdditiveScore",
           "MultiHeadAttention", "CausalSelfAttention", "TinyTransformer",
           "ReversalTask", "Seq2Seq", "attention_step", "build_model"]
__version__ = "0.1.0"
