"""attnbook: the working implementations behind the attention book.

Shape letters used in every docstring and comment:
    B batch, H heads, L queries (query length), S keys/values (key length),
    E model width, D per-head width (E = H * D).

Masks: a boolean mask is True where a query may attend to a key.
"""

# Import the submodule `attention` before the function `attention`: importing a submodule binds
# its name on the package, which would otherwise hide the function (`from attnbook import attention`).
from .attention import Attention
from .functional import attention, masked_softmax
from .masks import causal_mask, combine_masks, padding_mask
from .scores import AdditiveScore, BilinearScore, DotScore, ScaledDotScore
from .multihead import CausalSelfAttention, MultiHeadAttention
from .transformer import TinyTransformer
from .data import ReversalTask
from .seq2seq import Seq2Seq, attention_step, build_model

__all__ = ["attention", "masked_softmax", "causal_mask", "combine_masks", "padding_mask",
           "Attention", "DotScore", "ScaledDotScore", "BilinearScore", "AdditiveScore",
           "MultiHeadAttention", "CausalSelfAttention", "TinyTransformer",
           "ReversalTask", "Seq2Seq", "attention_step", "build_model"]
__version__ = "0.1.0"
