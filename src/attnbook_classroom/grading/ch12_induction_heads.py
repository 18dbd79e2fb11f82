"""Chapter 12, induction heads: the induction score of a head (a function), knocking out the heads
of the shipped model (an experiment), and where the two heads attend (a prediction)."""

from __future__ import annotations

import functools

import torch

from attnbook.tasks.induction import copy_loss, copy_targets, induction_batch, induction_score, previous_token_score
from attnbook_classroom.grading.compare import Wrong, check_number, compare
from attnbook_classroom.grading.harness import answer, call, exercise, part, seeded_answer
from attnbook_classroom.grading.sealed import Sealed

# ------------------------------------------------------------------------------------------------
# Exercise 12.1: induction_score (a function)
# ------------------------------------------------------------------------------------------------

INDUCTION_SCORE = exercise(
    "induction_score",
    "fn(weights (B, H, L, L), first (B,), second (B,), segment_len) -> (H,): for each head, the mean "
    "weight, over the queries second + k (k = 0 .. segment_len - 2) of every sequence, on the key "
    "first + k + 1: the token right after the earlier occurrence of the query's token.",
    check_blocks=["attnbook.tasks.induction.induction_score"])


def score_inputs(case, B, H, L, N):
    """Random weights (rows sum to 1 under the causal mask) and random places of the two segments."""
    scores = case.randn(B, H, L, L) * 2
    weights = scores.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
    first = torch.tensor([case.randint(0, L - 2 * N) for _ in range(B)])  # (B,)
    second = torch.tensor([case.randint(int(f) + N, L - N) for f in first])  # (B,)
    return weights, first, second


def score_variants(weights, first, second, N):
    """Typical wrong induction scores, each with what it got wrong."""
    B, H, L, _ = weights.shape
    rows = torch.arange(B)[:, None]
    w = weights.permute(0, 2, 3, 1)  # (B, L, L, H)

    def on(queries, keys):
        return w[rows, queries, keys]  # (B, n, H)

    queries, answers = copy_targets(first, second, N)  # (B, N-1)
    k_all = torch.arange(N)
    return [
        ("You took the weight on the earlier occurrence itself (first + k); an induction head attends to "
         "the token right AFTER it (first + k + 1), the token that came next last time.",
         lambda: on(queries, answers - 1).mean(dim=(0, 1))),
        ("You looked two positions past the earlier occurrence (first + k + 2); the token to copy is the "
         "one right after it (first + k + 1).", lambda: on(queries, (answers + 1).clamp(max=L - 1)).mean(dim=(0, 1))),
        ("You included the copy's last token (k = segment_len - 1): the token after it is not part of the "
         "copy, so nothing there can be predicted; use k = 0 .. segment_len - 2.",
         lambda: on(second[:, None] + k_all, (first[:, None] + k_all + 1)).mean(dim=(0, 1))),
        ("You left out the copy's first token (k = 0): its token is already a repeat, so the query at "
         "`second` can already look up what followed it earlier; use k = 0 .. segment_len - 2.",
         lambda: on(queries[:, 1:], answers[:, 1:]).mean(dim=(0, 1))),
        ("You also scored the queries of the first segment (first + k), which have no earlier occurrence "
         "to look back to; score only the copy's queries (second + k).",
         lambda: on(queries, answers).mean(dim=(0, 1)) / 2),
        ("You divided by the sequence length L, not by the number of scored queries: average over the "
         "copy's segment_len - 1 queries only.", lambda: on(queries, answers).sum(dim=1).mean(dim=0) / L),
        ("You averaged over the heads (one number per sequence or query); the score is one number per "
         "head: average over the sequences and the queries, keep the heads.",
         lambda: on(queries, answers).mean(dim=(1, 2))),
        ("You averaged over the sequences and the heads; keep the heads and average over the sequences "
         "and the queries.", lambda: on(queries, answers).mean(dim=(0, 2))),
        ("That is the previous-token score (the weight on position t - 1), not the induction score.",
         lambda: previous_token_score(weights)),
    ]


def induction_case(case, B, H, L, N):
    weights, first, second = score_inputs(case, B, H, L, N)
    out = yield call(weights, first, second, N)
    compare(out, induction_score(weights, first, second, N), "induction score",
            score_variants(weights, first, second, N))


