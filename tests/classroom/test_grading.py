"""The grader: right answers get full marks, each typical mistake loses marks and is named,
hostile code (exceptions, endless loops, crashes) cannot break grading."""

from __future__ import annotations

import copy
import math
import os
import pathlib

import pytest
import torch
from torch import nn

from attnbook_classroom import grading
from attnbook_classroom.grading import Feedback, check
import grading_linear_answers
import grading_text_answers

# ----------------------------------------------------------------------------------------------
# Right answers, written the way a student would
# ----------------------------------------------------------------------------------------------


def good_masked_softmax(scores, mask):
    filled = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(filled, dim=-1).masked_fill(~mask, 0.0)


def good_sdpa(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is None:
        return torch.softmax(scores, dim=-1) @ v
    return good_masked_softmax(scores, mask.expand(scores.shape)) @ v


def good_causal(L, S):
    return torch.ones(L, S, dtype=torch.bool).tril(S - L)


def good_masked_attention(q, k, v, mask, additive):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + additive  # (B, L, S)
    scores = torch.where(mask, scores, float("-inf"))
    empty = ~mask.any(-1, keepdim=True)  # (L, 1): queries with no key left
    weights = torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    return weights @ v  # (B, L, Dv)


def min_fill_attention(q, k, v, mask, additive):  # exhibit 8: a finite fill, then the additive mask
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores.masked_fill(~mask, torch.finfo(q.dtype).min) + additive, dim=-1) @ v


def nan_row_attention(q, k, v, mask, additive):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + additive
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v


def good_split(x, num_heads):
    B, L, E = x.shape
    return x.reshape(B, L, num_heads, E // num_heads).transpose(1, 2)


def good_merge(x):
    B, H, L, D = x.shape
    return x.transpose(1, 2).reshape(B, L, H * D)


def good_mha(query, key, value, W_q, W_k, W_v, W_o, num_heads, mask=None):
    q, k, v = (good_split(t @ W.T, num_heads) for t, W in ((query, W_q), (key, W_k), (value, W_v)))
    if mask is not None:
        mask = mask[:, None]
    return good_merge(good_sdpa(q, k, v, mask)) @ W_o.T


class GoodMHA(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=False)

    def forward(self, query, key, value, mask=None):
        return good_mha(query, key, value, self.q_proj.weight, self.k_proj.weight, self.v_proj.weight,
                        self.out_proj.weight, self.num_heads, mask)


class ListMHA(GoodMHA):
    def __init__(self, embed_dim, num_heads):
        nn.Module.__init__(self)
        self.num_heads = num_heads
        self.layers = [nn.Linear(embed_dim, embed_dim, bias=False) for _ in range(4)]

    def forward(self, query, key, value, mask=None):
        return good_mha(query, key, value, *(m.weight for m in self.layers), self.num_heads, mask)


class NoOutMHA(GoodMHA):
    def __init__(self, embed_dim, num_heads):
        super().__init__(embed_dim, num_heads)
        del self.out_proj

    def forward(self, query, key, value, mask=None):
        q, k, v = (good_split(p(t), self.num_heads) for p, t in
                   ((self.q_proj, query), (self.k_proj, key), (self.v_proj, value)))
        return good_merge(good_sdpa(q, k, v, None if mask is None else mask[:, None]))


def good_s2s(decoder_state, encoder_states, key_mask):
    scores = (encoder_states @ decoder_state[:, :, None])[..., 0]  # (B, S)
    weights = good_masked_softmax(scores, key_mask)
    return (weights[:, :, None] * encoder_states).sum(1), weights


def good_final_state(outputs, lengths):
    return outputs[torch.arange(outputs.shape[0]), lengths - 1]


def good_masked_mean(outputs, mask):
    m = mask[:, :, None].to(outputs.dtype)
    return (outputs * m).sum(1) / m.sum(1).clamp(min=1)


def good_padding_mask(lengths, S):
    return torch.arange(S)[None, :] < lengths[:, None]


def good_scaled_scores(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


def entropy_of(weights_fn):
    """A mean-entropy answer (attention_entropy) from a function of (scores, scale) -> weights,
    and a function of the rows' entropies -> the answer."""
    def answer(q, k, scale, total=lambda h: h.mean()):
        w = weights_fn(q @ k.transpose(-2, -1), scale)
        return total(-torch.special.xlogy(w, w).sum(-1)).item()
    return answer


good_entropy = entropy_of(lambda s, scale: torch.softmax(scale * s, -1))


def good_bilinear(queries, weight, keys):
    return queries @ weight @ keys.transpose(1, 2)


def good_additive(queries, keys, W_q, W_k, v):
    return torch.tanh((queries @ W_q.T)[:, :, None] + (keys @ W_k.T)[:, None]) @ v


def good_qkv(x, W_q, W_k, W_v):
    return x @ W_q.T, x @ W_k.T, x @ W_v.T


def good_self_attention(x, W_q, W_k, W_v, mask=None):
    return good_sdpa(x @ W_q.T, x @ W_k.T, x @ W_v.T, mask)


def good_merge_state(a, b):
    (m1, l1, o1), (m2, l2, o2) = a, b
    m = torch.maximum(m1, m2)
    safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    c1, c2 = torch.exp(m1 - safe), torch.exp(m2 - safe)
    return m, c1 * l1 + c2 * l2, c1[..., None] * o1 + c2[..., None] * o2


def tile_backward_with(delta="rows", weights="lse", scale_q=True, scale_k=True, own_scale=False,
                       keys_axes=(-2, -1)):
    """Exercise 9.5 written here without attnbook, right or with a typical mistake: Δ from this
    tile's weights, weights normalised otherwise, the scale left out of a gradient, the argument
    `scale` replaced by 1/√D, or k transposed on axes that hold only for 3-D inputs."""
    def fn(q, k, v, out, lse, d_out, scale):
        if own_scale:
            scale = q.shape[-1] ** -0.5  # ignores the argument
        scores = scale * q @ k.transpose(*keys_axes)  # (..., L, Sb)
        p = {"lse": lambda: torch.exp(scores - lse), "raw": lambda: torch.exp(scores),
             "tile": lambda: torch.softmax(scores, -1)}[weights]()
        dp = d_out @ v.transpose(-2, -1)  # (..., L, Sb)
        d = {"rows": (d_out * out).sum(-1, keepdim=True), "tile": (p * dp).sum(-1, keepdim=True),
             "none": 0.0}[delta]
        ds = p * (dp - d)
        return ((scale if scale_q else 1.0) * ds @ k, (scale if scale_k else 1.0) * ds.transpose(-2, -1) @ q,
                p.transpose(-2, -1) @ d_out)
    return fn


def good_induction_score(w, first, second, n):
    """Exercise 12.1 written here without attnbook."""
    k = torch.arange(n - 1)
    rows = torch.arange(w.shape[0])[:, None]
    return w.permute(0, 2, 3, 1)[rows, second[:, None] + k, first[:, None] + k + 1].mean(dim=(0, 1))


def induction_with(shift=1, start=0, stop=None, reduce=(0, 1)):
    """Exercise 12.1 with a typical mistake: the key shifted, other queries, another average."""
    def fn(w, first, second, n):
        k = torch.arange(start, n - 1 if stop is None else stop)
        rows = torch.arange(w.shape[0])[:, None]
        keys = (first[:, None] + k + shift).clamp(max=w.shape[-1] - 1)
        return w.permute(0, 2, 3, 1)[rows, second[:, None] + k, keys].mean(dim=reduce)
    return fn


def _knock_answer(seed=3, kinds=None, metric=0, model_seed=0):
    """Exercise 12.2 measured here: the shipped model's copy loss with a head knocked out;
    ``kinds`` maps an answer key to the (layer, head) knocked out (default: the right heads);
    ``model_seed`` another shipped model than the seed-0 one the exercise asks for (a mistake)."""
    from attnbook.tasks.induction import copy_loss, induction_batch
    from attnbook_tools.induction import load_model, measure_heads, test_batch

    model, _ = load_model(model_seed)
    scores = measure_heads(model, test_batch())
    heads = {k: {divmod(int(torch.tensor(v).argmax()), 2)} for k, v in scores.items()}
    heads.update(kinds or {})
    tokens, first, second = induction_batch(500, 32, 8, 16, generator=torch.Generator().manual_seed(seed))
    answer = {"seed": seed}
    with torch.no_grad():
        for kind in ("previous_token", "induction"):
            out = copy_loss(model(tokens, knock_out=heads[kind]), tokens, first, second, 8)
            answer[kind] = out[metric].item()
    return answer


def good_kv_bytes(B, H, S, D, num_layers, dtype):
    return 2 * B * H * S * D * num_layers * torch.tensor([], dtype=dtype).element_size()


def good_decoding_flops(B, E, L0, N, num_layers, use_cache, mlp=16, cached_attention=True):
    """Projections 8·E² and MLP 16·E² per position fed; attention 4·E per query and key seen."""
    if use_cache:
        steps = [(L0, L0)] + [(1, L0 + t if cached_attention else 1) for t in range(1, N)]  # (L, S)
    else:
        steps = [(L0 + t, L0 + t) for t in range(N)]
    return num_layers * B * sum(L * (8 + mlp) * E * E + 4 * L * S * E for L, S in steps)


def good_rms_norm(x, weight, eps):
    return weight * x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def good_block_parameters(E, mlp_ratio):
    return {"attention": 4 * E * E + 4 * E, "mlp": 2 * mlp_ratio * E * E + mlp_ratio * E + E, "norms": 4 * E}


def good_greedy_decode(state, config, src, key_mask, steps):
    from attnbook.tasks import dates
    from attnbook.models.encoder_decoder import EncoderDecoder

    model = EncoderDecoder(**config)
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        memory, _ = model.encode(src, key_mask)
        target = torch.full((src.shape[0], 1), dates.SOS)
        ended = torch.zeros(src.shape[0], dtype=torch.bool)
        for _ in range(steps):
            logits, _, _ = model.decode(target, memory, key_mask)
            token = logits[:, -1].argmax(dim=-1).masked_fill(ended, dates.PAD)
            target = torch.cat([target, token[:, None]], dim=1)
            ended |= token == dates.EOS
    return target[:, 1:]


def rotary_with(layout="half", sign=1, exponent=lambda j, D: 2 * j / D, shift=0, own_positions=False):
    """apply_rotary as a student writes it; the options are the typical slips."""
    def fn(x, positions, base=10000.0):
        D = x.shape[-1]
        j = torch.arange(D // 2, dtype=torch.float64)
        where = torch.arange(x.shape[-2]) if own_positions else positions
        angles = (where.double() + shift)[:, None] * base ** (-exponent(j, D))  # (L, D/2)
        cos, sin = angles.cos().to(x.dtype), sign * angles.sin().to(x.dtype)
        if layout == "adjacent":
            x1, x2 = x[..., 0::2], x[..., 1::2]
            return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).flatten(-2)
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
    return fn


def score_with(sign=1, sine=True, layout="half", scale=False):
    """Exercise 10.2: the score of a rotated pair from its offset, with the typical slips."""
    def fn(q, k, offset, base=10000.0):
        D = q.shape[-1]
        h = D // 2
        angle = offset * base ** (-2 * torch.arange(h, dtype=torch.float64) / D)
        a, b = (q[:h], q[h:]) if layout == "half" else (q[0::2], q[1::2])
        c, d = (k[:h], k[h:]) if layout == "half" else (k[0::2], k[1::2])
        score = ((a * c + b * d) * angle.cos() + sine * sign * (a * d - b * c) * angle.sin()).sum()
        return float(score / math.sqrt(D) if scale else score)
    return fn


def to_half_with(order="right"):
    """Exercise 13.1: the rows of W_Q or W_K moved to the half layout, as a student writes it, with
    an index; the options are the typical slips."""
    def fn(weight, num_heads):
        HD, E = weight.shape
        D = HD // num_heads
        if order == "one_head":
            D, num_heads = HD, 1
        one = torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])  # (D,): 0, 2, ..., 1, 3, ...
        if order == "inverse":
            one = torch.argsort(one)
        rows = (torch.arange(num_heads)[:, None] * D + one).flatten()  # (H·D,)
        return weight[:, rows] if order == "columns" else weight[rows]
    return fn


