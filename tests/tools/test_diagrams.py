"""Diagrams drawn from the code: each description follows the tensors it was drawn from, the drawn
cells equal the package's own results, and every figure is legible at the column width."""

from __future__ import annotations

import json
import pathlib
import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from attnbook_tools import diagrams  # noqa: E402
from attnbook_tools.diagrams import (  # noqa: E402
    block_flow, decoding_steps, draw_block, draw_bottleneck, draw_encoder_decoder, draw_heads, draw_kv_cache,
    draw_online_softmax, draw_qkv, draw_transformer_encoder_decoder, head_columns, legibility_problems,
    online_softmax_states,
)
from attnbook.tiled import tiled_attention  # noqa: E402
from attnbook.functional import attention  # noqa: E402
from attnbook.masks import causal_mask  # noqa: E402
from attnbook.multihead import CausalSelfAttention, MultiHeadAttention  # noqa: E402
from attnbook_tools.plots import (  # noqa: E402
    COLUMN_INCHES, FIGURE_DPI, PAGE_FIGURE_WIDTH_PX, PNG_PAD_INCHES, figure_report, png_bytes, png_size,
)
from attnbook_tools.plots.legibility import MIN_PHONE_TEXT_PX, PHONE_FIGURE_WIDTH_PX, shown_text_px  # noqa: E402
from attnbook.models.builder import build_model  # noqa: E402
from attnbook.block import TransformerBlock  # noqa: E402
from attnbook_tools.ablations import AblationBlock  # noqa: E402
from attnbook.models.transformer import TinyTransformer  # noqa: E402

F64 = torch.float64
ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def check_figure(fig, description):
    """What every diagram must satisfy: legible on the page and on a phone, and alt text that names
    every shape drawn."""
    assert legibility_problems(fig) == []
    report = figure_report(fig)
    assert shown_text_px(report, min(PHONE_FIGURE_WIDTH_PX, report["png_px"][0])) >= MIN_PHONE_TEXT_PX, report
    alt = description.alt_text()
    assert "\n" not in alt and alt.startswith(f"Diagram: {description.title}.")
    for box in description.boxes.values():
        if box.shape is not None:
            assert box.shape_text() in alt
    assert description.text().endswith(f"alt text: {alt}")


# ----------------------------------------------------------------------------- Q, K, V
@pytest.mark.parametrize("heads", [3, 4])
def test_qkv_shapes_follow_the_module(heads):
    B, L, E = 2, 5, 12
    module = MultiHeadAttention(E, heads).eval()
    fig, d = draw_qkv(module, torch.randn(B, L, E))
    D = E // heads
    assert d.boxes["q"].shape == (B, heads, L, D) and d.boxes["q"].letters == ("B", "H", "L", "D")
    assert d.boxes["k"].shape == d.boxes["v"].shape == (B, heads, L, D)
    assert d.boxes["scores"].shape == d.boxes["weights"].shape == (B, heads, L, L)
    assert d.boxes["W_q"].shape == (E, E) and d.boxes["output"].shape == (B, L, E)
    assert f"split into {heads} heads of D = {D} columns" in d.summary
    assert d.facts["output equals the module's forward"] is True
    check_figure(fig, d)


