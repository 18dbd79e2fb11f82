"""Right and wrong answers to chapter 15's exercises, for tests/classroom/test_grading.py and
tests/classroom/test_grading_linear.py."""

from __future__ import annotations

import math

import torch


def good_delta_step(S, q, k, v, g, beta, *, order="right", scale=True):
    S_old = S
    S = math.exp(g) * S
    if order == "update_before_read":
        S = S + beta * torch.outer(k, v)
        S = S + beta * torch.outer(k, -(S.T @ k))
    elif order == "decay_after_write":
        S = math.exp(-g) * S  # undo: write first, then decay
        S = math.exp(g) * (S + beta * torch.outer(k, v - S.T @ k))
    else:
        S = S + beta * torch.outer(k, v - S.T @ k)
    del S_old
    return S.T @ q / (math.sqrt(q.shape[0]) if scale else 1.0), S


def good_chunked(q, k, v, C, *, read_after=False, causal=True, scale=True):
    q = q / math.sqrt(q.shape[-1]) if scale else q
    S, out = q.new_zeros(q.shape[-1], v.shape[-1]), []
    for start in range(0, q.shape[0], C):
        qc, kc, vc = (x[start:start + C] for x in (q, k, v))
        within = qc @ kc.T
        within = within.tril() if causal else within
        if read_after:
            S = S + kc.T @ vc
        out.append(qc @ S + within @ vc)
        if not read_after:
            S = S + kc.T @ vc
    return torch.cat(out)


def unchunked(q, k, v, C):
    """The right outputs from the whole L x L score matrix, without chunks."""
    return (q @ k.T).tril() @ v / math.sqrt(q.shape[-1])


def recall_answer(seed=5, predicted="B", how="final"):
    from attnbook.linear import linear_attention
    from attnbook_tools.recall import recall_batch

    keys, labels, values = recall_batch(100, 128, 32, generator=torch.Generator().manual_seed(seed))
    out, S = linear_attention(keys, keys, values)
    readout = out if how == "outputs" else keys @ S
    return {"seed": seed, "predicted": predicted,
            "measured": (readout.argmax(-1) == labels).double().mean().item()}