def llama3_with(divide_all=False, blend="right", wavelength=lambda speed: 2 * math.pi / speed):
    """Exercise 13.1: Llama 3.1's table as a student writes it, a loop over the pairs; the options
    are the typical slips."""
    def fn(head_dim, base, factor, low, high, old):
        out = []
        for n in range(head_dim // 2):
            speed = base ** (-2 * n / head_dim)
            length = wavelength(speed)
            if divide_all or length > old / low:
                out.append(speed / factor)
            elif length < old / high:
                out.append(speed)
            else:
                s = (old / length - low) / (high - low)
                s = {"right": s, "reversed": 1 - s, "none": 0.0}[blend]
                out.append((1 - s) * speed / factor + s * speed)
        return torch.tensor(out, dtype=torch.float64)
    return fn


def sink_with(per_head=True, renormalise=False, scale_sink=False, exp_sink=True, value=False):
    """Exercise 13.2: attention with a sink logit per head, as a student writes it; the options are
    the typical slips."""
    def fn(q, k, v, sinks, mask=None):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, L, S)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        sink = (sinks if per_head else sinks[0].expand(sinks.shape))[:, None, None]  # (H, 1, 1)
        sink = sink / math.sqrt(q.shape[-1]) if scale_sink else sink
        top = torch.maximum(scores.amax(-1, keepdim=True), sink)  # (B, H, L, 1)
        e = (scores - top).exp()
        tail = (sink - top).exp() if exp_sink else sink * (-top).exp()
        weights = e / (e.sum(-1, keepdim=True) + tail)
        if renormalise:
            weights = weights / weights.sum(-1, keepdim=True)
        out = weights @ v
        return out + (tail / (e.sum(-1, keepdim=True) + tail)) * v[..., :1, :] if value else out
    return fn


def _extrapolation_answer(seed=3, first=32, delay=3, swap=False):
    """Exercise 10.3 as a student would run it: the shipped rotary model on 128 tokens."""
    from attnbook_tools.positions_study import delay_batch, load_position_model

    tokens = delay_batch(100, 128, generator=torch.Generator().manual_seed(seed))  # (B, L)
    answer = {"seed": seed}
    for name, window in (("trained", None), ("window", 32)):
        with torch.no_grad():
            logits = load_position_model("rotary", window=window)(tokens)  # (B, L, V)
        right = logits[:, first:].argmax(-1) == tokens[:, first - delay: tokens.shape[1] - delay]
        answer[name] = right.float().mean().item()
    if swap:
        answer["trained"], answer["window"] = answer["window"], answer["trained"]
    return answer
def gqa_with(order="interleave", scale=True):
    """Exercise 11.1: grouped-query attention as a student writes it; the options are the typical slips."""
    def fn(q, k, v, mask=None):
        groups = q.shape[1] // k.shape[1]
        if order == "interleave":  # 0, 0, 1, 1, ...: each key/value head serves consecutive query heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        else:  # 0, 1, 0, 1, ...
            k, v = k.repeat(1, groups, 1, 1), v.repeat(1, groups, 1, 1)
        scores = q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale else 1.0)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v
    return fn


def window_with(before=1, alignment="bottom", direction=1):
    """Exercise 11.2: the sliding-window mask; ``before=0`` lets W keys before the query in."""
    def fn(L, S, W):
        i = torch.arange(L)[:, None] + (S - L if alignment == "bottom" else 0)  # (L, 1)
        j = torch.arange(S)[None, :]  # (1, S)
        if direction < 0:
            return (j >= i) & (j < i + W)
        return (j <= i) & (j > i - W - 1 + before)
    return fn


WINDOW_CACHE = {"full": 2 * 32 * 32 * 16384 * 128 * 2, "grouped": 2 * 32 * 8 * 16384 * 128 * 2,
                "window": 2 * 32 * 8 * 4096 * 128 * 2}


def smallest_sharp_scale(sharp):
    """Exercise 0.4 measured here without attnbook: the smallest scale at which ``sharp(row
    maxima)`` holds for the chapter's keys (the, cat, sat, down), by bisection."""
    keys = torch.tensor([[0.1, 0.0], [2.0, 0.2], [0.2, 2.0], [0.0, 1.0]], dtype=torch.float64)
    low, high = 0.01, 1000.0
    while high - low > 1e-6:
        middle = (low + high) / 2
        top = torch.softmax(middle * keys @ keys.T, dim=-1).max(dim=-1).values
        low, high = (low, middle) if sharp(top) else (middle, high)
    return high


def good_cross_zeros(B, H, L, lengths):
    S = max(lengths)
    real = torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]
    return (B, H, L, S), (~real)[:, None, None, :].expand(B, H, L, S)


def _spread_answer(seed=0):
    from attnbook_classroom.grading.ch08b_transformer_block import spreads_per_block

    return {"seed": seed, "no_norm": spreads_per_block("no_norm", seed)[-1],
            "post_norm": spreads_per_block("post_norm", seed)[-1]}


def _padding_fraction_answer(seed=3):
    from attnbook.tasks.reversal import PAD, ReversalTask, make_batch

    sources, targets = ReversalTask(min_len=4, max_len=24).sample(64, seed=seed)
    tgt_out = make_batch(sources, targets).tgt_out
    return {"seed": seed, "fraction": (tgt_out == PAD).sum().item() / tgt_out.numel()}


def _after_softmax_answer(seed=5, lost=None, renormalise=True):
    """Exercise 7.4 measured here without attnbook: the weight a softmax over all keys puts on the
    future keys (lost when they are zeroed), and how far renormalised rows are from masking first."""
    scores = torch.randn(64, 16, 16, generator=torch.Generator().manual_seed(seed))  # (B, L, S)
    allowed = torch.ones(16, 16, dtype=torch.bool).tril() if lost is None else lost  # (L, S)
    full = torch.softmax(scores, dim=-1)
    kept = full * allowed
    right = torch.softmax(scores.masked_fill(~allowed, NEG_INF), dim=-1)
    rows = kept / kept.sum(-1, keepdim=True) if renormalise else kept
    return {"seed": seed, "lost": (full * ~allowed).sum(-1).mean().item(),
            "renormalised": (rows - right).abs().max().item()}


def _rescales_answer(seed=7, tile_counts=None):
    """Exercise 9.3 measured here without attnbook: per tile size, the tiles after the first that
    raise a query's running maximum, summed over the queries."""
    torch.manual_seed(seed)
    scores = torch.randn(8, 256, dtype=torch.float64)  # (L, S)
    counts = {}
    for tile in (16, 1):
        tile_max = scores.view(8, -1, tile).amax(-1)  # (L, tiles)
        before = tile_max.cummax(dim=1).values[:, :-1]  # (L, tiles - 1): the maximum so far
        raised = tile_max[:, 1:] > before  # (L, tiles - 1)
        counts[tile] = (tile_counts or (lambda r: int(r.sum())))(raised)
    return {"seed": seed, "tiles_of_16": counts[16], "tiles_of_1": counts[1]}


def _weakest_month_answer():
    from attnbook_classroom.grading.ch08c_cross_attention import month_weight_by_format

    last, _ = month_weight_by_format()
    name = min(last, key=last.get)
    return {"format": name, "weight": last[name]}


def _helga_answer(share=0.5, scale_key=True, words=4, doubled=2.0, step=1e-5):
    """Exercise 2.3 measured here without attnbook: scan the length of Helga's vector (the query,
    and her key unless ``scale_key`` is False) in steps of ``step`` among the first ``words``
    words; then her weight at ``doubled`` times that length."""
    vectors = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.6, 0.8], [0.0, -0.6, 0.8]])[:words]

    def weight(m):
        keys = vectors.clone()
        keys[0] *= m if scale_key else 1.0
        return torch.softmax(keys @ (m * vectors[0]), dim=-1)[0].item()

    low, high = 0.0, 10.0
    while high - low > step:
        middle = (low + high) / 2
        low, high = (low, middle) if weight(middle) >= share else (middle, high)
    length = high if step < 1e-3 else step * math.ceil(high / step)
    return {"share": share, "length": length, "doubled": weight(doubled * length)}


def _related_batch(seed):
    """Exercise 4.4's batch, drawn as its provided cell draws it."""
    D, S, n = 16, 8, 2000
    shift = torch.roll(torch.arange(D), 1)
    g = torch.Generator().manual_seed(seed)
    queries, keys = torch.randn(n, 1, D, generator=g), torch.randn(n, S, D, generator=g)
    keys[:, 0] = queries[:, 0, shift] + 0.3 * torch.randn(n, D, generator=g)
    return queries, keys, shift


def _rearrangement_answer(seed=0, transpose=False):
    queries, keys, shift = _related_batch(seed)
    D = shift.numel()
    undo = torch.zeros(D, D)
    undo[shift, torch.arange(D)] = 1.0
    answer = {"seed": seed}
    for name, W in (("identity", torch.eye(D)), ("rearrangement", undo.T if transpose else undo)):
        answer[name] = ((queries @ W @ keys.transpose(1, 2))[:, 0].argmax(-1) == 0).float().mean().item()
    return answer


def _self_weight_answer(seed=0, scale=True, diagonal=True, shared_key="W_q"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 16, 32, generator=g)
    W_q = torch.randn(8, 32, generator=g) * 32**-0.5
    W_k = torch.randn(8, 32, generator=g) * 32**-0.5
    answer = {"seed": seed}
    for name, (Wa, Wb) in (("separate", (W_q, W_k)), ("shared", (W_q, W_q) if shared_key == "W_q" else (W_k, W_k))):
        scores = (x @ Wa.T) @ (x @ Wb.T).transpose(-2, -1) / (math.sqrt(8) if scale else 1.0)
        w = torch.softmax(scores, dim=-1)
        answer[name] = (torch.diagonal(w, dim1=-2, dim2=-1) if diagonal else w).mean().item()
    return answer