@part(INDUCTION_SCORE, "random_weights")
def induction_random(case):
    yield from induction_case(case, case.size(3, 2, 5), case.size(4, 2, 6), case.size(24, 20, 32), case.size(5, 3, 6))


@part(INDUCTION_SCORE, "one_sequence")
def induction_one(case):
    yield from induction_case(case, 1, case.size(2, 3, 5), case.size(16, 12, 20), case.size(4, 3, 5))


# ------------------------------------------------------------------------------------------------
# Exercise 12.2: knock_out_heads (an experiment on the shipped model)
# ------------------------------------------------------------------------------------------------

KNOCK_OUT = exercise(
    "knock_out_heads",
    "answer: a dict {'seed': int, 'previous_token': float, 'induction': float}: with the shipped model "
    "trained with seed 0 (attnbook_tools.induction.load_model(0)) and the batch induction_batch(500, 32, "
    "8, 16, generator=torch.Generator().manual_seed(seed)), the copy loss (copy_loss) with the model's "
    "previous-token head knocked out, and with its induction head knocked out (one head at a time). "
    "'seed' only draws the batch; the model is always seed 0's.")

KNOCK_BATCH = 500
OTHER_MODEL_SEEDS = (1, 2, 3)  # the other shipped models: loading one of them is a mistake to name


@functools.lru_cache(maxsize=1)
def shipped_heads():
    """The shipped model, its previous-token head and its induction head (the highest score of each
    on the test batch), and every head's scores."""
    return model_heads(0)


@functools.lru_cache(maxsize=4)
def model_heads(model_seed: int):
    """The shipped model trained with ``model_seed``, its previous-token head and its induction head
    (the highest score of each on the test batch), and every head's scores."""
    from attnbook_tools.induction import load_model, measure_heads, test_batch

    model, _ = load_model(model_seed)
    scores = {kind: torch.tensor(table) for kind, table in measure_heads(model, test_batch()).items()}
    found = {}
    for kind, table in scores.items():  # table (layers, H)
        layer, head = divmod(int(table.argmax()), table.shape[1])
        found[kind] = (layer, head)
    return model, found, scores


def knock_batch(seed: int):
    """The exercise's batch drawn with the student's seed: tokens (B, L), first (B,), second (B,)."""
    from attnbook_tools.induction import CONFIG, TRAINING

    return induction_batch(KNOCK_BATCH, TRAINING["seq_len"], TRAINING["segment_len"], CONFIG["vocab_size"],
                           generator=torch.Generator().manual_seed(seed))


@functools.lru_cache(maxsize=8)
def other_model_losses(seed: int) -> dict:
    """On the seeded batch, the copy loss of each other shipped model (seeds 1..3) with its own
    previous-token or induction head knocked out: {model_seed: {kind: loss}}; a model whose weights
    are not shipped is left out."""
    from attnbook_tools.induction import TRAINING, checkpoint_path

    n = TRAINING["segment_len"]
    tokens, first, second = knock_batch(seed)
    out = {}
    with torch.no_grad():
        for model_seed in OTHER_MODEL_SEEDS:
            if not checkpoint_path(model_seed).exists():
                continue
            model, found, _ = model_heads(model_seed)
            out[model_seed] = {kind: copy_loss(model(tokens, knock_out={head}), tokens, first, second, n)[0].item()
                               for kind, head in found.items()}
    return out


@functools.lru_cache(maxsize=8)
def knocked_losses(seed: int):
    """Copy loss and accuracy of the shipped model on the seeded batch: whole, and each head knocked out."""
    model, found, _ = shipped_heads()
    from attnbook_tools.induction import TRAINING

    n = TRAINING["segment_len"]
    tokens, first, second = knock_batch(seed)
    out = {}
    with torch.no_grad():
        out[None] = copy_loss(model(tokens), tokens, first, second, n)
        for layer in range(model.num_layers):
            for head in range(model.num_heads):
                out[(layer, head)] = copy_loss(model(tokens, knock_out={(layer, head)}), tokens, first, second, n)
        both = set(found.values())
        out["both"] = copy_loss(model(tokens, knock_out=both), tokens, first, second, n)
    return {key: (loss.item(), accuracy.item()) for key, (loss, accuracy) in out.items()}


