"""What the heads of the text model do, measured on the held-out text.

Every score is one number per head: its mean attention weight, over a set of queries, on the one
key that the role names (:func:`mean_weight_at`). The roles:

* **previous token**: query t, key t - 1 (every query but the first);
* **induction**, as chapter 12 scores it: a query whose last ``REPEAT_BYTES`` bytes already occurred
  earlier in the window (a word or an identifier seen before), key: the byte right after that
  earlier occurrence (the most recent one), what an induction head copies (:func:`repeat_positions`);
* **start of the line**: query t, key: the newline that ends the previous line (:func:`line_positions`);
* **open bracket**: a query inside brackets opened in the window, key: the innermost ``(``, ``[``
  or ``{`` still open (:func:`bracket_positions`).

Each role's head is the one with the highest score, found on the held-out text, and compared with
what attention spread evenly over the query's keys would give on the same queries
(:func:`uniform_weight_at`). A found head is then knocked out (its output zeroed, as chapter 12's
knock-out does) and the loss is measured on the tokens its role should help and on the others
(:func:`knockout_effects`); Olsson et al.'s in-context learning score, the loss late in the window
minus the loss early, is measured with and without the induction heads (:func:`icl_score`).

Run it from the repository root after :mod:`attnbook_tools.text_study`::

    python -m attnbook_tools.text_heads --seed 0

It writes ``text_heads.json`` (recorded in ``data/manifest.json``).

Shapes:
    W windows, L tokens per window, H heads, K scored (window, query, key) triples.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch import Tensor, nn

from attnbook import _checks as check
from attnbook.models.transformer import TinyTransformer
from attnbook.tasks.text import next_token_losses, validation_windows
from attnbook_tools.datafiles import DATA_DIR, load_json_file, write_results
from attnbook_tools.text_study import load_text_model, text_parts

__all__ = ["REPEAT_BYTES", "INDUCTION_FACTOR", "ROLES", "EARLY", "LATE", "RESULTS_FILE", "mean_weight_at", "uniform_weight_at",
           "previous_positions", "repeat_positions", "line_positions", "bracket_positions", "role_positions",
           "head_scores", "knocked_out", "mean_ablated", "token_losses", "helped_tokens", "knockout_effects",
           "icl_score", "nested_bracket_weights", "closing_losses",
           "measure", "load_results", "main"]

REPEAT_BYTES = 4
INDUCTION_FACTOR = 3.0  # an induction head puts at least this many times the even share on the copied byte
ROLES = ("previous token", "induction", "line start", "open bracket")
EARLY, LATE = (8, 24), (100, 127)  # predicting positions [start, end) of a window, for the ICL score
RESULTS_FILE = "text_heads.json"
OPENERS, CLOSERS = b"([{", b")]}"
NEWLINE = ord("\n")


def mean_weight_at(weights: Tensor, rows: Tensor, queries: Tensor, keys: Tensor) -> Tensor:
    """Each head's mean weight over the K triples: window ``rows[k]``, query ``queries[k]``, key
    ``keys[k]``.

    Shapes:
        weights (W, H, L, L), rows (K,), queries (K,), keys (K,) -> (H,)
    """
    check.tensor("mean_weight_at", "weights", weights, "W, H, L, L", floating=True)
    check.that(len(rows) == len(queries) == len(keys) > 0, "mean_weight_at",
               lambda: f"`rows`, `queries` and `keys` must be equally long and not empty; got "
               f"{len(rows)}, {len(queries)}, {len(keys)}")
    check.that(bool((keys <= queries).all()), "mean_weight_at", "every key must be at or before its query (causal)")
    return weights.permute(0, 2, 3, 1)[rows, queries, keys].mean(dim=0)  # (K, H) -> (H,)


def uniform_weight_at(queries: Tensor) -> float:
    """The mean weight the scored keys would get if every query spread its attention evenly over
    its t + 1 keys: the score of a head that does not look for anything.

    Shapes:
        queries (K,) -> float
    """
    return (1.0 / (queries.double() + 1)).mean().item()


def previous_positions(windows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Every query but the first, and the key just before it.

    Shapes:
        windows (W, L) -> rows, queries, keys (K,)
    """
    W, L = windows.shape
    rows, queries = torch.meshgrid(torch.arange(W), torch.arange(1, L), indexing="ij")
    return rows.flatten(), queries.flatten(), queries.flatten() - 1


