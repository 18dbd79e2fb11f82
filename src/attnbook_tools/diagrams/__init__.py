"""Diagrams drawn from the code: each function takes real tensors or modules, runs them, and draws
what they did, with every shape read from the tensors.

Every function returns ``(figure, description)``. The :class:`Description` lists what the figure
shows (boxes with their labels and shapes, arrows, grids of cells, facts) as plain data: a
notebook cell asserts it and prints it (``print(description)``), so nbval checks the diagram
through its text, and ``description.alt_text()`` is the figure's alt text, made from the same
record as the picture. Each is laid out on the page's column, :data:`attnbook_tools.plots.COLUMN_INCHES`
wide, and one whose text would be smaller than 8 pt, overlap or run off the figure is refused
(:func:`legibility_problems`, the check every stored figure passes), as is one whose smallest text
would be under 8 CSS pixels on a phone, where the column is 342 pixels wide, or whose free labels
run over a box or a grid.

* :func:`draw_bottleneck`: chapter 1's GRU encoder-decoder without attention: the one final state.
* :func:`draw_encoder_decoder`: chapter 2's GRU encoder-decoder at one decoding step.
* :func:`draw_transformer_encoder_decoder`: chapter 8c's Transformer encoder-decoder on one batch.
* :func:`draw_qkv`: queries, keys and values, the scores, the softmax, the weighted sum.
* :func:`draw_heads`: splitting and merging heads, columns shaded by the head that owns them.
* :func:`draw_kv_cache`: the key/value cache and the causal mask over decoding steps.
* :func:`draw_online_softmax`: the online softmax walking over key tiles.
* :func:`draw_block`: a Transformer block's residual stream and sub-layers, from its forward.

Shapes:
    B batch, H heads, L queries, S keys/values, E model width, D = E / H per-head width.
"""

from attnbook_tools.diagrams.block import FlowStep, block_flow, draw_block
from attnbook_tools.diagrams.description import Arrow, Box, Description, Grid
from attnbook_tools.plots.legibility import legibility_problems
from attnbook_tools.diagrams.bottleneck import draw_bottleneck
from attnbook_tools.diagrams.decoding import DecodingStep, decoding_steps, draw_kv_cache
from attnbook_tools.diagrams.encoder_decoder import draw_encoder_decoder
from attnbook_tools.diagrams.heads import draw_heads, draw_qkv, head_columns
from attnbook_tools.diagrams.online_softmax import TileState, draw_online_softmax, online_softmax_states
from attnbook_tools.diagrams.transformer import draw_transformer_encoder_decoder

__all__ = [
    "Arrow", "Box", "Description", "Grid", "legibility_problems",
    "draw_bottleneck", "draw_encoder_decoder", "draw_transformer_encoder_decoder", "draw_qkv", "draw_heads", "head_columns",
    "DecodingStep", "decoding_steps", "draw_kv_cache",
    "TileState", "online_softmax_states", "draw_online_softmax",
    "FlowStep", "block_flow", "draw_block",
]