def knock_part(kind: str):
    def run(case):
        got, seed = yield from seeded_answer(("previous_token", "induction"), "torch.Generator().manual_seed")
        _, found, scores = shipped_heads()
        losses = knocked_losses(seed)
        target = found[kind]
        ref, accuracy = losses[target]
        name = kind.replace("_", "-")
        wrong = [
            ("That is the copy loss of the whole model, with no head knocked out: pass "
             f"knock_out={{(layer, head)}} with the {name} head's layer and head.", losses[None][0]),
            ("That is the copy ACCURACY; the question asks for the copy loss (the first value copy_loss "
             "returns).", accuracy),
            ("That is the loss with both heads knocked out at once; knock out one head at a time.",
             losses["both"][0]),
        ]
        for other, (loss, _) in losses.items():
            if isinstance(other, tuple) and other != target:
                role = next((k for k, v in found.items() if v == other), None)
                if role:
                    which = f"the {role.replace('_', '-')} head"
                elif scores[kind][other] > 0.5:
                    which = (f"another head with a high {name} score ({scores[kind][other]:.2f}); the "
                             f"question asks for the highest-scoring one")
                else:
                    which = "a head that is neither of the two"
                wrong.append((f"That is the loss with layer {other[0]}, head {other[1]} knocked out, "
                              f"{which}; find the {name} head by its score.", loss))
        for model_seed, theirs in other_model_losses(seed).items():
            wrong.append((f"That is the loss of the model trained with seed {model_seed} "
                          f"(load_model({model_seed})). The exercise measures the seed-0 model, load_model(0), "
                          f"whatever seed you choose: your seed only draws the batch.", theirs[kind]))
        check_number(got.get(kind), ref, f"the {name} head knocked out (seed {seed})", wrong,
                     rel_tol=1e-4, abs_tol=1e-4)
    run.__name__ = f"knock_out_heads_{kind}"
    return run


for _kind in ("previous_token", "induction"):
    part(KNOCK_OUT, _kind)(knock_part(_kind))


# ------------------------------------------------------------------------------------------------
# Exercise 12.3: induction_attends (a prediction; the answers are sealed)
# ------------------------------------------------------------------------------------------------

ATTENDS = exercise(
    "induction_attends",
    "answer: a dict {'induction': int, 'previous_token': int, 'copying': letter}: on the tokens "
    "8 3 14 6 1 10 5 3 14 6 1 12 (positions 0 to 11), the position query 9 of an ideal induction "
    "head attends to, the position query 9 of an ideal previous-token head attends to, and which of "
    "A, B, C happens to the copy loss of the shipped model when its previous-token head is knocked out.")