def _heads_answer(seed=0, out="columns", reduce="max", only="q"):
    """Exercise 8.5 as a student would run it: the heads reordered by indexing (3, H, D, E) views."""
    from attnbook.multihead import MultiHeadAttention

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        E, H, order = 16, 4, [2, 0, 3, 1]
        mha = MultiHeadAttention(E, H).eval()
        x = torch.randn(2, 10, E)
    answer = {"seed": seed}
    with torch.no_grad():
        before = mha(x, x, x)[0]
        for name, blocks in (("all_heads", "qkv"), ("queries_only", only)):
            other = copy.deepcopy(mha)
            for b in blocks:
                heads = getattr(other, f"{b}_proj").weight.view(H, E // H, E)  # (H, D, E): rows by head
                heads.copy_(heads[order].clone())
            W_o = other.out_proj.weight.view(E, H, E // H)  # (E, H, D): columns by head
            if name == "all_heads" and out == "columns":
                W_o.copy_(W_o[:, order].clone())
            elif name == "all_heads" and out == "rows":
                other.out_proj.weight.copy_(other.out_proj.weight.view(H, E // H, E)[order].reshape(E, E))
            change = (other(x, x, x)[0] - before).abs()
            answer[name] = (change.max() if reduce == "max" else change.mean()).item()
    return answer



def bootstrap(levels=(0.025, 0.975), mode="paired", swap=False):
    """A paired bootstrap over seeds as exercise 5b.5 asks, or one of its typical wrong versions."""
    def run(a, b, n_resamples=10_000, seed=0):
        generator = torch.Generator().manual_seed(seed)
        d = b - a if swap else a - b
        if mode == "entries":  # every (seed, length) accuracy resampled on its own
            flat = d.reshape(-1)
            means = flat[torch.randint(flat.numel(), (n_resamples, flat.numel()), generator=generator)].mean(1)
        elif mode == "unpaired":  # the seeds of a and of b drawn apart
            rows_a = torch.randint(a.shape[0], (n_resamples, a.shape[0]), generator=generator)
            rows_b = torch.randint(a.shape[0], (n_resamples, a.shape[0]), generator=generator)
            means = a[rows_a].mean(dim=(1, 2)) - b[rows_b].mean(dim=(1, 2))
        else:
            rows = torch.randint(a.shape[0], (n_resamples, a.shape[0]), generator=generator)
            means = d[rows].mean(dim=(1, 2))
        low, high = torch.quantile(means, torch.tensor(levels, dtype=means.dtype))
        return d.mean().item(), low.item(), high.item()
    return run


def fit_weight(pairs="ij", unknowns="ab"):
    """Exercise 4.5 by least squares on the flattened pairs; the other orders are typical slips."""
    def fn(queries, keys, scores):
        L, Dq = queries.shape
        S, Dk = keys.shape
        A = torch.einsum(f"ia,jb->{pairs}{unknowns}", queries, keys).reshape(L * S, Dq * Dk)
        return torch.linalg.lstsq(A, scores.reshape(L * S, 1)).solution.reshape(Dq, Dk)
    return fn


class _Lazy(dict):
    """Answers that are measured (an experiment's result): computed when a test asks for them."""

    def __init__(self, answers, **makers):
        super().__init__(answers)
        self._makers = makers

    def __getitem__(self, key):
        value = dict.__getitem__(self, key)
        if value is None and key in self._makers:
            value = self._makers[key]()
            dict.__setitem__(self, key, value)
        return value



def good_qk_norm(q, k, v, qw, kw, after=False, causal=True):
    from attnbook.functional import attention
    from attnbook.positions import apply_rotary

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    pos = torch.arange(q.shape[-2])
    if after:
        q, k = norm(apply_rotary(q, pos), qw), norm(apply_rotary(k, pos), kw)
    else:
        q, k = apply_rotary(norm(q, qw), pos), apply_rotary(norm(k, kw), pos)
    return attention(q, k, v, is_causal=causal)[0]


LATENT_CACHE = {"latent": 61 * 32768 * 2 * (512 + 64), "mha": 61 * 32768 * 2 * 128 * (192 + 128)}

GOOD = {
    "masked_softmax": good_masked_softmax,
    "scaled_dot_product_attention": good_sdpa,
    "weights_shape": lambda B, H, L, S, E, Ev: ((B, H, L, S), (B, H, L, Ev)),
    "sharp_scale": smallest_sharp_scale(lambda top: bool((top > 0.9).all())),
    "causal_mask": good_causal,
    "pick_causal_mask": {"square": "AC", "cache": {"C"}},
    "masked_attention": good_masked_attention,
    "mask_after_softmax": None,  # measured: _Lazy computes it
    "split_heads": good_split,
    "multi_head_flops": lambda B, L, S, E, H: 4 * B * (L + S) * E * E + 4 * B * L * S * E,
    "multi_head_forward": good_mha,
    "seq2seq_attention_step": good_s2s,
    "final_state": good_final_state,
    "masked_mean": good_masked_mean,
    "bottleneck_parameters": lambda V, E, H: 2 * (V * E + 3 * (E * H + H * H + 2 * H)) + H * V + V,
    "padding_fraction": None,  # measured: _Lazy computes it
    "padding_mask": good_padding_mask,
    "helga_length": None,  # measured: _Lazy computes it
    "padded_weights": lambda lengths, S: ((len(lengths), S), [1.0 if n else 0.0 for n in lengths]),
    "scaled_dot_scores": good_scaled_scores,
    "score_variance_scale": lambda D, vq, vk: (D * vq * vk, 1 / math.sqrt(D * vq * vk)),
    "softmax_temperature": lambda scores, t: torch.softmax(scores / t, dim=-1),
    "attention_entropy": good_entropy,
    "bilinear_score": good_bilinear,
    "bilinear_equals_dot": lambda D: torch.eye(D) / math.sqrt(D),
    "bilinear_cost": lambda L, S, Dq, Dk: (Dq * Dk, L * Dq * Dk + L * S * Dk),
    "rearrangement_accuracy": None,
    "additive_score": good_additive,
    "additive_concat": lambda W_q, W_k: torch.cat([W_q, W_k], dim=1),
    "additive_peak_memory": {"concat": 4 * 40 * 30 * 2 * (16 + 48), "broadcast": 4 * (40 * 30 * 9 + 70 * 8)},
    "score_parameter_count": lambda Dq, Dk, Dh: {"dot": 0, "scaled_dot": 0, "bilinear": Dq * Dk,
                                                  "additive": Dh * Dq + Dh * Dk + Dh + Dh},
    "score_widths": {"bilinear", "additive"},
    "longest_exact": {"dot": 0.47, "scaled_dot": 0.35},  # data/results.json, seed 2, length 24
    "low_rank_score": lambda q, U_q, U_k, k: q @ U_q @ U_k.T @ k.transpose(-2, -1),
    "paired_bootstrap": bootstrap(),
    "qkv_projection": good_qkv,
    "self_attention": good_self_attention,
    "position_dot": lambda offset, E: sum(math.cos(offset * 10000 ** (-2 * k / E)) for k in range(E // 2)),
    "self_weight": None,
    "online_softmax_merge": good_merge_state,
    "online_softmax_rescales": None,  # measured: _Lazy computes it
    "kv_cache_bytes": good_kv_bytes,
    "rms_norm": good_rms_norm,
    "block_spread": None,  # measured: _Lazy computes it
    "block_parameters": good_block_parameters,
    "greedy_decode": good_greedy_decode,
    "weakest_month_format": None,
    "cross_attention_zeros": good_cross_zeros,
    "decoding_flops": good_decoding_flops,
    "tile_backward": tile_backward_with(),
    "heads_interchangeable": None,  # measured: _Lazy computes it
    "fit_bilinear_weight": fit_weight(),
    "apply_rotary": rotary_with(),
    "rotary_score": score_with(),
    "rotary_extrapolation": None,  # measured: _Lazy computes it
    "grouped_query_attention": gqa_with(),
    "sliding_window_mask": window_with(),
    "window_cache_bytes": WINDOW_CACHE,
    "induction_score": good_induction_score,
    "knock_out_heads": None,  # measured: _Lazy computes it
    "induction_attends": {"induction": 4, "previous_token": 8, "copying": "b"},
    "to_half_layout": to_half_with(),
    "llama3_frequencies": llama3_with(),
    "sink_attention": sink_with(),
    "qk_norm_attention": good_qk_norm,
    "absorbed_scores": lambda q, c, w: torch.einsum("bhld,hdc->bhlc", q, w) @ c[:, None].transpose(-2, -1),
    "latent_cache_bytes": LATENT_CACHE,
    "delta_rule_step": grading_linear_answers.good_delta_step,
    "chunked_linear_attention": grading_linear_answers.good_chunked,
    "recall_capacity": None,  # measured: _Lazy computes it
    "bracket_score": grading_text_answers.good_bracket_score,
    "knock_out_bracket": None,  # measured: _Lazy computes it
    "bracket_predict": grading_text_answers.PREDICTED,
}

# Measured answers (experiments) are computed when a test asks for them.
GOOD = _Lazy(GOOD, block_spread=_spread_answer, weakest_month_format=_weakest_month_answer,
             padding_fraction=_padding_fraction_answer, helga_length=_helga_answer,
             rearrangement_accuracy=_rearrangement_answer, self_weight=_self_weight_answer,
             mask_after_softmax=_after_softmax_answer, online_softmax_rescales=_rescales_answer,
             heads_interchangeable=_heads_answer, rotary_extrapolation=_extrapolation_answer,
             knock_out_heads=_knock_answer, recall_capacity=grading_linear_answers.recall_answer,
             knock_out_bracket=grading_text_answers.knock_bracket_answer)


def test_every_exercise_has_a_right_answer_here():
    assert set(GOOD) == set(grading.exercise_ids())


@pytest.mark.parametrize("exercise_id", sorted(GOOD))
def test_right_answer_gets_full_marks(exercise_id):
    feedback = check(exercise_id, GOOD[exercise_id])
    assert feedback.passed, str(feedback)
    assert feedback.score == feedback.max_score == len(grading.parts(exercise_id)) >= 1
    assert feedback.messages == []
    assert feedback.assert_passed() is feedback


@pytest.mark.parametrize("fn", [
    lambda x, h: torch.stack(x.chunk(h, dim=-1), dim=1),
    lambda x, h: x.view(x.shape[0], x.shape[1], h, -1).permute(0, 2, 1, 3),
    lambda x, h: x.unflatten(-1, (h, -1)).transpose(1, 2).contiguous(),
])
def test_other_right_ways_to_split_heads_pass(fn):
    assert check("split_heads", fn).passed


def test_module_class_gets_full_marks():
    feedback = check("multi_head_forward", GoodMHA)
    assert feedback.passed, str(feedback)


@pytest.mark.parametrize("exercise_id", sorted(GOOD))
def test_hidden_seed_also_passes(exercise_id):
    assert check(exercise_id, GOOD[exercise_id], seed=1).passed


# ----------------------------------------------------------------------------------------------
# Typical mistakes: each loses marks and is named
# ----------------------------------------------------------------------------------------------

NEG_INF = float("-inf")


def ms_fill(fill, dim=-1, zero=False, polarity=True):
    def fn(scores, mask):
        blocked = ~mask if polarity else mask
        w = torch.softmax(scores.masked_fill(blocked, fill), dim=dim)
        return w.masked_fill(blocked, 0.0) if zero else w
    return fn


def sdpa_with(scale="sqrt", fill=None, after=False, dim=-1, transpose="ok", polarity=True,
              return_weights=False):
    def fn(q, k, v, mask=None):
        kt = {"ok": k.transpose(-2, -1), "T": k.T, "01": k.transpose(0, 1), "none": k}[transpose]
        scores = q @ kt
        E = q.shape[-1]
        scores = {"sqrt": scores / math.sqrt(E), "none": scores, "d": scores / E}[scale]
        if mask is not None and not after:
            blocked = ~mask if polarity else mask
            if fill is None:
                w = good_masked_softmax(scores, ~blocked)
            else:
                w = torch.softmax(scores.masked_fill(blocked, fill), dim=dim)
        else:
            w = torch.softmax(scores, dim=dim)
            if mask is not None:
                w = w * mask
        return (w @ v, w) if return_weights else w @ v
    return fn


def causal_tril(diagonal):
    return lambda L, S: torch.ones(L, S, dtype=torch.bool).tril(diagonal)


def mha_variant(split="ok", out_proj=True, scale="head"):
    def fn(query, key, value, W_q, W_k, W_v, W_o, num_heads, mask=None):
        B, L, E = query.shape
        D = E // num_heads

        def sp(x):
            if split == "view":
                return x.reshape(B, num_heads, x.shape[1], D)
            return good_split(x, num_heads)
        q, k, v = sp(query @ W_q.T), sp(key @ W_k.T), sp(value @ W_v.T)
        scores = q @ k.transpose(-2, -1)
        scores = scores / math.sqrt(D) if scale == "head" else scores if scale == "none" else scores / math.sqrt(E)
        if mask is not None:
            w = good_masked_softmax(scores, mask[:, None].expand(scores.shape))
        else:
            w = torch.softmax(scores, -1)
        o = w @ v
        o = o.reshape(B, L, E) if split == "view" else good_merge(o)
        return o @ W_o.T if out_proj else o
    return fn


MISTAKES = [
    # (exercise, student fn, part or None, a phrase the feedback must contain)
    ("masked_softmax", ms_fill(-1e9, dim=-2, zero=True), "values", "dimension 1 instead of over the keys"),
    ("masked_softmax", ms_fill(NEG_INF, dim=0), "values", "dimension 0"),
    ("masked_softmax", lambda s, m: torch.softmax(s, -1) * m, "values", "mask after the softmax"),
    ("masked_softmax", lambda s, m: torch.softmax(s, -1).masked_fill(~m, 0), "values", "mask after the softmax"),
    ("masked_softmax", ms_fill(-1e9, polarity=False), "values", "polarity is inverted"),
    ("masked_softmax", ms_fill(NEG_INF, polarity=False), "broadcast", "polarity is inverted"),
    ("masked_softmax", lambda s, m: torch.softmax(s, -1), "values", "ignores the mask"),
    ("masked_softmax", ms_fill(-1e9, zero=True), "fp16", "does not fit in float16"),
    ("masked_softmax", ms_fill(NEG_INF), "fully_masked", "come out as NaN"),
    ("masked_softmax", ms_fill(-1e9), "fully_masked", "uniform weights"),
    ("masked_softmax", ms_fill(-1e4, zero=True), "large_scores", "not negative enough"),
    ("masked_softmax", lambda s, m: torch.where(m, s, -1e9).softmax(-1), "fully_masked", "uniform"),
    ("masked_softmax", lambda s, m: torch.softmax(s.float().masked_fill(~m, NEG_INF), -1).nan_to_num(),
     "fp16", "dtype torch.float32"),
    ("scaled_dot_product_attention", sdpa_with(scale="none"), "no_mask", "not scaled"),
    ("scaled_dot_product_attention", sdpa_with(scale="d"), "no_mask", "divided the scores by D"),
    ("scaled_dot_product_attention", sdpa_with(dim=-2), "no_mask", "dimension 1"),
    ("scaled_dot_product_attention", sdpa_with(transpose="T"), "no_mask", "LAST TWO axes"),
    ("scaled_dot_product_attention", sdpa_with(transpose="01"), "heads", "LAST TWO axes"),
    ("scaled_dot_product_attention", sdpa_with(return_weights=True), "heads", "return only the output"),
    ("softmax_temperature", lambda s, t: torch.softmax(s * t, -1), "temperature", "divide by it"),
    ("softmax_temperature", lambda s, t: torch.softmax(s, -1) ** (1 / t), "temperature", "normalise again"),
    ("softmax_temperature", lambda s, t: torch.softmax(s, -1), "temperature", "ignored the temperature"),
    ("softmax_temperature", lambda s, t: torch.softmax(s / t, 0), "values", "dimension 0"),
    ("softmax_temperature", lambda s, t: torch.exp(s / t) / torch.exp(s / t).sum(-1, keepdim=True),
     "large_scores", "subtract each row's own maximum"),
    ("softmax_temperature", lambda s, t: (lambda e: e / e.sum(-1, keepdim=True))(torch.exp((s - s.max()) / t)),
     "large_scores", "subtract each row's own maximum"),
    ("softmax_temperature", lambda s, t: torch.softmax(s.double() / t, -1), "values", "dtype"),
    ("weights_shape", lambda B, H, L, S, D, Dv: ((B, H, S, L), (B, H, L, Dv)), "weights", "rows are queries"),
    ("weights_shape", lambda B, H, L, S, D, Dv: ((B, L, S), (B, L, Dv)), "weights", "forgot the heads"),
    ("weights_shape", lambda B, H, L, S, D, Dv: ((B, H, L, S), (B, H, L, D)), "output", "width is Dv"),
    ("sharp_scale", smallest_sharp_scale(lambda top: top.mean().item() > 0.9), "value", "the MEAN"),
    ("padding_fraction", {"seed": 0, "fraction": 0.6}, "fraction", "fraction of REAL tokens"),
    ("bottleneck_parameters", lambda V, E, H: 2 * (V * E + 3 * (E * H + H * H + H)) + H * V + V, "count",
     "TWO bias vectors"),
    ("bottleneck_parameters", lambda V, E, H: V * E + 3 * (E * H + H * H + 2 * H) + H * V + V, "count",
     "one of the two GRUs"),
    ("sharp_scale", smallest_sharp_scale(lambda top: bool((top > 0.9).all())) * math.sqrt(2), "value",
     "replaces 1/√D"),
    ("causal_mask", causal_tril(-1), "square", "excludes the diagonal"),
    ("causal_mask", lambda L, S: torch.ones(L, S, dtype=torch.bool).triu(), "square", "lets the future in"),
    ("causal_mask", lambda L, S: torch.ones(L, S, dtype=torch.bool).triu(1), "square", "inverted"),
    ("causal_mask", causal_tril(0), "more_keys", "aligned to the top left"),
    ("causal_mask", causal_tril(0), "one_query", "aligned to the top left"),
    ("causal_mask", lambda L, S: torch.ones(L, S).tril(S - L), "square", "bool"),
    ("pick_causal_mask", {"square": "AC", "cache": "AC"}, "cache", "top left"),
    ("pick_causal_mask", {"square": "BC", "cache": "C"}, "square", "diagonal"),
    ("masked_attention", min_fill_attention, "blocked", "finite number"),
    ("masked_attention", nan_row_attention, "empty_row", "NaN"),
    ("masked_attention", lambda q, k, v, m, a: good_masked_attention(q, k, v, m, 0 * a),
     "values", "ignores the additive mask"),
    ("pick_causal_mask", {"square": "C", "cache": "C"}, "square", "same mask"),
    ("pick_causal_mask", {"square": "ACD", "cache": "C"}, "square", "future"),
    ("mask_after_softmax", {**_after_softmax_answer(), "lost": 1 - _after_softmax_answer()["lost"]}, "lost",
     "weight KEPT"),
    ("mask_after_softmax", {**_after_softmax_answer(), "lost": 16 * 64 * _after_softmax_answer()["lost"]},
     "lost", "sum over the queries"),
    ("mask_after_softmax", _after_softmax_answer(lost=torch.ones(16, 16, dtype=torch.bool).tril(-1)), "lost",
     "leaves out the diagonal"),
    ("mask_after_softmax", _after_softmax_answer(renormalise=False), "renormalised", "WITHOUT renormalising"),
    ("mask_after_softmax", {**_after_softmax_answer(), "seed": "5"}, "lost", "expected the int"),
    ("mask_after_softmax", {**_after_softmax_answer(), "seed": 6}, "lost", "not right"),
    ("split_heads", lambda x, h: x.view(x.shape[0], h, x.shape[1], -1), "values", "without a transpose"),
    ("split_heads", lambda x, h: x.view(x.shape[0], x.shape[1], h, -1), "values", "did not move the heads"),
    ("split_heads", lambda x, h: x.reshape(x.shape[0], x.shape[1], -1, h).permute(0, 3, 1, 2), "values",
     "every H-th feature"),
    ("multi_head_flops", lambda B, L, S, E, H: 4 * B * (L + S) * E * E + 4 * H * B * L * S * E,
     "self_attention", "full width E"),
    ("multi_head_flops", lambda B, L, S, E, H: 4 * B * (L + S) * E * E + 2 * B * L * S * E,
     "self_attention", "weights times v"),
    ("multi_head_flops", lambda B, L, S, E, H: 2 * B * (L + 2 * S) * E * E + 4 * B * L * S * E,
     "cross_attention", "output projection W_O"),
    ("multi_head_flops", lambda B, L, S, E, H: 8 * B * L * E * E + 4 * B * L * S * E,
     "cross_attention", "S positions"),
    ("multi_head_flops", lambda B, L, S, E, H: 2 * B * (L + S) * E * E + 2 * B * L * S * E,
     "cross_attention", "multiply-adds"),
    ("multi_head_flops", lambda B, L, S, E, H: 4 * B * L * S * E, "self_attention", "four projections"),
    ("multi_head_flops", lambda B, L, S, E, H: 4 * (L + S) * E * E + 4 * L * S * E,
     "cross_attention", "batch"),
    ("multi_head_flops", lambda B, L, S, E, H: 4 * B * (L + S) * E * E + 4 * B * L * S * E + 1,
     "self_attention", "not right"),
    ("multi_head_forward", mha_variant(out_proj=False), "values", "output projection"),
    ("multi_head_forward", mha_variant(out_proj=False), "structure", "output projection"),
    ("multi_head_forward", mha_variant(split="view"), "values", "without a transpose"),
    ("multi_head_forward", mha_variant(scale="none"), "mask", "not scaled"),
    ("multi_head_forward", mha_variant(scale="model"), "values", "per-head width"),
    ("multi_head_forward", ListMHA, "values", "plain Python list"),
    ("multi_head_forward", ListMHA, "structure", "plain Python list"),
    ("multi_head_forward", NoOutMHA, "structure", "output projection"),
    ("multi_head_forward", NoOutMHA, "values", "output projection"),
    ("seq2seq_attention_step",
     lambda h, e, m: good_s2s(h / math.sqrt(h.shape[-1]), e, m), "values", "plain dot score"),
    ("seq2seq_attention_step", lambda h, e, m: good_s2s(h, e, ~m), "padding", "polarity"),
    ("seq2seq_attention_step", lambda h, e, m: good_s2s(h, e, torch.ones_like(m)), "padding", "ignores the mask"),
    ("seq2seq_attention_step",
     lambda h, e, m: (lambda w: ((w[:, :, None] * e).sum(1), w))(
         torch.softmax((e @ h[:, :, None])[..., 0].masked_fill(~m, NEG_INF), -1)), "empty_source", "NaN"),
    ("final_state", lambda o, n: o[:, -1], "values", "padding"),
    ("final_state", lambda o, n: o[torch.arange(o.shape[0]), n], "values", "one past the last"),
    ("masked_mean", lambda o, m: o.mean(1), "values", "padding included"),
    ("masked_mean", lambda o, m: (o * m[..., None]).sum(1) / m.sum(1, keepdim=True), "empty", "NaN"),
    ("padding_mask", lambda n, S: torch.arange(S)[None] >= n[:, None], "values", "False the padding"),
    ("padding_mask", lambda n, S: torch.arange(S)[None] <= n[:, None], "values", "Off by one"),
    ("padding_mask", lambda n, S: (torch.arange(S)[None] < n[:, None]).long(), "values", "bool"),
    ("helga_length", _helga_answer(0.5, scale_key=False), "length", "SCORE Helga needs"),
    ("helga_length", _helga_answer(0.8, words=2), "length", "ONE competitor"),
    ("helga_length", _helga_answer(0.7, step=0.1), "length", "refine your steps"),
    ("helga_length", _helga_answer(0.5, doubled=math.sqrt(2)), "doubled", "doubled Helga's SCORE"),
    ("helga_length", _helga_answer(0.6, doubled=1.0), "doubled", "not at 2m"),
    ("helga_length", {**_helga_answer(0.5), "share": 50}, "length", "not a percentage"),
    ("padded_weights", lambda n, S: ((S, len(n)), [1.0 if x else 0.0 for x in n]), "shape", "one row per SEQUENCE"),
    ("padded_weights", lambda n, S: ((len(n), max(n)), [1.0 if x else 0.0 for x in n]), "shape",
     "padding included"),
    ("padded_weights", lambda n, S: ((len(n), 1, S), [1.0 if x else 0.0 for x in n]), "shape", "drops its axis"),
    ("padded_weights", lambda n, S: ((len(n), S), [1.0] * len(n)), "row_sums", "length 0"),
    ("padded_weights", lambda n, S: ((len(n), S), [x / S for x in n]), "row_sums", "REAL positions only"),
    ("padded_weights", lambda n, S: ((len(n), S), [x and 1.0 or float("nan") for x in n]), "row_sums",
     "must not give NaN"),
    ("scaled_dot_scores", lambda q, k: q @ k.transpose(-2, -1), "values", "not scaled"),
    ("scaled_dot_scores", lambda q, k: q @ k.transpose(-2, -1) / q.shape[-1], "values", "divided the scores by D"),
    ("scaled_dot_scores", lambda q, k: q @ k.transpose(0, 1) / math.sqrt(q.shape[-1]), "heads", "LAST TWO"),
    ("scaled_dot_scores", lambda q, k: q @ k.T / math.sqrt(q.shape[-1]), "values", "transpose(-2, -1)"),
    ("score_variance_scale", lambda D, vq, vk: (math.sqrt(D * vq * vk), 1), "variance", "standard deviation"),
    ("score_variance_scale", lambda D, vq, vk: (D * (vq + vk), 1), "variance", "multiply, they do not add"),
    ("score_variance_scale", lambda D, vq, vk: (D * vq * vk, 1 / math.sqrt(D)), "scale", "right only when"),
    ("score_variance_scale", lambda D, vq, vk: (D * vq * vk, 1 / (D * vq * vk)), "scale", "c²"),
    ("score_variance_scale", lambda D, vq, vk: (D * vq * vk, 1 / (math.sqrt(D) * vq * vk)), "scale",
     "square root too"),
    ("attention_entropy", lambda q, k, scale: good_entropy(q, k, scale) / math.log(2), "scaled", "in bits"),
    ("attention_entropy", lambda q, k, scale: -good_entropy(q, k, scale), "scaled", "minus sign"),
    ("attention_entropy", lambda q, k, scale: good_entropy(q, k, scale, total=lambda h: h.sum()), "scaled",
     "take their mean"),
    ("attention_entropy", lambda q, k, scale: good_entropy(q, k, 1.0), "uniform", "did not apply `scale`"),
    ("attention_entropy", entropy_of(lambda s, scale: torch.softmax(scale * s, -2)), "scaled", "over the queries"),
    ("attention_entropy", lambda q, k, scale: (lambda w: (-(w * w.log()).sum(-1)).mean().item())(
        torch.softmax(scale * q @ k.transpose(-2, -1), -1)), "saturated", "0 log 0"),
    ("bilinear_score", lambda q, w, k: q @ w.T @ k.transpose(1, 2), "square", "transposed weight"),
    ("bilinear_score", lambda q, w, k: q @ w(k).transpose(1, 2), "values", "nn.Linear"),
    ("bilinear_equals_dot", lambda D: torch.eye(D), "values", "UNSCALED"),
    ("bilinear_equals_dot", lambda D: torch.eye(D) / D, "values", "√D"),
    ("bilinear_cost", lambda L, S, Dq, Dk: (Dq * Dq, 0), "parameters", "not Dq²"),
    ("bilinear_cost", lambda L, S, Dq, Dk: (Dq * Dk, 2 * (L * Dq * Dk + L * S * Dk)), "multiply_adds",
     "two per multiply-add"),
    ("bilinear_cost", lambda L, S, Dq, Dk: (Dq * Dk, L * S * Dk), "multiply_adds", "add the projection"),
    ("bilinear_cost", lambda L, S, Dq, Dk: (Dq * Dk, S * Dq * Dk + L * S * Dq), "multiply_adds",
     "projecting the keys"),
    ("rearrangement_accuracy", _rearrangement_answer(3, transpose=True), "rearrangement", "transpose"),
    ("rearrangement_accuracy", {**_rearrangement_answer(4), "identity": 100 * _rearrangement_answer(4)["identity"]},
     "identity", "percentage"),
    ("rearrangement_accuracy", {**_rearrangement_answer(5), "rearrangement": 1 - _rearrangement_answer(5)[
        "rearrangement"]}, "rearrangement", "NOT key 0"),
    ("additive_score", lambda q, k, Wq, Wk, v: ((q @ Wq.T)[:, :, None] + (k @ Wk.T)[:, None]) @ v,
     "values", "left out the tanh"),
    ("additive_score", lambda q, k, Wq, Wk, v: torch.tanh((q @ Wq)[:, :, None] + (k @ Wk)[:, None]) @ v,
     "square", "x @ W.T"),
    ("additive_concat", lambda a, b: torch.cat([b, a], dim=1), "values", "wrong order"),
    ("additive_concat", lambda a, b: torch.cat([a, b], dim=0), "values", "side by side"),
    ("score_parameter_count", lambda Dq, Dk, Dh: {"dot": 0, "scaled_dot": 0, "bilinear": Dq * Dk,
                                                   "additive": Dh * (Dq + Dk) + Dh}, "additive", "forgot"),
    ("score_parameter_count", lambda Dq, Dk, Dh: {"dot": 0, "scaled_dot": 0, "bilinear": Dq + Dk,
                                                   "additive": 0}, "bilinear", "Dq·Dk"),
    ("score_widths", {"dot", "bilinear", "additive"}, "cannot", "same width"),
    ("low_rank_score", lambda q, U, V, k: q @ V @ U.T @ k.transpose(-2, -1), "square", "swapped U_q and U_k"),
    ("low_rank_score", lambda q, U, V, k: q @ V @ U.T @ k.transpose(-2, -1), "values", "do not fit"),
    ("low_rank_score", lambda q, U, V, k: (q @ U) @ (k @ V).transpose(-2, -1) / math.sqrt(U.shape[1]),
     "values", "1/√R"),
    ("low_rank_score", lambda q, U, V, k: (k @ V) @ (q @ U).transpose(-2, -1), "full_rank", "key-by-query"),
    ("low_rank_score", lambda q, U, V, k: q @ U @ V.T @ k.T, "values", "reverses ALL its dims"),
    ("score_widths", {"additive"}, "can", "(Dq, Dk)"),
    ("paired_bootstrap", bootstrap(mode="unpaired"), "interval", "unpaired"),
    ("paired_bootstrap", bootstrap(mode="unpaired"), "shipped", "unpaired"),
    ("paired_bootstrap", bootstrap(mode="entries"), "interval", "Resample whole seeds"),
    ("paired_bootstrap", bootstrap(mode="entries"), "shipped", "Resample whole seeds"),
    ("paired_bootstrap", bootstrap(levels=(0.05, 0.95)), "interval", "90% interval"),
    ("paired_bootstrap", bootstrap(levels=(0.0, 0.95)), "interval", "one end only"),
    ("paired_bootstrap", bootstrap(swap=True), "difference", "b - a"),
    ("paired_bootstrap", bootstrap(swap=True), "interval", "b - a"),
    ("qkv_projection", lambda x, a, b, c: (x @ a, x @ b, x @ c), "square", "x @ W_q.T"),
    ("qkv_projection", lambda x, a, b, c: (x @ a, x @ b, x @ c), "shapes", "(out, in)"),
    ("qkv_projection", lambda x, a, b, c: (x @ b.T, x @ a.T, x @ c.T), "square", "another weight"),
    ("self_attention", lambda x, a, b, c, mask=None: good_sdpa(x, x, x, mask), "values", "project it"),
    ("self_attention", lambda x, a, b, c, mask=None: good_sdpa(x @ a.T, x @ b.T, x @ c.T, None), "mask",
     "ignores the mask"),
    ("self_attention", lambda x, a, b, c, mask=None: sdpa_with(scale="none")(x @ a.T, x @ b.T, x @ c.T, mask),
     "values", "not scaled"),
    ("self_weight", _self_weight_answer(2, scale=False), "shared", "not scaled"),
    ("self_weight", _self_weight_answer(3, diagonal=False), "separate", "mean of ALL the weights"),
    ("self_weight", {**_self_weight_answer(4), "shared": _self_weight_answer(4)["separate"]}, "shared",
     "other projection"),
    ("online_softmax_merge", lambda a, b: (torch.maximum(a[0], b[0]), a[1] + b[1], a[2] + b[2]), "values",
     "without rescaling"),
    ("online_softmax_merge", lambda a, b: (torch.maximum(a[0], b[0]), a[1] + b[1], a[2] + b[2]), "attention",
     "without rescaling"),
    ("online_softmax_merge",
     lambda a, b: (lambda m: (m, torch.exp(a[0] - m) * a[1] + torch.exp(b[0] - m) * b[1],
                             torch.exp(a[0] - m)[..., None] * a[2] + torch.exp(b[0] - m)[..., None] * b[2]))(
         torch.maximum(a[0], b[0])), "empty_block", "NaN"),
    ("tile_backward", tile_backward_with(delta="none"), "one_tile", "rowsum(dO_i ∘ O_i)"),
    ("tile_backward", tile_backward_with(delta="none"), "two_tiles", "forgot the Δ term"),
    ("tile_backward", tile_backward_with(weights="raw"), "one_tile", "unnormalised"),
    ("tile_backward", tile_backward_with(weights="tile"), "two_tiles", "this tile's keys only"),
    ("tile_backward", tile_backward_with(delta="tile"), "two_tiles", "Δ from this tile's weights"),
    ("tile_backward", tile_backward_with(own_scale=True), "one_tile", "argument `scale`"),
    ("tile_backward", tile_backward_with(own_scale=True), "two_tiles", "argument `scale`"),
    ("tile_backward", tile_backward_with(keys_axes=(1, 2)), "two_tiles", "raised RuntimeError"),
    ("tile_backward", tile_backward_with(scale_q=False, scale_k=False), "one_tile", "left out the scale"),
    ("tile_backward", tile_backward_with(scale_k=False), "two_tiles", "not in that of k"),
    ("tile_backward", tile_backward_with(scale_q=False), "one_tile", "not in that of q"),
    # mistakes as they appear in published tutorials
    ("masked_softmax", lambda s, m: torch.nn.functional.softmax(s.masked_fill(~m, -1e9)), "values", "dimension 0"),
    ("masked_softmax", lambda s, m: torch.softmax(s.masked_fill(m, -1e4), -1), "values", "polarity"),
    ("scaled_dot_product_attention", lambda q, k, v, mask=None: good_sdpa(q, k.transpose(1, 2).transpose(-2, -1)
                                                                           if k.dim() == 3 else k.transpose(1, 2), v, mask),
     "heads", "LAST TWO axes"),
    ("scaled_dot_product_attention",
     lambda q, k, v, mask=None: good_sdpa(q * math.sqrt(q.shape[-1] / v.shape[-1]), k, v, mask), "no_mask",
     "VALUE width"),
    ("scaled_dot_product_attention",
     lambda q, k, v, mask=None: torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1)
     * torch.ones(q.shape[-2], k.shape[-2]).tril() @ v, "no_mask", "largest difference"),
    ("causal_mask", lambda L, S: torch.tril(torch.ones(8, 8))[:L, :S].bool(), "more_keys", "top left"),
    ("causal_mask", lambda L, S: torch.tril(torch.ones(8, 8))[:L, :S], "square", "bool"),
    ("causal_mask", lambda L, S: torch.arange(L)[:, None] >= torch.arange(S), "one_query", "top left"),
    ("kv_cache_bytes", lambda B, H, S, D, n, dt: 2 * B * H * S * D * n * 4, "half", "float16"),
    ("kv_cache_bytes", lambda B, H, S, D, n, dt: good_kv_bytes(B, H, S, D, n, dt) // 2, "float32", "keys only"),
    ("kv_cache_bytes", lambda B, H, S, D, n, dt: good_kv_bytes(B, H, S, D, 1, dt), "float32", "layers"),
    ("rms_norm", lambda x, w, eps: w * (x - x.mean(-1, keepdim=True))
     / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps), "values", "subtracted the mean"),
    ("rms_norm", lambda x, w, eps: w * x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps), "eps_and_zeros",
     "outside the square root"),
    ("block_parameters", lambda E, r: {**good_block_parameters(E, r), "attention": 4 * E * E}, "attention",
     "biases"),
    ("block_parameters", lambda E, r: {**good_block_parameters(E, r), "norms": 2 * E}, "norms", "two LayerNorms"),
    ("greedy_decode", lambda *a: torch.cat([torch.ones_like(a[2][:, :1]), good_greedy_decode(*a)], dim=1),
     "dates", "start token"),
    ("cross_attention_zeros", lambda B, H, L, lengths: (good_cross_zeros(B, H, L, lengths)[0], good_cross_zeros(
        B, H, L, lengths)[1] | ~torch.ones(L, max(lengths), dtype=torch.bool).tril(max(lengths) - L)), "zeros",
     "no causal mask"),
    ("decoding_flops", lambda *a: good_decoding_flops(*a, mlp=0), "without_cache", "MLP"),
    ("online_softmax_rescales", _rescales_answer(tile_counts=lambda r: int(r.sum()) + 8), "tiles_of_16",
     "counted the first tile"),
    ("online_softmax_rescales", _rescales_answer(tile_counts=lambda r: int((~r).sum())), "tiles_of_1",
     "did NOT raise"),
    ("online_softmax_rescales", _rescales_answer(tile_counts=lambda r: int(r[0].sum())), "tiles_of_16",
     "query 0 alone"),
    ("online_softmax_rescales", _rescales_answer(tile_counts=lambda r: int(r.any(dim=0).sum())), "tiles_of_1",
     "SOME query"),
    ("online_softmax_rescales", _rescales_answer(tile_counts=lambda r: r.sum().item() / 8), "tiles_of_1",
     "averaged"),
    ("online_softmax_rescales", {**_rescales_answer(), "tiles_of_16": _rescales_answer()["tiles_of_1"]},
     "tiles_of_16", "tiles of 1 key"),
    ("online_softmax_rescales", {**_rescales_answer(), "seed": "7"}, "tiles_of_1", "expected the int"),
    ("decoding_flops", lambda *a: good_decoding_flops(*a, cached_attention=False), "with_cache",
     "still scores every cached key"),
    ("fit_bilinear_weight", lambda q, k, c: fit_weight()(q, k, c).T, "square", "returned Wᵀ"),
    ("fit_bilinear_weight", fit_weight(unknowns="ba"), "exact", "solved for Wᵀ"),
    ("fit_bilinear_weight", fit_weight(pairs="ji"), "noisy", "different orders"),
    ("fit_bilinear_weight", lambda q, k, c: q.T @ c @ k, "exact", "instead of inverting"),
    ("fit_bilinear_weight", lambda q, k, c: torch.linalg.pinv(q) @ c @ k, "square", "not the keys"),
    ("fit_bilinear_weight", lambda q, k, c: torch.linalg.lstsq(q, c).solution, "noisy", "flatten the pairs"),
    ("fit_bilinear_weight", lambda q, k, c: torch.linalg.lstsq(q, c.reshape(-1, 1)).solution, "exact",
     "one row of A per pair"),
    ("heads_interchangeable", _heads_answer(3, out="none"), "all_heads", "but not W_o"),
    ("heads_interchangeable", _heads_answer(4, out="rows"), "all_heads", "W_o's rows"),
    ("heads_interchangeable", _heads_answer(5, reduce="mean"), "queries_only", "mean absolute change"),
    ("heads_interchangeable", _heads_answer(6, only="k"), "queries_only", "W_k's blocks"),
    ("heads_interchangeable", {**_heads_answer(7), "queries_only": _heads_answer(7)["all_heads"]},
     "queries_only", "which is not right"),
    ("heads_interchangeable", {**_heads_answer(8), "seed": 8.0}, "all_heads", "expected the int"),
    ("apply_rotary", rotary_with(layout="adjacent"), "pairs", "i + D/2"),
    ("apply_rotary", rotary_with(sign=-1), "positions", "wrong way"),
    ("apply_rotary", rotary_with(exponent=lambda j, D: 2 * j), "base", "not divided by D"),
    ("apply_rotary", rotary_with(exponent=lambda j, D: j / D), "pairs", "base^(−j/D)"),
    ("apply_rotary", rotary_with(shift=1), "pairs", "off by one"),
    ("apply_rotary", rotary_with(own_positions=True), "positions", "use the `positions` argument"),
    ("apply_rotary", lambda x, p, base=10000.0: rotary_with()(x, p), "base", "ignored the `base`"),
    ("rotary_score", score_with(sign=-1), "two_dims", "wrong sign"),
    ("rotary_score", score_with(sine=False), "many_pairs", "only the cosine"),
    ("rotary_score", score_with(layout="adjacent"), "many_pairs", "i + D/2"),
    ("rotary_score", score_with(scale=True), "two_dims", "divided by √D"),
    ("rotary_extrapolation", _extrapolation_answer(first=3), "trained", "from position 3 on"),
    ("rotary_extrapolation", _extrapolation_answer(delay=2), "window", "what a guess would score"),
    ("rotary_extrapolation", _extrapolation_answer(swap=True), "trained", "other model"),
    ("rotary_extrapolation", {**_extrapolation_answer(), "seed": 3.0}, "trained", "expected the int"),
    ("rotary_extrapolation", _extrapolation_answer(first=3), "window", "right value by the wrong method"),
    ("grouped_query_attention", gqa_with(order="tiled"), "groups", "repeat_interleave"),
    ("grouped_query_attention", gqa_with(order="tiled"), "mask", "CONSECUTIVE query heads"),
    ("grouped_query_attention", gqa_with(scale=False), "multi_query", "not scaled"),
    ("grouped_query_attention", lambda q, k, v, mask=None: gqa_with()(q, k, v), "mask", "ignores the mask"),
    ("sliding_window_mask", window_with(before=0), "square", "one key too wide"),
    ("sliding_window_mask", window_with(before=2), "cache", "one key too narrow"),
    ("sliding_window_mask", window_with(direction=-1), "square", "wrong way"),
    ("sliding_window_mask", window_with(alignment="top"), "cache", "top left"),
    ("sliding_window_mask", lambda L, S, W: window_with()(L, S, W).float(), "wide", "bool"),
    ("window_cache_bytes", {**WINDOW_CACHE, "grouped": WINDOW_CACHE["full"]}, "grouped", "H_kv = 8"),
    ("window_cache_bytes", {**WINDOW_CACHE, "window": WINDOW_CACHE["grouped"]}, "window", "not all S"),
    ("window_cache_bytes", {**WINDOW_CACHE, "window": WINDOW_CACHE["window"] // 4096 * 4097}, "window",
     "not W + 1"),
    ("window_cache_bytes", {**WINDOW_CACHE, "full": WINDOW_CACHE["full"] // 2}, "full", "keys only"),
    ("qk_norm_attention", lambda q, k, v, qw, kw: good_qk_norm(q, k, v, qw, kw, after=True), "heads", "after the rotation"),
    ("qk_norm_attention", lambda q, k, v, qw, kw: good_qk_norm(q, k, v, qw * 0 + 1, kw * 0 + 1), "one_head", "weights"),
    ("qk_norm_attention", lambda q, k, v, qw, kw: good_qk_norm(q, k, v, qw, kw, causal=False), "wide", "not causal"),
    ("absorbed_scores", lambda q, c, w: torch.einsum("bhld,hcd,bsc->bhls", q, w, c), "square", "transpose"),
    ("absorbed_scores", lambda q, c, w: torch.einsum("bhld,dc->bhlc", q, w[0]) @ c[:, None].transpose(-2, -1),
     "latent_wider", "head 0"),
    ("absorbed_scores", lambda q, c, w: q @ torch.einsum("hdc,bsc->bhsd", w, c).transpose(-2, -1), "one_token",
     "you formed the keys"),
    ("latent_cache_bytes", {**LATENT_CACHE, "latent": LATENT_CACHE["latent"] // 576 * 512}, "latent", "rotated key"),
    ("latent_cache_bytes", {**LATENT_CACHE, "mha": LATENT_CACHE["mha"] // 320 * 384}, "mha", "192"),
    ("window_cache_bytes", {**WINDOW_CACHE, "full": WINDOW_CACHE["full"] // 32}, "full", "layers"),
    ("to_half_layout", to_half_with("one_head"), "heads", "ONE head"),
    ("to_half_layout", to_half_with("inverse"), "heads", "inverse move"),
    ("to_half_layout", to_half_with("columns"), "square", "reordered the columns"),
    ("llama3_frequencies", llama3_with(divide_all=True), "llama", "fast ones too"),
    ("llama3_frequencies", llama3_with(blend="none"), "small", "blends them"),
    ("llama3_frequencies", llama3_with(blend="reversed"), "small", "wrong way"),
    ("llama3_frequencies", llama3_with(wavelength=lambda speed: speed), "llama", "wavelength of a pair is 2π"),
    ("llama3_frequencies", llama3_with(wavelength=lambda speed: 1 / speed), "llama", "2π / speed"),
    ("llama3_frequencies", lambda *a: llama3_with()(*a).float(), "llama", "dtype=torch.float64"),
    ("sink_attention", sink_with(renormalise=True), "heads", "sum to 1"),
    ("sink_attention", sink_with(per_head=False), "heads", "same sink logit"),
    ("sink_attention", sink_with(scale_sink=True), "blocked", "1/√D"),
    ("sink_attention", sink_with(exp_sink=False), "heads", "exp(sinks[h])"),
    ("sink_attention", sink_with(value=True), "blocked", "contributed a value"),
    ("induction_score", induction_with(shift=0), "random_weights", "earlier occurrence itself"),
    ("induction_score", induction_with(shift=2), "one_sequence", "two positions past"),
    ("induction_score", lambda w, f, s, n: induction_with(stop=n)(w, f, s, n), "random_weights", "last token"),
    ("induction_score", induction_with(start=1), "random_weights", "left out the copy's first token"),
    ("induction_score", lambda w, f, s, n: good_induction_score(w, f, s, n) / 2, "random_weights",
     "first segment"),
    ("induction_score", lambda w, f, s, n: good_induction_score(w, f, s, n) * (n - 1) / w.shape[-1],
     "random_weights", "sequence length"),
    ("induction_score", induction_with(reduce=(1, 2)), "random_weights", "one number per head"),
    ("induction_score", lambda w, f, s, n: w.diagonal(-1, -2, -1).mean(dim=(0, 2)), "one_sequence",
     "previous-token score"),
    ("knock_out_heads", _knock_answer(kinds={"previous_token": {(0, 1)}}), "previous_token", "neither of the two"),
    ("knock_out_heads", _knock_answer(kinds={"induction": {(1, 1)}}), "induction", "highest-scoring"),
    ("knock_out_heads", _knock_answer(metric=1), "induction", "ACCURACY"),
    ("knock_out_heads", _knock_answer(kinds={"induction": set()}), "induction", "no head knocked out"),
    ("knock_out_heads", {**_knock_answer(), "seed": 3.0}, "previous_token", "expected the int"),
    ("knock_out_heads", _knock_answer(model_seed=3), "previous_token", "seed-0 model, load_model(0)"),
    ("knock_out_heads", _knock_answer(seed=1, model_seed=1), "induction", "your seed only draws the batch"),
    ("induction_attends", {"induction": 3, "previous_token": 8, "copying": "B"}, "induction",
     "earlier 6 itself"),
    ("induction_attends", {"induction": 10, "previous_token": 8, "copying": "B"}, "induction", "causal mask"),
    ("induction_attends", {"induction": 4, "previous_token": 4, "copying": "B"}, "previous_token",
     "induction head looks"),
    ("induction_attends", {"induction": 4, "previous_token": 8, "copying": "A"}, "copying", "copy fails"),
    ("induction_attends", {"induction": 4, "previous_token": 8, "copying": "D"}, "copying", "letters"),
]


@pytest.mark.parametrize("exercise_id, fn, part, phrase", MISTAKES,
                         ids=[f"{m[0]}-{m[2]}-{i}" for i, m in enumerate(MISTAKES)])
def test_mistake_loses_marks_and_is_named(exercise_id, fn, part, phrase):
    whole = check(exercise_id, fn)
    assert not whole.passed and whole.score < whole.max_score
    feedback = check(exercise_id, fn, part=part)
    assert not feedback.passed and feedback.score == 0 and feedback.max_score == 1
    assert any(phrase.lower() in m.lower() for m in feedback.messages), str(feedback)
    with pytest.raises(AssertionError) as info:
        feedback.assert_passed()
    assert " ".join(phrase.lower().split()) in " ".join(str(info.value).lower().split())


# ----------------------------------------------------------------------------------------------
# The classic bugs (the source material's and chapter 7's museum): each named in every exercise
# where it can occur, tested with the wrong answer itself
# ----------------------------------------------------------------------------------------------

from attnbook_classroom.grading import museum  # noqa: E402


@pytest.mark.parametrize("exhibit", museum.MUSEUM,
                         ids=[f"{e.bug}-{e.exercise_id}-{e.part}" for e in museum.MUSEUM])
def test_classic_bug_is_named_by_its_own_message(exhibit):
    feedback = check(exhibit.exercise_id, exhibit.make(), part=exhibit.part)
    assert not feedback.passed and feedback.score == 0
    assert any(exhibit.message in m for m in feedback.messages), str(feedback)
    assert "differs from the reference" not in str(feedback)


def test_every_classic_bug_has_exhibits_and_the_table_lists_them():
    assert {e.bug for e in museum.MUSEUM} == set(museum.BUGS)
    assert all(e.exercise_id in grading.exercise_ids() and e.part in grading.parts(e.exercise_id)
               for e in museum.MUSEUM)
    table = museum.misconceptions_table()
    assert table.count("\n") == len(museum.MUSEUM) + 2
    by_exercise = museum.misconceptions_by_exercise()
    assert list(by_exercise) == [e for e in grading.exercise_ids() if e in by_exercise]
    for exhibit in museum.MUSEUM:
        assert f"| `{exhibit.exercise_id}` | {museum.BUGS[exhibit.bug][0]} | `{exhibit.part}` |" in table


def test_the_window_part_of_10_3_passes_only_by_the_right_method():
    right = _extrapolation_answer()
    assert check("rotary_extrapolation", right, part="window").passed
    from_three = _extrapolation_answer(first=3)
    assert from_three["window"] == right["window"]  # the windowed model is right everywhere
    feedback = check("rotary_extrapolation", from_three, part="window")
    assert not feedback.passed and "from position 3" in feedback.messages[0], str(feedback)


def test_an_honest_result_too_large_to_cross_is_reported_with_its_size():
    feedback = check("causal_mask", lambda L, S: torch.zeros(9_000_000), part="square")
    assert not feedback.passed
    message = feedback.messages[0]
    assert "34.3 MiB, more than the 32.0 MiB the grader accepts" in message, message
    assert "channel" not in message


def test_a_mistake_in_one_part_keeps_the_other_parts():
    # -inf fill: right except on fully-masked rows
    feedback = check("masked_softmax", ms_fill(NEG_INF))
    assert 0 < feedback.score < feedback.max_score
    assert check("masked_softmax", ms_fill(NEG_INF), part="values").passed


# ----------------------------------------------------------------------------------------------
# Hostile code cannot break grading
# ----------------------------------------------------------------------------------------------

def raises_key_error(*args, **kwargs):
    raise KeyError("oops")


def endless(*args, **kwargs):
    while True:
        pass


def exits(*args, **kwargs):
    raise SystemExit(3)


def hard_exit(*args, **kwargs):
    os._exit(7)


def segfault(*args, **kwargs):
    import ctypes
    ctypes.string_at(0)


def returns_none(scores, mask):
    torch.softmax(scores, -1)


def not_implemented(*args, **kwargs):
    raise NotImplementedError()


def test_exception_becomes_feedback_naming_it():
    feedback = check("masked_softmax", raises_key_error)
    assert feedback.score == 0 and feedback.max_score == len(grading.parts("masked_softmax"))
    assert all("KeyError" in m and "oops" in m for m in feedback.messages)


def test_unanswered_says_so():
    feedback = check("causal_mask", not_implemented, part="square")
    assert feedback.score == 0 and "NotImplementedError" in feedback.messages[0]


def test_endless_loop_is_stopped_and_reported_too_slow():
    import time
    start = time.monotonic()
    feedback = check("split_heads", endless, part="values", timeout=1.0)
    assert time.monotonic() - start < 5
    assert feedback.score == 0 and "Too slow" in feedback.messages[0]


@pytest.mark.parametrize("fn, phrase", [(exits, "SystemExit"), (hard_exit, "exited with code 7"),
                                        (segfault, "signal")])
def test_exits_and_crashes_are_reported(fn, phrase):
    feedback = check("split_heads", fn, part="values")
    assert feedback.score == 0 and phrase in feedback.messages[0], str(feedback)


def test_grader_survives_and_parent_is_untouched():
    def vandal(scores, mask):
        torch.softmax = None  # only in the child process
        import builtins
        builtins.print = None
        return scores
    check("masked_softmax", vandal, part="values")
    assert callable(torch.softmax)
    assert check("masked_softmax", good_masked_softmax, part="values").passed


def test_wrong_return_types_are_reported():
    feedback = check("masked_softmax", returns_none, part="values")
    assert "returned None" in feedback.messages[0] and "return" in feedback.messages[0]
    feedback = check("masked_softmax", lambda s, m: s.numpy(), part="values")
    assert "numpy.ndarray" in feedback.messages[0]
    feedback = check("split_heads", lambda x, h: x, part="values")
    assert "shape (2, 5, 12)" in feedback.messages[0] and "(2, 3, 5, 4)" in feedback.messages[0]
    feedback = check("masked_softmax", lambda s, m: good_masked_softmax(s, m).double(), part="values")
    assert "dtype torch.float64" in feedback.messages[0]


def test_not_callable_and_garbage_answers():
    assert "Expected a function" in check("split_heads", 42).messages[0]
    assert "expected a number" in check("multi_head_flops", lambda *a: "4BLE²").messages[0]
    assert "dict" in check("pick_causal_mask", "C").messages[0]
    assert "letters" in check("pick_causal_mask", {"square": "Z", "cache": 3}).messages[0]
    assert "letters" in check("pick_causal_mask", {"square": "", "cache": None}).messages[1]
    assert check("score_widths", 7).score == 0
    assert check("score_widths", set()).score == 0  # an unanswered cell earns nothing


def test_generic_message_when_no_typical_mistake_matches():
    feedback = check("split_heads", lambda x, h: good_split(x, h) + 1, part="values")
    assert "largest difference" in feedback.messages[0]


def test_print_in_student_code_does_not_leak(capsys):
    def chatty(x, h):
        print("hello from the student")
        return good_split(x, h)
    assert check("split_heads", chatty).passed
    assert "hello" not in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# The Feedback object and the argument checks
# ----------------------------------------------------------------------------------------------

def test_feedback_str_and_fields():
    fb = Feedback("x", 1, 2, ["first", "second"], part=None)
    assert not fb.passed
    assert str(fb).splitlines() == ["x: not yet, 1/2", "  - first", "  - second"]
    assert Feedback("x", 2, 2).passed and "passed, 2/2" in str(Feedback("x", 2, 2))
    assert "part 'p'" in str(Feedback("x", 0, 1, ["m"], part="p"))
    with pytest.raises(AssertionError, match="second"):
        fb.assert_passed()


def test_feedback_lines_fit_what_nbgrader_validate_shows():
    """nbgrader validate cuts every line of an error at 87 columns: a message is wrapped, whole."""
    message = "Your mask is aligned to the top left: " + "with fewer queries than keys " * 8 + "END."
    text = str(Feedback("causal_mask", 0, 1, [message, "second\nline two"]))
    assert max(len(line) for line in text.splitlines()) <= 76
    assert " ".join(text.split()).endswith("END. - second line two")
    assert " ".join(message.split()) in " ".join(text.split())


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="exercise_id.*'nope'"):
        check("nope", good_split)
    with pytest.raises(ValueError, match="`part` 'nope'"):
        check("split_heads", good_split, part="nope")
    with pytest.raises(ValueError, match="`timeout`"):
        check("split_heads", good_split, timeout=0)
    with pytest.raises(TypeError, match="`seed`"):
        check("split_heads", good_split, seed="1")


def test_describe_and_parts():
    for exercise_id in grading.exercise_ids():
        text = grading.describe(exercise_id)
        assert exercise_id in text and "parts:" in text
        assert len(grading.parts(exercise_id)) >= 1
    assert grading.parts("masked_softmax") == ["values", "fully_masked", "broadcast", "fp16", "large_scores"]


def test_causal_mask_choices_right_answers():
    from attnbook.masks import causal_mask
    for (L, S), right in (((4, 4), ["A", "C"]), ((2, 5), ["C"])):
        choices = grading.causal_mask_choices(L, S)
        assert [c for c, m in choices.items() if torch.equal(m, causal_mask(L, S))] == right


def test_the_helper_of_exercise_7_3_answers_no_case_of_exercise_7_2():
    """causal_mask_choices (importable in the grading sandbox: exercise 7.3's cell prints its masks)
    holds the causal mask among its choices, so it builds masks for 7.3's two situations only, and
    exercise 7.2 (causal_mask) never asks for those sizes, for any student's seed."""
    from attnbook_classroom.grading.harness import PendingPart
    from attnbook_classroom.grading.helpers import PICK_SITUATIONS

    for L, S in ((5, 5), (3, 7), (1, 6), (5, 3), (4, 5)):
        with pytest.raises(ValueError, match="one of exercise 7.3's situations"):
            grading.causal_mask_choices(L, S)
    asked = set()
    for seed in range(400):
        for part in grading.parts("causal_mask"):
            asked.update(tuple(spec["args"]["v"]) for spec in PendingPart("causal_mask", part, seed).specs)
    assert not asked & set(PICK_SITUATIONS), asked & set(PICK_SITUATIONS)
    assert {(3, 3), (5, 5), (10, 10), (2, 4), (2, 6), (2, 8)} <= asked  # the sizes around them are still drawn


def test_threaded_fallback_reports_timeout_and_result():
    status, value = grading._run_threaded(lambda: [], 1.0)
    assert (status, value) == ("ok", [])
    status, _ = grading._run_threaded(lambda: __import__("time").sleep(3), 0.2)
    assert status == "timeout"


def test_the_bootstrap_of_three_seeds_is_their_range():
    """Exercise 5b.5's lesson: with three seeds a resample of the lowest seed alone has probability
    1/27 > 2.5%, so the percentile interval is exactly the range of the per-seed differences, which
    covers the true difference only 75% of the time for a symmetric spread, not 95%."""
    from attnbook_classroom.grading.ch05b_four_scores import bootstrap_reference, shipped_long

    for first, second in [("additive", "bilinear"), ("bilinear", "dot")]:
        a, b = shipped_long(first), shipped_long(second)
        assert a.shape[0] == 3
        per_seed = (a - b).mean(dim=1)
        _, low, high = bootstrap_reference(a, b, 10_000, 0)
        assert math.isclose(low, per_seed.min().item(), abs_tol=1e-12)
        assert math.isclose(high, per_seed.max().item(), abs_tol=1e-12)
    # three normal per-seed differences around a true difference of 0, 300 times
    generator = torch.Generator().manual_seed(0)
    covered = 0
    for n, d in enumerate(torch.randn(300, 3, 1, generator=generator, dtype=torch.float64)):
        _, low, high = bootstrap_reference(d, torch.zeros_like(d), 1000, n)
        covered += low <= 0 <= high
    assert abs(covered / 300 - 0.75) < 0.1, covered


def test_instructors_page_lists_every_exercise():
    page = (pathlib.Path(__file__).resolve().parents[2] / "chapters" / "instructors.md").read_text()
    missing = [e for e in grading.exercise_ids() if f"`{e}`" not in page]
    assert not missing, f"chapters/instructors.md does not list {missing}"


def test_package_implementations_pass_their_exercises():
    """The grader's references agree with the package's own modules."""
    from attnbook.functional import attention, masked_softmax
    from attnbook.masks import causal_mask, padding_mask
    from attnbook.scores import DotScore
    from attnbook.models.seq2seq import attention_step

    assert check("masked_softmax", masked_softmax).passed
    assert check("scaled_dot_product_attention", lambda q, k, v, mask=None: attention(q, k, v, mask)[0]).passed
    assert check("causal_mask", causal_mask).passed
    assert check("padding_mask", lambda lengths, S: padding_mask(lengths, max_len=S)).passed
    feedback = check("seq2seq_attention_step", lambda h, enc, m: attention_step(h, enc, DotScore(), m))
    assert feedback.passed, str(feedback)


def test_package_tile_backward_passes_exercise_9_5():
    """The library's tile (attention_tile_backward) is the grader's reference, and a tile that
    normalises over its own keys passes only while it holds every key."""
    from attnbook.tiled import attention_tile_backward

    def tile(q, k, v, out, lse, d_out, scale):
        weights, d_scores = attention_tile_backward(scale * q @ k.transpose(-2, -1), lse,
                                                    (d_out * out).sum(-1, keepdim=True), d_out, v)
        return scale * d_scores @ k, scale * d_scores.transpose(-2, -1) @ q, weights.transpose(-2, -1) @ d_out

    feedback = check("tile_backward", tile)
    assert feedback.passed, str(feedback)
    assert check("tile_backward", tile_backward_with(weights="tile"), part="one_tile").passed


def test_package_multi_head_module_passes():
    from attnbook.multihead import MultiHeadAttention, split_heads

    assert check("split_heads", split_heads).passed
    feedback = check("multi_head_forward", MultiHeadAttention)
    assert feedback.passed, str(feedback)


# ----------------------------------------------------------------------------------------------
# The package's layout and what it keeps out of readable form
# ----------------------------------------------------------------------------------------------

def test_exercises_are_registered_in_the_book_order_with_named_parts():
    """Each registered exercise is checked by exactly one chapter's notebook, and the registry lists
    them chapter by chapter in the book's order."""
    import json
    import re

    from bookbuild.notebooks import toc_chapters

    checked_in: dict[str, set[int]] = {}
    for index, chapter in enumerate(toc_chapters()):
        for cell in json.loads(chapter.read_text())["cells"]:
            for exercise_id in re.findall(r"""check\(\s*["']([A-Za-z0-9_]+)["']""", "".join(cell["source"])):
                checked_in.setdefault(exercise_id, set()).add(index)
    ids = grading.exercise_ids()
    assert set(ids) <= set(checked_in), set(ids) - set(checked_in)
    assert all(len(checked_in[e]) == 1 for e in ids), {e: checked_in[e] for e in ids if len(checked_in[e]) > 1}
    order = [min(checked_in[e]) for e in ids]
    assert order == sorted(order) and order[0] == 0, order
    names = [func.__name__ for e in grading.exercise_ids() for func in grading.EXERCISES[e].parts.values()]
    assert len(set(names)) == len(names) and "_" not in names


def test_blocked_names_exist():
    """Every name an exercise blocks is removed from the sandbox: a def or class of the library
    (removed at the source), a PyTorch operator switched off, or PyTorch's own attention removed for
    every chapter; a renamed function cannot slip through."""
    from attnbook_classroom.grading import views

    names = sorted({b for e in grading.EXERCISES.values() for b in e.blocks + e.check_blocks})
    library, operators, other = views.split_blocked(names)
    assert not other, other
    assert library and operators
    for name in library:
        views.library_view([name])  # raises LookupError for a name that is not a def or class


def test_every_part_with_inputs_draws_them_from_its_seed():
    """A hidden test (another seed) gets other inputs, so answers tabled for the visible ones fail."""
    from attnbook_classroom.grading.harness import PendingPart
    from attnbook_classroom.grading.wire import dumps

    for exercise_id in grading.exercise_ids():
        for part in grading.parts(exercise_id):
            specs = [PendingPart(exercise_id, part, seed).specs for seed in (0, 2)]
            if all(s["op"] == "answer" for s in specs[0]):
                continue
            assert dumps(specs[0]) != dumps(specs[1]), f"{exercise_id}/{part} ignores its seed"


def test_fixed_answers_are_sealed():
    from attnbook_classroom.grading import sealed

    source = "".join(p.read_text() for p in pathlib.Path(grading.__file__).parent.glob("*.py"))
    for readable in ("'square': 'AC'", "square=AC", "hides the diagonal", "'bilinear' can"):
        assert readable not in source
    token = sealed.seal("x", "key", "a note")
    assert sealed.unseal("x", "key", token) == "a note" and sealed.unseal("x", "other", token) is None
    assert check("pick_causal_mask", {"square": "CA", "cache": "c"}).passed


def test_results_cross_as_plain_data_under_a_cap():
    import numpy as np

    from attnbook_classroom.grading import wire

    value = (torch.ones(2, 3).t(), {"a": [1, 2.5, None, "s"]}, {"x"}, torch.float16)
    back = wire.decode(wire.loads(wire.dumps(wire.encode(value))))
    assert torch.equal(back[0], value[0]) and back[0].stride() == value[0].stride()
    assert back[1:] == value[1:]
    assert wire.decode(wire.encode(np.zeros(3))).kind == "numpy.ndarray"
    with pytest.raises(ValueError, match="more than"):
        wire.loads(wire.dumps(wire.encode(torch.zeros(1000))), limit=1000)
    with pytest.raises(ValueError):
        wire.decode({"$": "pickle", "v": b"cos\nsystem\n"})


def test_feedback_is_displayed_not_returned_as_a_cell_result():
    """nbgrader reads a test cell's result as a partial score: a passing check leaves none."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    assert shell.display_formatter.format(Feedback("x", 1, 1)) == ({}, {})


def test_a_shared_key_projection_may_be_either_matrix():
    """Exercise 6.4 asks for q = k = x W_qᵀ; sharing W_k instead is the same experiment."""
    assert check("self_weight", _self_weight_answer(1, shared_key="W_k"), part="shared").passed


def test_experiments_follow_the_answer_they_are_given():
    """An experiment is checked against the student's own seed or share: right for another seed is wrong."""
    assert check("helga_length", _helga_answer(0.9)).passed
    assert not check("helga_length", {**_helga_answer(0.9), "share": 0.6}, part="length").passed
    assert check("rearrangement_accuracy", _rearrangement_answer(11)).passed
    assert not check("rearrangement_accuracy", {**_rearrangement_answer(11), "seed": 12}).passed
    assert check("self_weight", _self_weight_answer(11)).passed
    assert check("self_weight", {**_self_weight_answer(11), "seed": 12}).score == 0


def test_feedback_writes_the_scale_as_the_notation_page_does():
    """chapters/notation.md: the scale is 1/√D, with D the query/key width; never √E."""
    from attnbook_classroom.grading import ch03_scaled_dot_product, mistakes

    texts = [v for k, v in vars(mistakes).items() if k.startswith("M_")]
    feedback = check("scaled_dot_scores", lambda q, k: q @ k.transpose(-2, -1) / q.shape[-1])
    texts += feedback.messages + [ch03_scaled_dot_product.SCALED_SCORES.contract,
                                  ch03_scaled_dot_product.SCORE_VARIANCE_SCALE.contract]
    texts += check("score_variance_scale", lambda D, vq, vk: (math.sqrt(D), 1 / math.sqrt(D))).messages
    texts += check("scaled_dot_product_attention", sdpa_with(scale="d")).messages
    assert not [t for t in texts if "√E" in t or "sqrt(E)" in t], texts
    assert any("√D" in t for t in texts)


@pytest.mark.parametrize("fn", [
    lambda q, k, c: torch.linalg.pinv(q) @ c @ torch.linalg.pinv(k).T,
    lambda q, k, c: torch.linalg.lstsq(torch.kron(q, k), c.reshape(-1, 1)).solution.reshape(q.shape[1], -1),
])
def test_other_right_ways_to_fit_a_bilinear_weight_pass(fn):
    """Exercise 4.5: the pseudo-inverses on both sides, or the Kronecker product of the pairs."""
    assert check("fit_bilinear_weight", fn).passed
    assert check("fit_bilinear_weight", fn, seed=1).passed