def test_qkv_cross_attention_has_S_keys_and_the_memory_width():
    B, L, S, E, kdim = 1, 3, 7, 8, 6
    module = MultiHeadAttention(E, 2, kdim=kdim, vdim=kdim).eval()
    fig, d = draw_qkv(module, torch.randn(B, L, E), torch.randn(B, S, kdim))
    assert d.boxes["memory"].shape == (B, S, kdim) and d.boxes["W_k"].shape == (E, kdim)
    assert d.boxes["memory"].letters == ("B", "S", "Dk") and d.boxes["W_k"].letters == ("E", "Dk")
    assert d.boxes["k"].shape == (B, 2, S, E // 2) and d.boxes["scores"].shape == (B, 2, L, S)
    assert ("memory", "W_k") in {(a.start, a.end) for a in d.arrows}
    check_figure(fig, d)


def test_qkv_from_three_projections_has_no_heads():
    B, L, E, D = 2, 5, 6, 4
    projections = [nn.Linear(E, D, bias=False) for _ in range(3)]
    fig, d = draw_qkv(projections, torch.randn(B, L, E))
    assert d.boxes["q"].shape == (B, L, D) and d.boxes["W_v"].shape == (D, E)
    assert d.boxes["heads_out"].shape == (B, L, D) and "output" not in d.boxes
    assert d.boxes["v"].letters == ("B", "S", "D")  # values as wide as the queries: D, not Dv
    check_figure(fig, d)


def test_qkv_refuses_bad_inputs(raises_naming):
    with raises_naming(ValueError, "`query`", "(5, 8)"):
        draw_qkv(MultiHeadAttention(8, 2), torch.randn(5, 8))
    with raises_naming(TypeError, "`projections`"):
        draw_qkv(nn.Linear(8, 8), torch.randn(1, 5, 8))


# ----------------------------------------------------------------------------- heads
@pytest.mark.parametrize("E, H", [(12, 3), (12, 4), (8, 1)])
def test_heads_columns_follow_split_heads(E, H):
    fig, d = draw_heads(torch.randn(2, 5, E), H)
    D = E // H
    assert d.boxes["heads"].shape == (2, H, 5, D) and d.boxes["merged"].shape == (2, 5, E)
    assert d.facts["head_columns"] == {h: range(h * D, (h + 1) * D) for h in range(H)}
    owners = [c // D for c in range(E)]
    assert d.grids["x_columns"].as_tensor().tolist() == [owners]
    assert d.grids["merged_columns"].as_tensor().tolist() == [owners]
    check_figure(fig, d)


def test_heads_figure_shows_a_different_split(monkeypatch):
    """A split that interleaves the columns (head h gets h, h + H, ...) is drawn as such."""
    import attnbook_tools.diagrams.heads as module

    def interleaved_split(x, num_heads):  # (B, L, E) -> (B, H, L, D)
        B, L, E = x.shape
        return x.view(B, L, E // num_heads, num_heads).permute(0, 3, 1, 2)

    def interleaved_merge(x):  # (B, H, L, D) -> (B, L, E)
        B, H, L, D = x.shape
        return x.permute(0, 2, 3, 1).reshape(B, L, D * H)

    monkeypatch.setattr(module, "split_heads", interleaved_split)
    monkeypatch.setattr(module, "merge_heads", interleaved_merge)
    assert head_columns(8, 2) == {0: [0, 2, 4, 6], 1: [1, 3, 5, 7]}
    _, d = draw_heads(torch.randn(1, 3, 8), 2)
    assert d.grids["x_columns"].values == ((0, 1, 0, 1, 0, 1, 0, 1),)


def test_heads_refuses_a_width_the_heads_do_not_divide():
    with pytest.raises(ValueError, match="not divisible by num_heads=3"):
        draw_heads(torch.randn(1, 2, 8), 3)


# ----------------------------------------------------------------------------- KV cache
@pytest.mark.parametrize("chunks", [(3, 2, 1), (2, 2, 2), (1, 1, 1, 1)])
def test_kv_cache_cells_are_the_causal_mask(chunks):
    layer = CausalSelfAttention(8, 2).eval()
    T = sum(chunks)
    fig, d = draw_kv_cache(layer, torch.randn(1, T, 8), chunks)
    start = 0
    for k, n in enumerate(chunks):
        S = start + n
        assert torch.equal(d.grids[f"step {k}"].as_tensor(), causal_mask(n, S))  # bottom right
        assert d.boxes[f"step {k} keys"].shape == (1, 2, S, 4)
        start = S
    check_figure(fig, d)


def test_decoding_steps_replay_generate():
    torch.manual_seed(0)
    model = TinyTransformer(12, max_len=10, embed_dim=16, num_heads=2, num_layers=2).eval()
    prompt = torch.randint(0, 12, (1, 4))
    generated = model.generate(prompt, 3)
    steps = decoding_steps(model, prompt, num_new_tokens=3, layer=1)
    assert [s.token for s in steps] == generated[0, 4:].tolist()
    assert [(len(s.cached), len(s.new)) for s in steps] == [(0, 4), (4, 1), (5, 1)]
    assert steps[2].keys_shape == (1, 2, 6, 8)
    fig, d = draw_kv_cache(model, prompt, num_new_tokens=3)
    assert d.facts["tokens chosen"] == generated[0, 4:].tolist()
    check_figure(fig, d)


def test_decoding_steps_notice_a_mask_that_is_not_causal(monkeypatch):
    """The recorded cells come from the run: a layer that lets query 0 see the future is caught."""
    layer = CausalSelfAttention(8, 2).eval()
    attend = layer._attend
    monkeypatch.setattr(layer, "_attend", lambda q, k, v, **kw: attend(q, k, v, **{**kw, "is_causal": False}))
    with pytest.raises(AssertionError, match="not to causal_mask"):
        decoding_steps(layer, torch.randn(1, 4, 8), (4,))


def test_decoding_steps_refuse_bad_chunks(raises_naming):
    with raises_naming(ValueError, "`chunks`", "T = 4"):
        decoding_steps(CausalSelfAttention(8, 2), torch.randn(1, 4, 8), (2, 1))


# ----------------------------------------------------------------------------- online softmax
@pytest.mark.parametrize("block_size", [1, 3, 4, 10, 16])
def test_online_softmax_states_end_at_the_softmax(block_size):
    q, k, v = torch.randn(2, 3, 5, 4, dtype=F64), torch.randn(2, 3, 10, 4, dtype=F64), torch.randn(2, 3, 10, 2, dtype=F64)
    states, output = online_softmax_states(q, k, v, block_size)
    torch.testing.assert_close(output, tiled_attention(q, k, v, block_size=block_size))
    torch.testing.assert_close(output, attention(q, k, v)[0])
    assert [t.keys for t in states] == [range(j, min(j + block_size, 10)) for j in range(0, 10, block_size)]
    scores = q @ k.transpose(-2, -1) / 2.0  # (B, H, L, S), scale 1/sqrt(4)
    torch.testing.assert_close(states[-1].m, scores.amax(-1, keepdim=True))
    torch.testing.assert_close(states[-1].l, (scores - states[-1].m).exp().sum(-1, keepdim=True))
    assert torch.equal(states[0].correction, torch.zeros_like(states[0].correction))  # nothing summed yet
    for before, after in zip(states, states[1:]):
        assert bool((after.m >= before.m).all()) and bool((after.correction <= 1).all())


def test_online_softmax_diagram_shows_a_raised_maximum():
    q = torch.ones(1, 1, 1, dtype=F64)
    k = torch.tensor([1.0, 3.0, 0.5, 4.0, 2.0, -1.0], dtype=F64).view(1, 6, 1)  # scores = keys (E = 1)
    v = torch.randn(1, 6, 2, dtype=F64)
    fig, d = draw_online_softmax(q, k, v, 3)
    states = d.facts["states"]
    assert [s["m"] for s in states] == [3.0, 4.0]
    assert states[1]["c"] == round(torch.exp(torch.tensor(-1.0)).item(), 4)  # exp(3 - 4)
    assert d.facts["weights"] == [round(w, 2) for w in torch.softmax(k.view(6), 0).tolist()]
    assert d.grids["tiles"].values == ((0, 0, 0, 1, 1, 1),)
    assert "tile 1 raises it" in d.summary
    check_figure(fig, d)


def test_online_softmax_states_check_tiled_attention(monkeypatch):
    """The states are asserted to be tiled_attention's: a different tiled_attention is caught."""
    import attnbook_tools.diagrams.online_softmax as module

    monkeypatch.setattr(module, "tiled_attention", lambda q, k, v, **kw: tiled_attention(q, k, v, **kw) + 1e-3)
    with pytest.raises(AssertionError):
        online_softmax_states(torch.randn(3, 4), torch.randn(6, 4), torch.randn(6, 2), 2)


# ----------------------------------------------------------------------------- encoder-decoder
@pytest.mark.parametrize("hidden_dim", [16, 32])
def test_encoder_decoder_shows_greedy_decoding(hidden_dim):
    torch.manual_seed(0)
    model = build_model("dot", hidden_dim=hidden_dim).eval()
    source = [3, 5, 7, 9, 11]
    tokens, weights = model.greedy_decode(torch.tensor([source]), torch.tensor([5]))
    fig, d = draw_encoder_decoder(model, source, step=1)
    assert d.boxes["encoder_states"].shape == (1, 5, hidden_dim)
    assert d.boxes["decoder_state"].shape == d.boxes["context"].shape == (1, hidden_dim)
    assert d.facts["weights"] == [round(w, 2) for w in weights[0, 1].tolist()]
    from attnbook.tasks.reversal import to_symbols
    assert d.facts["next token"] == to_symbols([int(tokens[0, 1])])[0]
    check_figure(fig, d)


def test_encoder_decoder_refuses_what_it_cannot_draw(raises_naming):
    with raises_naming(TypeError, "`model`", "without attention"):
        draw_encoder_decoder(build_model(None, hidden_dim=8), [3, 4])
    with raises_naming(ValueError, "`source`", "13"):
        draw_encoder_decoder(build_model("dot", hidden_dim=8), [3] * 13)


@pytest.mark.parametrize("hidden_dim", [16, 32])
def test_bottleneck_shows_the_one_final_state_and_greedy_decoding(hidden_dim):
    torch.manual_seed(0)
    model = build_model("none", hidden_dim=hidden_dim).eval()
    source = [3, 5, 7, 9, 11]
    tokens, weights = model.greedy_decode(torch.tensor([source]), torch.tensor([5]))
    fig, d = draw_bottleneck(model, source)
    assert weights is None
    L = tokens.shape[1]
    assert d.boxes["encoder_states"].shape == (1, 5, hidden_dim)
    assert d.boxes["bottleneck"].shape == (1, hidden_dim)
    assert d.boxes["bottleneck"].label == f"h_5: {hidden_dim} numbers for the whole source"
    assert d.boxes["decoder_states"].shape == (1, L, hidden_dim)
    assert d.boxes["output"].shape == (1, L)
    from attnbook.tasks.reversal import to_symbols
    assert d.facts["output"] == " ".join(to_symbols(tokens[0].tolist()))
    assert d.facts["source"] == " ".join(to_symbols(source))
    assert d.facts["bottleneck width"] == hidden_dim
    # the one arrow from the encoder leaves its final state, the one arrow into the decoder leaves the bottleneck
    assert [(a.start, a.end) for a in d.arrows if a.end == "bottleneck"] == [("encoder_states", "bottleneck")]
    assert [a.start for a in d.arrows if a.end == "decoder_states"] == ["bottleneck", "output"]
    check_figure(fig, d)


def test_bottleneck_is_legible_on_a_phone_at_its_widest():
    """Six source tokens and seven written ones, the most it draws: still 8 CSS px on a phone."""
    torch.manual_seed(1)
    model = build_model("none", hidden_dim=8).eval()
    fig, d = draw_bottleneck(model, [3, 4, 5, 6, 7, 8], symbols=lambda ids: ["<eos>"] * len(ids))
    assert d.boxes["source"].shape == (1, 6)
    assert d.boxes["output"].shape == (1, 7)
    check_figure(fig, d)  # on the page and on a phone


def test_bottleneck_refuses_what_it_cannot_draw(raises_naming):
    with raises_naming(TypeError, "`model`", "with attention"):
        draw_bottleneck(build_model("dot", hidden_dim=8), [3, 4])
    with raises_naming(ValueError, "`source`", "7"):
        draw_bottleneck(build_model(None, hidden_dim=8), [3] * 7)


# ----------------------------------------------------------------------------- the block
class PostNormBlock(nn.Module):
    """x -> norm(x + attn(x)) -> norm(. + mlp(.)): the norms sit on the stream."""

    def __init__(self, E: int) -> None:
        super().__init__()
        self.attn = CausalSelfAttention(E, 2)
        self.norm1 = nn.LayerNorm(E)
        self.mlp = nn.Linear(E, E)
        self.norm2 = nn.LayerNorm(E)

    def forward(self, x):
        x = self.norm1(x + self.attn(x)[0])
        return self.norm2(x + self.mlp(x))


def test_block_flow_reads_the_forward():
    pre = {s.name: s for s in block_flow(TransformerBlock(16, 4), torch.randn(2, 5, 16))}
    assert [n for n, s in pre.items() if s.on_stream] == ["x", "add", "add_1", "output"]
    assert pre["add"].inputs == ("x", "dropout") and pre["dropout"].inputs == ("attn",)
    assert pre["norm2"].inputs == ("add",)
    post = {s.name: s for s in block_flow(PostNormBlock(8), torch.randn(1, 3, 8))}
    assert post["norm1"].on_stream and not post["attn"].on_stream  # post-norm: the norm is on the stream
    assert post["norm2"].on_stream  # the last norm too: the output is the normalised stream
    no_residual = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8))
    assert all(s.kind != "add" for s in block_flow(no_residual, torch.randn(1, 3, 8)))
    fig, d = draw_block(TransformerBlock(16, 4), torch.randn(2, 5, 16))
    assert d.boxes["attn"].shape == (2, 5, 16) and d.boxes["attn"].label == "attn: CausalSelfAttention"
    assert ("x", "add") in {(a.start, a.end) for a in d.arrows}
    check_figure(fig, d)


# What each variant of TransformerBlock draws: the steps on the stream (input, sums, norms the stream
# passes through, output) and the branches, in the order the forward runs them.
BLOCK_VARIANTS = {
    "pre-norm": ({}, ["x", "add", "add_1", "output"],
                 ["norm1", "attn", "dropout", "norm2", "mlp", "dropout_1"]),
    "post-norm": ({"norm": "post"}, ["x", "add", "norm1", "add_1", "norm2", "output"],
                  ["attn", "dropout", "mlp", "dropout_1"]),
    "no norm": ({"norm": None}, ["x", "add", "add_1", "output"], ["attn", "dropout", "mlp", "dropout_1"]),
    "no residual": ({"residual": False}, ["x", "output"],
                    ["norm1", "attn", "dropout", "norm2", "mlp", "dropout_1"]),
    "no MLP": ({"mlp": False}, ["x", "add", "output"], ["norm1", "attn", "dropout"]),
    "post-norm, no MLP": ({"norm": "post", "mlp": False}, ["x", "add", "norm1", "output"], ["attn", "dropout"]),
}


@pytest.mark.parametrize("variant", BLOCK_VARIANTS)
def test_block_diagram_says_what_each_variant_does(variant):
    options, stream, branches = BLOCK_VARIANTS[variant]
    block = AblationBlock(16, 4, **options) if options else TransformerBlock(16, 4)  # the variants: chapter 8b's
    fig, d = draw_block(block, torch.randn(2, 5, 16))
    assert d.facts["on the stream"] == stream and d.facts["branches"] == branches
    sums = stream.count("add") + stream.count("add_1")
    labels = {"norm1": "norm1: LayerNorm", "norm2": "norm2: LayerNorm", "attn": "attn: CausalSelfAttention",
              "dropout": "dropout: Dropout", "dropout_1": "dropout: Dropout", "mlp": "mlp: Sequential"}
    listed = ", ".join(labels[b] for b in branches)
    if sums:
        assert f"({sums} sum{'s' if sums > 1 else ''} marked +" in d.summary
        assert f"the branches on the right ({listed})" in d.summary
    else:
        assert f"no residual sum, so the input passes through every step in turn ({listed})" in d.summary
    norms_on_stream = [n for n in stream if n.startswith("norm")]
    if norms_on_stream:  # post-norm: each norm is applied to the stream right after its sum
        after = [f"{labels[n]} after the {k} +" for n, k in zip(norms_on_stream, ["1st", "2nd"])]
        assert f"the stream itself passes through {', '.join(after)}" in d.summary
        assert all(labels[n] not in d.summary.split("the branches on the right")[1] for n in norms_on_stream)
    else:
        assert "passes through norm" not in d.summary
    check_figure(fig, d)


# ----------------------------------------------------------------------------- the Transformer encoder-decoder
def test_transformer_encoder_decoder_is_drawn_from_its_forward():
    from attnbook.tasks import dates
    from attnbook.models.encoder_decoder import EncoderDecoder
    torch.manual_seed(0)
    model = EncoderDecoder(dates.VOCAB_SIZE, 32, embed_dim=16, num_heads=2, num_encoder_layers=2,
                           num_decoder_layers=1)
    batch = dates.make_batch([dates.render(dates.FIRST_DATE, "slashes"),
                              dates.render(dates.LAST_DATE, "weekday_month_ordinal")])
    B, S = batch.src.shape
    L = batch.tgt_in.shape[1]
    fig, d = draw_transformer_encoder_decoder(model, batch.src, batch.key_mask, batch.tgt_in, item=1)
    assert model.training  # put back as it was
    assert d.boxes["memory"].shape == (B, S, 16) and d.boxes["logits"].shape == (B, L, dates.VOCAB_SIZE)
    assert d.boxes["cross_attention"].shape == (B, 2, L, S) and d.boxes["self_attention"].shape == (B, 2, L, L)
    assert torch.equal(d.grids["key_mask"].as_tensor(), batch.key_mask)
    assert torch.equal(d.grids["decoder self-attention"].as_tensor(), causal_mask(L, L))
    assert d.facts["padded keys"] == int((~batch.key_mask).sum()) > 0
    assert d.facts["padded keys get cross-attention weight 0"] and d.facts["each cross-attention row sums to 1"]
    assert d.facts["padded keys get encoder self-attention weight 0"]
    assert "in each of its 2 blocks" not in d.summary and "in its block a causal self-attention" in d.summary
    assert d.facts["encoder layers"] == 2 and d.facts["decoder layers"] == 1
    assert ("memory", "cross_attention") in {(a.start, a.end) for a in d.arrows}
    assert ("key_mask", "cross_attention") in {(a.start, a.end) for a in d.arrows}
    check_figure(fig, d)


def test_transformer_encoder_decoder_refuses_what_it_cannot_draw(raises_naming):
    from attnbook.tasks import dates
    from attnbook.models.encoder_decoder import EncoderDecoder
    model = EncoderDecoder(dates.VOCAB_SIZE, 32, embed_dim=16, num_heads=2)
    batch = dates.make_batch([dates.render(dates.FIRST_DATE, "slashes")])
    with raises_naming(TypeError, "draw_transformer_encoder_decoder", "EncoderDecoder"):
        draw_transformer_encoder_decoder(build_model("dot", hidden_dim=8), batch.src, batch.key_mask,
                                         batch.tgt_in)
    with raises_naming(ValueError, "draw_transformer_encoder_decoder", "`item`"):
        draw_transformer_encoder_decoder(model, batch.src, batch.key_mask, batch.tgt_in, item=1)


# ----------------------------------------------------------------------------- legibility
def test_diagrams_refuse_what_would_not_fit(raises_naming):
    with raises_naming(ValueError, "draw_kv_cache", "17 positions"):
        draw_kv_cache(CausalSelfAttention(8, 2), torch.randn(1, 17, 8), (17,))
    with raises_naming(ValueError, "draw_online_softmax", "15 keys"):
        draw_online_softmax(torch.randn(1, 4), torch.randn(15, 4), torch.randn(15, 2), 5)


def test_legibility_problems_finds_small_overlapping_and_clipped_text():
    fig, ax = plt.subplots(figsize=(COLUMN_INCHES, 2), layout="none")  # whatever figure.autolayout says
    ax.axis("off")
    ax.text(0.5, 0.5, "one", fontsize=10, transform=ax.transAxes)
    ax.text(0.5, 0.5, "two", fontsize=10, transform=ax.transAxes)
    ax.text(0.1, 0.9, "tiny", fontsize=6, transform=ax.transAxes)
    ax.text(1.2, 0.5, "outside", fontsize=10, transform=ax.transAxes)
    problems = " ".join(legibility_problems(fig))
    assert "'one' overlaps text 'two'" in problems and "'tiny' is" in problems
    assert "'outside' runs off the figure" in problems
    wide, _ = plt.subplots(figsize=(2 * COLUMN_INCHES, 2))  # shown at under half its size on the page
    wide.axes[0].set_title("a title at 12 pt", fontsize=12)
    assert any("title 'a title at 12 pt' is" in p and "under 8 pt" in p for p in legibility_problems(wide))


def test_a_canvas_refuses_text_over_a_box_and_text_too_small_for_a_phone():
    from attnbook_tools.diagrams.canvas import Canvas
    canvas = Canvas("a test", "A title", 2.0)
    canvas.box("a", "a box", (1.0, 1.0), (1.0, 0.5), show_shape=False)
    canvas.text(1.85, 1.0, "over the box")  # a free label written across the box's edge
    with pytest.raises(ValueError, match="'over the box' overlaps"):
        canvas.finish("a box and a label on it")
    canvas = Canvas("a test", "A title", 2.0)
    canvas.text(3.0, 1.0, "small", size=8)  # 8 pt in a 608-pixel PNG: 6.25 px on a phone
    with pytest.raises(ValueError, match="'small' is 6.2 CSS px on a phone"):
        canvas.finish("a small label")


def test_a_diagram_is_as_wide_as_the_page_shows_it():
    """The column diagrams are laid out on is the page's figure width: stored with its margin, a
    diagram is exactly PAGE_FIGURE_WIDTH_PX wide, so the page shows it at its own size."""
    assert COLUMN_INCHES == PAGE_FIGURE_WIDTH_PX / FIGURE_DPI - 2 * PNG_PAD_INCHES
    fig, _ = draw_heads(torch.randn(2, 5, 8), 2)
    assert tuple(fig.get_size_inches())[0] == pytest.approx(COLUMN_INCHES)
    assert png_size(png_bytes(fig))[0] == PAGE_FIGURE_WIDTH_PX
    assert figure_report(fig)["page_px"] == PAGE_FIGURE_WIDTH_PX and figure_report(fig)["problems"] == []


def test_categories_differ_in_lightness_or_hatching():
    from attnbook_tools.diagrams.canvas import luminance, ramp
    from attnbook_tools.diagrams.decoding import ALLOWED, BLOCKED, CACHED, NEW
    for a, b in [(CACHED, NEW), (ALLOWED, BLOCKED)]:
        assert abs(luminance(a.face) - luminance(b.face)) > 0.3
    styles = ramp(6)
    for a, b in zip(styles, styles[1:]):
        assert a.hatch != b.hatch and luminance(b.face) > luminance(a.face) + 0.05


# ----------------------------------------------------------------------------- chapters
def diagram_alt_mismatches(notebook: dict) -> list[str]:
    """For every cell that prints a description ('alt text: ...') and glues one figure, the
    {glue:figure}'s :alt: must be that text, word for word."""
    printed = {}
    for cell in notebook["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        keys = re.findall(r"glue\(\s*[\"']([^\"']+)[\"']\s*,\s*fig", source)
        text = "".join("".join(o.get("text", "")) for o in cell.get("outputs", []) if o.get("name") == "stdout")
        alts = re.findall(r"^alt text: (.*)$", text, flags=re.M)
        if len(keys) == 1 and len(alts) == 1:
            printed[keys[0]] = alts[0]
    problems = []
    for cell in notebook["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        for key, body in re.findall(r"```\{glue:figure\}\s*(\S+)\n(.*?)```", "".join(cell["source"]), flags=re.S):
            alt = re.search(r"^:alt:\s*(.*)$", body, flags=re.M)
            if key in printed and (alt is None or alt.group(1).strip() != printed[key]):
                problems.append(f"{key}: the :alt: is not the printed alt text {printed[key]!r}")
    return problems


def test_diagram_alt_mismatches_catches_a_stale_alt():
    cell = {"cell_type": "code", "source": ['fig, d = draw_heads(x, 2)\nprint(d)\nglue("fig-08-split", fig)'],
            "outputs": [{"name": "stdout", "text": ["diagram: x\n", "alt text: Diagram: new words.\n"]}]}
    markdown = {"cell_type": "markdown", "source": ["```{glue:figure} fig-08-split\n:alt: Diagram: old words.\n"
                                                    "Caption.\n```"]}
    assert diagram_alt_mismatches({"cells": [cell, markdown]})
    markdown["source"] = ["```{glue:figure} fig-08-split\n:alt: Diagram: new words.\nCaption.\n```"]
    assert diagram_alt_mismatches({"cells": [cell, markdown]}) == []


def test_chapters_use_the_printed_alt_text_of_their_diagrams():
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        assert diagram_alt_mismatches(json.loads(path.read_text())) == [], path.name


def test_package_exports():
    for name in diagrams.__all__:
        assert hasattr(diagrams, name)
