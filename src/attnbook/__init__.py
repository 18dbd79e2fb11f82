"""attnbook: the working implementations behind the attention book.

Shape letters used in every docstring and comment:
    B batch, H heads, L queries (query length), S keys/values (key length),
    E model width, D per-head width (E = H * D; the query/key width in attnbook.functional).

Masks: a boolean mask is True where a query may attend to a key; a floating mask is added to the
scores; a 2-D mask is (L, S); a (B, S) padding mask goes in the argument ``key_mask``.

``attention`` is the function :func:`attnbook.functional.attention`. The module of the same name,
:mod:`attnbook.attention`, holds the :class:`Attention` module and re-exports the function; read
the module with ``from attnbook.attention import ...``.
"""

from attnbook.attention import Attention, attention
from attnbook.tasks.reversal import ReversalTask
from attnbook.functional import masked_softmax
from attnbook.masks import causal_mask, combine_masks, padding_mask
from attnbook.multihead import CausalSelfAttention, MultiHeadAttention
from attnbook.scores import AdditiveScore, BilinearScore, DotScore, ScaledDotScore
from attnbook.models.seq2seq import Seq2Seq, attention_step
from attnbook.models.builder import build_model
from attnbook.models.transformer import TinyTransformer

__all__ = ["attention", "masked_softmax", "causal_mask", "combine_masks", "padding_mask",
           "Attention", "DotScore", "ScaledDotScore", "BilinearScore", "AdditiveScore",
           "MultiHeadAttention", "CausalSelfAttention", "TinyTransformer",
           "ReversalTask", "Seq2Seq", "attention_step", "build_model"]
__version__ = "0.1.0"