def repeat_positions(windows: Tensor, n: int = REPEAT_BYTES) -> tuple[Tensor, Tensor, Tensor]:
    """The queries whose last ``n`` bytes occurred earlier in their window, and the byte after the
    most recent earlier occurrence (the key an induction head reads; it must come before the query).

    Shapes:
        windows (W, L) -> rows, queries, keys (K,)
    """
    check.positive_int("repeat_positions", "n", n)
    rows, queries, keys = [], [], []
    for b, window in enumerate(windows.tolist()):
        seen: dict[tuple, int] = {}  # n bytes -> the last position where they ended
        for t in range(n - 1, len(window)):
            gram = tuple(window[t - n + 1 : t + 1])
            j = seen.get(gram)
            if j is not None and j + 1 < t:
                rows.append(b), queries.append(t), keys.append(j + 1)
            seen[gram] = t
    return torch.tensor(rows, dtype=torch.long), torch.tensor(queries, dtype=torch.long), torch.tensor(keys, dtype=torch.long)


def line_positions(windows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Every query after a newline of its window, and the last newline before it (the end of the
    previous line, which is where the query's own line starts).

    Shapes:
        windows (W, L) -> rows, queries, keys (K,)
    """
    rows, queries, keys = [], [], []
    for b, window in enumerate(windows.tolist()):
        last = None
        for t, byte in enumerate(window):
            if last is not None:
                rows.append(b), queries.append(t), keys.append(last)
            if byte == NEWLINE:
                last = t
    return torch.tensor(rows, dtype=torch.long), torch.tensor(queries, dtype=torch.long), torch.tensor(keys, dtype=torch.long)


def bracket_positions(windows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Every query inside a bracket opened earlier in its window and not yet closed (the closing
    bracket itself included), and the innermost such opening bracket.

    Shapes:
        windows (W, L) -> rows, queries, keys (K,)
    """
    rows, queries, keys = [], [], []
    for b, window in enumerate(windows.tolist()):
        stack: list[int] = []
        for t, byte in enumerate(window):
            if stack:
                rows.append(b), queries.append(t), keys.append(stack[-1])
            if byte in OPENERS:
                stack.append(t)
            elif byte in CLOSERS and stack:
                stack.pop()
    return torch.tensor(rows, dtype=torch.long), torch.tensor(queries, dtype=torch.long), torch.tensor(keys, dtype=torch.long)


def role_positions(windows: Tensor) -> dict[str, tuple[Tensor, Tensor, Tensor]]:
    """The scored triples of every role of :data:`ROLES`.

    Shapes:
        windows (W, L) -> {role: (rows, queries, keys)}
    """
    finders = (previous_positions, repeat_positions, line_positions, bracket_positions)
    return {role: find(windows) for role, find in zip(ROLES, finders)}


@torch.no_grad()
def head_scores(model: TinyTransformer, windows: Tensor, batch_size: int = 32) -> dict[str, list[list[float]]]:
    """Every head's score for every role, over ``windows``: one list of H floats per layer.

    Shapes:
        windows (W, L) -> {role: num_layers x H}
    """
    sums = {role: torch.zeros(model.num_layers, model.num_heads, dtype=torch.float64) for role in ROLES}
    counts = dict.fromkeys(ROLES, 0)
    for start in range(0, len(windows), batch_size):
        chunk = windows[start : start + batch_size]
        _, weights = model(chunk, need_weights=True)  # num_layers x (b, H, L, L)
        for role, (rows, queries, keys) in role_positions(chunk).items():
            if len(rows):
                for layer, w in enumerate(weights):
                    sums[role][layer] += mean_weight_at(w, rows, queries, keys).double() * len(rows)
                counts[role] += len(rows)
    return {role: (sums[role] / counts[role]).tolist() for role in ROLES}


@contextlib.contextmanager
def knocked_out(model: TinyTransformer, heads: Iterable[tuple[int, int]]) -> Iterator[None]:
    """While inside, each (layer, head) of ``heads`` adds nothing: its D columns of its layer's
    output projection read zeros (forward pre-hooks, removed on leaving).

    Shapes:
        no tensors of its own
    """
    heads = sorted(set(heads))
    check.that(all(0 <= layer < model.num_layers and 0 <= h < model.num_heads for layer, h in heads),
               "knocked_out", lambda: f"`heads` must be (layer, head) pairs with layer in 0..{model.num_layers - 1} "
               f"and head in 0..{model.num_heads - 1}; got {heads}")
    hooks = []
    for layer in {layer for layer, _ in heads}:
        attn = model.blocks[layer].attn
        D = attn.head_dim
        keep = torch.ones(model.embed_dim)
        for _, h in (p for p in heads if p[0] == layer):
            keep[h * D : (h + 1) * D] = 0

        def zero(module: nn.Module, args: tuple[Tensor], keep: Tensor = keep) -> tuple[Tensor]:
            return (args[0] * keep,)  # (B, L, E): head h in columns h·D .. h·D + D - 1

        hooks.append(attn.out_proj.register_forward_pre_hook(zero))
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


@contextlib.contextmanager
def mean_ablated(model: TinyTransformer, heads: Iterable[tuple[int, int]], windows: Tensor) -> Iterator[None]:
    """While inside, each (layer, head) of ``heads`` outputs, at every position, its mean output
    over ``windows`` (every position of every window) instead of what it computes: the control
    chapter 12 puts beside a knock-out, which keeps the head's average contribution to the
    residual stream and removes only what depends on the input.

    Shapes:
        windows (W, L); no tensors returned
    """
    heads = sorted(set(heads))
    with knocked_out(model, heads):  # checks the heads; nothing runs inside
        pass
    means, hooks = {}, []
    for layer in {layer for layer, _ in heads}:
        out_proj = model.blocks[layer].attn.out_proj
        seen: list[Tensor] = []
        hook = out_proj.register_forward_pre_hook(lambda module, args, seen=seen: seen.append(args[0]))
        try:
            with torch.no_grad():
                for start in range(0, len(windows), 64):
                    model(windows[start : start + 64])
        finally:
            hook.remove()
        means[layer] = torch.cat([x.reshape(-1, model.embed_dim) for x in seen]).mean(dim=0)  # (E,)
    try:
        for layer, mean in means.items():
            D = model.blocks[layer].attn.head_dim
            keep = torch.ones(model.embed_dim, dtype=torch.bool)
            for _, h in (p for p in heads if p[0] == layer):
                keep[h * D : (h + 1) * D] = False

            def replace(module: nn.Module, args: tuple[Tensor], keep: Tensor = keep, mean: Tensor = mean) -> tuple[Tensor]:
                return (torch.where(keep, args[0], mean),)  # (B, L, E): the heads' columns hold their mean

            hooks.append(model.blocks[layer].attn.out_proj.register_forward_pre_hook(replace))
        yield
    finally:
        for hook in hooks:
            hook.remove()


@torch.no_grad()
def token_losses(model: TinyTransformer, windows: Tensor, heads: Iterable[tuple[int, int]] = (),
                 batch_size: int = 64) -> Tensor:
    """The loss of every next-byte prediction of ``windows``, with ``heads`` knocked out.

    Shapes:
        windows (W, L) -> (W, L - 1)
    """
    with knocked_out(model, heads):
        return torch.cat([next_token_losses(model(windows[s : s + batch_size]), windows[s : s + batch_size])
                          for s in range(0, len(windows), batch_size)])


def helped_tokens(windows: Tensor) -> dict[str, Tensor]:
    """For each role, the predictions it should help (a mask over the predicting positions):

    * induction and previous token: a repeat's continuation (the query of :func:`repeat_positions`
      whose next byte is the byte after the earlier occurrence, the byte an induction head copies);
    * line start: the predictions of a line's indentation (a query that is a newline, or a space
      with only spaces since the newline);
    * open bracket: the predictions of a closing bracket inside brackets.

    Shapes:
        windows (W, L) -> {role: bool (W, L - 1)}
    """
    W, L = windows.shape
    rows, queries, keys = repeat_positions(windows)
    repeat = torch.zeros(W, L - 1, dtype=torch.bool)
    inside = queries < L - 1
    continues = windows[rows[inside], queries[inside] + 1] == windows[rows[inside], keys[inside]]
    repeat[rows[inside][continues], queries[inside][continues]] = True
    indent = torch.zeros(W, L - 1, dtype=torch.bool)
    for b, window in enumerate(windows.tolist()):
        at_start = False
        for t, byte in enumerate(window[:-1]):
            at_start = byte == NEWLINE or (at_start and byte == ord(" "))
            indent[b, t] = at_start
    closing = torch.zeros(W, L - 1, dtype=torch.bool)
    rows, queries, _ = bracket_positions(windows)
    inside = queries < L - 1
    rows, queries = rows[inside], queries[inside]
    is_closer = torch.isin(windows[rows, queries + 1], torch.tensor(list(CLOSERS)))
    closing[rows[is_closer], queries[is_closer]] = True
    return {"previous token": repeat, "induction": repeat, "line start": indent, "open bracket": closing}


def knockout_effects(base: Tensor, knocked: Tensor, helped: Tensor) -> dict[str, float]:
    """The mean loss on the helped predictions and on the others, before and after a knock-out.

    Shapes:
        base (W, L - 1), knocked (W, L - 1), helped bool (W, L - 1) -> floats
    """
    check.that(base.shape == knocked.shape == helped.shape and bool(helped.any()) and not bool(helped.all()),
               "knockout_effects", lambda: f"`base`, `knocked` and `helped` must share one shape and `helped` "
               f"must mark some predictions but not all; got {tuple(base.shape)}, {tuple(knocked.shape)}, "
               f"{tuple(helped.shape)}")
    return {"helped_before": base[helped].mean().item(), "helped_after": knocked[helped].mean().item(),
            "others_before": base[~helped].mean().item(), "others_after": knocked[~helped].mean().item(),
            "helped_count": int(helped.sum())}


def nested_bracket_weights(weights: Tensor, windows: Tensor) -> dict[str, float]:
    """One head's weights read against the brackets: over the queries at least two brackets deep,
    its mean weight on the innermost open bracket and on the outermost; over the queries outside
    every bracket that follow a closed one, its mean weight on the opening bracket of the bracket
    closed last, and what weights spread evenly would put there.

    Shapes:
        weights (W, L, L) one head's, windows (W, L) -> {"inner", "outer", "deep_queries",
        "outside", "outside_even", "outside_queries"}
    """
    check.tensor("nested_bracket_weights", "weights", weights, "W, L, L", floating=True)
    inner, outer, outside, even = [], [], [], []
    for b, window in enumerate(windows.tolist()):
        stack: list[int] = []
        closed = None  # the opening bracket of the bracket closed last
        for t, byte in enumerate(window):
            if len(stack) >= 2:
                inner.append(weights[b, t, stack[-1]]), outer.append(weights[b, t, stack[0]])
            elif not stack and closed is not None:
                outside.append(weights[b, t, closed]), even.append(1.0 / (t + 1))
            if byte in OPENERS:
                stack.append(t)
            elif byte in CLOSERS and stack:
                closed = stack.pop()

    def mean(values: list) -> float:
        return torch.tensor([float(v) for v in values], dtype=torch.float64).mean().item() if values else float("nan")

    return {"inner": mean(inner), "outer": mean(outer), "deep_queries": len(inner),
            "outside": mean(outside), "outside_even": mean(even), "outside_queries": len(outside)}


@torch.no_grad()
def closing_losses(model: TinyTransformer, windows: Tensor, heads: Iterable[tuple[int, int]] = ()) -> dict[str, float]:
    """The loss of the predictions of a closing bracket inside brackets (``helped_tokens``' "open
    bracket"), with ``heads`` knocked out, split in two: *whether* a closer comes,
    -log of the probability of all three closers together, and *which* closer,
    -log of the right closer's share of that probability. The two add up to the loss.

    Shapes:
        windows (W, L) -> {"whether", "which", "loss", "count"}
    """
    helped = helped_tokens(windows)["open bracket"]  # (W, L - 1)
    closers = torch.tensor(list(CLOSERS))
    with knocked_out(model, heads):
        logits = torch.cat([model(windows[s : s + 64]) for s in range(0, len(windows), 64)])  # (W, L, V)
    log_p = logits[:, :-1].log_softmax(dim=-1)[helped]  # (K, V)
    right = log_p.gather(-1, windows[:, 1:][helped][:, None])[:, 0]  # (K,)
    any_closer = log_p[:, closers].logsumexp(dim=-1)  # (K,)
    return {"whether": -any_closer.mean().item(), "which": (any_closer - right).mean().item(),
            "loss": -right.mean().item(), "count": int(helped.sum())}


def icl_score(losses: Tensor, early: tuple[int, int] = EARLY, late: tuple[int, int] = LATE) -> float:
    """Olsson et al.'s in-context learning score: the mean loss of the predictions late in the
    window minus that of the predictions early (negative: the model predicts better once it has
    read more of the text).

    Shapes:
        losses (W, L - 1) -> float
    """
    check.that(0 <= early[0] < early[1] <= late[0] < late[1] <= losses.shape[1], "icl_score",
               lambda: f"`early` and `late` must be ordered ranges of predicting positions within 0..{losses.shape[1]}; "
               f"got {early} and {late}")
    return (losses[:, late[0] : late[1]].mean() - losses[:, early[0] : early[1]].mean()).item()


def measure(model: TinyTransformer, windows: Tensor) -> dict:
    """Every head's scores; for each role the head with the highest score, the uniform baseline
    on the same queries and the knock-out's effect on the loss; the ICL score with every head, and
    without the induction heads: the best one, and every head whose induction score is at least
    :data:`INDUCTION_FACTOR` times the uniform baseline.

    Shapes:
        windows (W, L) -> a JSON-ready dict
    """
    scores = head_scores(model, windows)
    positions = role_positions(windows)
    helped = helped_tokens(windows)
    base = token_losses(model, windows)
    found = {}
    for role in ROLES:
        table = torch.tensor(scores[role])  # (num_layers, H)
        layer, head = divmod(int(table.argmax()), model.num_heads)
        knocked = token_losses(model, windows, [(layer, head)])
        found[role] = {"layer": layer, "head": head, "score": table[layer, head].item(),
                       "uniform": uniform_weight_at(positions[role][1]), "queries": len(positions[role][1]),
                       "knockout": knockout_effects(base, knocked, helped[role])}
    induction = torch.tensor(scores["induction"]).flatten()  # (num_layers·H,)
    top = found["induction"]
    chosen = {(top["layer"], top["head"])} | {divmod(int(i), model.num_heads)
                                              for i in torch.nonzero(induction >= INDUCTION_FACTOR * top["uniform"])}
    induction_heads = sorted(chosen)
    without = token_losses(model, windows, induction_heads)
    return {"scores": scores, "found": found, "loss": base.mean().item(),
            "icl": {"early": list(EARLY), "late": list(LATE), "with_all_heads": icl_score(base),
                    "induction_heads": [list(p) for p in induction_heads], "without_induction_heads": icl_score(without),
                    "loss_without_induction_heads": without.mean().item()}}


def load_results(data_dir: str | pathlib.Path = DATA_DIR) -> dict:
    """The verified results JSON written by :func:`main`.

    Shapes:
        no tensors
    """
    return load_json_file(pathlib.Path(data_dir) / RESULTS_FILE)


def main(argv: Sequence[str] | None = None) -> None:
    """The command line: ``python -m attnbook_tools.text_heads --help``.

    Shapes:
        no tensors
    """
    parser = argparse.ArgumentParser(prog="python -m attnbook_tools.text_heads",
                                     description="Score, find and knock out the heads of the shipped text model "
                                                 "on the held-out text.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data", default=str(DATA_DIR), help="where the model and the corpus are")
    parser.add_argument("--out", default=str(DATA_DIR))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_text_model(args.seed, args.data)
    windows = validation_windows(text_parts(args.data)[1], model.max_len)
    found = measure(model, windows)
    out = pathlib.Path(args.out)
    path = out / RESULTS_FILE
    results = json.loads(path.read_text()) if path.is_file() else {}
    results.setdefault("runs", {})[f"seed{args.seed}"] = found
    results["setup"] = {"repeat_bytes": REPEAT_BYTES, "roles": list(ROLES), "windows": len(windows)}
    write_results(path, results)
    for role, entry in found["found"].items():
        print(f"{role:>15}: layer {entry['layer']} head {entry['head']} score {entry['score']:.3f} "
              f"(uniform {entry['uniform']:.3f}); knocked out: helped {entry['knockout']['helped_before']:.3f} -> "
              f"{entry['knockout']['helped_after']:.3f}, others {entry['knockout']['others_before']:.3f} -> "
              f"{entry['knockout']['others_after']:.3f}")
    print("ICL", found["icl"])


if __name__ == "__main__":
    main()