# "part=value": the right answer; "part@value": a note for that wrong value
# (python -m attnbook_classroom.grading.sealed).
ATTENDS_NOTES = Sealed("induction_attends", {
    "5ad3772d7cd7608b5ab9bd3ad1bb20df": "",
    "beaa133a5b16de445f0bf44e4dc8e19b": "",
    "038d237a11e865adaaf82054d253520f": "",
    "61baebb8d93b5a0f766b528e365def48": "R6Q2tCwtBbhAiaU3jqOC2j37pU0oo7OT0Sexs0vrUEQs2CNlCHRiH261si6bR2WWNttQCDTrhIWCH+j4LY2fiiAJihYfYRw7tMAkncpznW2KHQoWb7S7E6rIf90lEqI9aiUmcubx4sJA2YC9I4mdexUW8zqw9I6mAYrw051gNMeQZTPbF4pDQ++E3y11hrqt9j8W1fbto7mHzcmy",
    "5e21085c28a29e0c9a89f661f1663732": "c4aCLTH09V6aL9qp+vFOV6GYZRMtuqvoP6XMBNKpl8yOZshD4yA8KQrHPqB207B0gv7kRgrXHgES7yo50ndqiiCKG0azkRXiz1PtWsjOOote9uYeewkJFqWXTraFaC/hKgh6NpVdKWGejollSVkOP0wyFXh0F2c=",
    "94b224a34fb008404aea7b9fb13fee1e": "I5MZpYhIvk991Zlz8qRcy2rmEKvVbHkiB+6WP+V44Km8dwJz/+Le0HCXjkmar8OGPQ0wAMzsRgv8IYHcquUkQRkUUA9OeU+H6CImpbCLMDHa8w1l0oPupGLzondLsZS7DUqzO4KXNgwYV4QMTtPuxTVkzn11az7kSw==",
    "6b2cf3c18095821b941425d8c27e3a62": "s18wA14uYiZC9o2eILCO3gU2wqpxyD8g96PpvQYTVyuCx+xqMrt5R51aEku7MTJvIy3pzE/56fPyP71+jJqj6bcxEZiOAkmmOWc0CkRNFF/TUURJ1Mo=",
    "20fb71df1d492f0a67b54c3e306a97f4": "BAHzrS1QdrhsUJ8pXe58jYYgXmGgpoWpRKqG4E2jbaMxjG1AG7daG2UpFmTu23uHcHndXq3TdYsEXmHOtCFtE/bLh1qzmYw8C0/ZiKLfeyWWZVaqfM+Ickr+/rOBLICkn7oLUgo9AVYPhpj2RX95LcU=",
    "8ea452d24097c480ad1c1165272d87ad": "53qCta3ZVYAEW9oyZJnkbwFUUcBkH9zXaBMEEaJb3HOMp4h40zdc9dbAehVzgV1i8C23kLWX74reIRrB49oR5M+mdtW/7R/KvIi7ktTtb4lzgenesw==",
    "9873a941bbadf5df94bb76aa0f288daa": "Iqt2ArRe1471pIa02g5VE03zZOee7/RiKWmvfaV5r1SUtgobYqfIIK6TeT+tDEtk38X4t3PV+3E3kaJUMu3GO0U52yt/ucSOgUqFXcDu3ZQIX4GHLk7SkuYGLjxX19pZSBNZDirsnQ+FBRSTj61SuGJw+b5AgpATebhOs/2azAQPhJWJgol6",
    "083b81bf00c1048b163dddfcbb9f8dcb": "AAesnq8Qg/7kl2FCXSno+R/p8FQgy4B859+ZD1rpqnhBoYabzKmFc6OZdPn0kX5zpN5KZqIt3I047+UAJZVzcxF/DDMCTbLbzbeImHwZ1zqRMU6k1+oqV6rQ/y1yobWZ0/lvOn/4AY4+cMnF3AE0Hm3NFvT7h4KscVNBFGI=",
    "ff8206e678c17fc7625636f2cf93b2b2": "sEidZPlejna4a/zGVleH3KMIKizz89xl53OlrCpNqZoOz6Nqme90AhSX3RmPI94XCZsqV+cfrYDFyX6p1uIq/VyZr6kLgWBt6yrFQWTu0oYzrP9kpH4=",
    "6917e786bf0b1fa1dee8cd4372d5daab": "fo1554Uzv3eYFvsoTobTgKwt4oxF2kKhxwbFdDuFyXyHCaK6TzubjqNyThhYuAzzMrQRQJ7asdQFAIUGw7JTLhehdcace+DQH94rAt21t1+jp275UEW5BLr0BjmZRa3X1PcEVNySpO8GDk+hOyKrHjZ6/QSTVkLcj+v3AZ0x2NxhtoHtOTHrciqscMYcXyKh8e6HlXHOt5jV7AmoRZNpy8Q=",
    "3abae8b1647ec13b7791fe19a674115e": "YE4u61mFylH52ToBA/bUmM9EKXmp+1Pyb3l1yk189Yo/VJdMeFcJAUU/Lngie8CPsRx+iYYRbqk4nw6m9B9ckpzCLq31BSAh7VK48uArxidcZR1VHpKm3A==",
})


def attends_part(name: str, kind: str):
    def run(case):
        got = yield answer()
        if not isinstance(got, dict):
            raise Wrong(f"Your answer is {got!r:.80}; expected a dict such as "
                        "{'induction': 2, 'previous_token': 7, 'copying': 'A'}.")
        value = got.get(name)
        if kind == "position":
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 11:
                raise Wrong(f"Your answer for {name!r} is {value!r:.40}; expected a position, an int in 0..11.")
        else:
            value = value.strip().upper() if isinstance(value, str) else value
            if value not in ("A", "B", "C"):
                raise Wrong(f"Your answer for {name!r} is {value!r:.40}; expected one of the letters 'A', 'B', 'C'.")
        if ATTENDS_NOTES.holds(f"{name}={value}"):
            return
        note = ATTENDS_NOTES.message(f"{name}@{value}")
        raise Wrong(f"Your answer for {name!r} is {value}, which is not right" + (f": {note}." if note else "."))
    run.__name__ = f"induction_attends_{name}"
    return run


for _name, _kind in (("induction", "position"), ("previous_token", "position"), ("copying", "letter")):
    part(ATTENDS, _name)(attends_part(_name, _kind))
