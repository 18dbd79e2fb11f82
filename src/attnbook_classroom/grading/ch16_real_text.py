"""Chapter 16, a language model of real text: the open-bracket score of a head (a function),
knocking out the shipped model's open-bracket head (an experiment), and where the heads attend and
which bracket the model closes (a prediction)."""

from __future__ import annotations

import functools
import math

import torch

from attnbook_classroom.grading.compare import Wrong, check_number, compare
from attnbook_classroom.grading.harness import answer, call, exercise, part, seeded_answer
from attnbook_classroom.grading.sealed import Sealed

OPENERS, CLOSERS = b"([{", b")]}"

# ------------------------------------------------------------------------------------------------
# Exercise 16.1: bracket_score (a function)
# ------------------------------------------------------------------------------------------------

BRACKET_SCORE = exercise(
    "bracket_score",
    "fn(weights (W, H, L, L), windows (W, L) int64 bytes) -> (H,): for each head, the mean weight, over "
    "every query inside a bracket opened earlier in its window and not yet closed (the closing bracket "
    "itself included), on the innermost such open bracket; brackets are the bytes of ([{ and )]}, not "
    "matched by kind, and a closing bracket with nothing open is ignored.",
    check_blocks=["attnbook_tools.text_heads.bracket_positions", "attnbook_tools.text_heads.role_positions",
                  "attnbook_tools.text_heads.head_scores"])


def bracket_triples(windows, *, which="innermost", closer=True, opener="before", kind=False, closer_key="opener"):
    """The scored (window, query, key) triples of the open-bracket score, and its typical wrong
    versions, each named by the option it changes: ``which`` open bracket is the key, whether the
    ``closer`` is a query, whether an ``opener`` is recorded before or after it is pushed, whether a
    closer pops only a bracket of its own ``kind``, and which key a closer's query reads."""
    rows, queries, keys = [], [], []
    pairs = dict(zip(CLOSERS, OPENERS))
    for b, window in enumerate(windows.tolist()):
        stack: list[int] = []
        for t, byte in enumerate(window):
            if byte in OPENERS and opener == "after":
                stack.append(t)
            is_closer = byte in CLOSERS and bool(stack)
            if kind and is_closer and window[stack[-1]] != pairs[byte]:
                is_closer = False
            if is_closer and not closer:
                stack.pop()
                continue
            if stack:
                key = t if (is_closer and closer_key == "self") else (stack[-1] if which == "innermost" else stack[0])
                rows.append(b), queries.append(t), keys.append(key)
            if byte in OPENERS and opener == "before":
                stack.append(t)
            elif is_closer:
                stack.pop()
    return (torch.tensor(rows, dtype=torch.long), torch.tensor(queries, dtype=torch.long),
            torch.tensor(keys, dtype=torch.long))


def weight_at(weights, rows, queries, keys):
    """The weight of every head on each triple's key: (K, H)."""
    return weights.permute(0, 2, 3, 1)[rows, queries, keys]


def bracket_reference(weights, windows):
    rows, queries, keys = bracket_triples(windows)
    return weight_at(weights, rows, queries, keys).mean(dim=0)


def bracket_variants(weights, windows):
    """Typical wrong open-bracket scores, each with what it got wrong."""
    W, H, L, _ = weights.shape
    rows, queries, keys = bracket_triples(windows)
    on = weight_at(weights, rows, queries, keys)  # (K, H)

    def with_options(**options):
        return lambda: weight_at(weights, *bracket_triples(windows, **options)).mean(dim=0)

    previous = torch.arange(1, L)
    return [
        ("You took the weight on the OUTERMOST open bracket (the first one still open); the score reads the "
         "innermost one, the bracket the next closing bracket will close (the top of the stack).",
         with_options(which="outermost")),
        ("You left the closing bracket out of the queries: the query AT a closing bracket is still inside "
         "its bracket (it is the byte that closes it), so it is scored too, on the bracket it closes; pop "
         "only after recording it.", with_options(closer=False)),
        ("You recorded an opening bracket's query after pushing it, so that it attends to itself; an "
         "opening bracket is scored only if a bracket was already open before it, on that earlier "
         "bracket: record the query first, then push.", with_options(opener="after")),
        ("You matched the brackets by kind (a `)` closing only a `(`); the score does not: any closing "
         "bracket closes the innermost open bracket, whatever its kind.", with_options(kind=True)),
        ("You took a closing bracket's weight on its own position; the query at a closing bracket is "
         "scored on the opening bracket it closes (the innermost one still open).",
         with_options(closer_key="self")),
        ("You took each scored query's weight on its own position (the diagonal); the key is the innermost "
         "open bracket before the query.", lambda: weight_at(weights, rows, queries, queries).mean(dim=0)),
        ("You averaged over the heads too (one number); the score is one number per head: average over "
         "the scored queries only, keep the heads.", lambda: on.mean()),
        ("You averaged over the heads (one number per scored query); the score is one number per head: "
         "average over the scored queries, keep the heads.", lambda: on.mean(dim=1)),
        ("You divided by W·L, the number of every query, not by the number of scored queries (those "
         "inside brackets): average over the scored queries only.", lambda: on.sum(dim=0) / (W * L)),
        ("You divided by W·(L - 1), the number of every query but the first, not by the number of scored "
         "queries (those inside brackets): average over the scored queries only.",
         lambda: on.sum(dim=0) / (W * (L - 1))),
        ("That is the previous-token score (every query's weight on position t - 1), not the open-bracket "
         "score.", lambda: weights.diagonal(-1, -2, -1).mean(dim=(0, 2))),
        ("You took the weight on the byte just before each scored query (key t - 1); the key is the "
         "innermost open bracket, which is often further back.",
         lambda: weight_at(weights, rows, queries, queries - 1).mean(dim=0)),
    ]


def bracket_weights(case, W, H, L):
    """Random weights whose rows sum to 1 under the causal mask."""
    scores = case.randn(W, H, L, L) * 2
    return scores.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf")).softmax(-1)


ALPHABET = b"([{)]}" + b"abxy  ,"


def random_windows(case, W, L):
    """Bytes of a small alphabet with the six brackets; every window opens a bracket near its start,
    so each one has queries inside brackets, and brackets nest."""
    picks = [[ALPHABET[case.randint(0, len(ALPHABET) - 1)] for _ in range(L)] for _ in range(W)]
    for window in picks:
        window[case.randint(0, 2)] = OPENERS[case.randint(0, 2)]
        window[case.randint(3, 5)] = OPENERS[case.randint(0, 2)]
    return torch.tensor(picks, dtype=torch.long)


def nested_windows(case, W, L):
    """Windows of nested bracket expressions such as ``f(a, [b, {c}])``, with a stray closing
    bracket at the start of some windows (nothing is open yet: it is ignored)."""
    def expression(depth):
        if depth == 0 or case.randint(0, 3) == 0:
            return bytes([b"abcxy"[case.randint(0, 4)]])
        k = case.randint(0, 2)
        items = [expression(depth - 1) for _ in range(case.randint(1, 3))]
        return bytes([OPENERS[k]]) + b", ".join(items) + bytes([CLOSERS[case.randint(0, 2)]])

    out = []
    for w in range(W):
        text = bytes([CLOSERS[case.randint(0, 2)]]) if w % 2 else b""
        while len(text) < L:
            text += b"f" + bytes([OPENERS[case.randint(0, 2)]]) + expression(3) + b", " + expression(3)
        out.append(list(text[:L]))
    return torch.tensor(out, dtype=torch.long)


def bracket_case(case, weights, windows):
    rows, _, _ = bracket_triples(windows)
    assert len(rows) > 0, "the case has no query inside brackets"
    out = yield call(weights, windows)
    compare(out, bracket_reference(weights, windows), "open-bracket score", bracket_variants(weights, windows))


@part(BRACKET_SCORE, "random_windows")
def bracket_random(case):
    W, H, L = case.size(3, 2, 5), case.size(4, 2, 6), case.size(24, 16, 32)
    weights = bracket_weights(case, W, H, L)
    yield from bracket_case(case, weights, random_windows(case, W, L))


@part(BRACKET_SCORE, "nested")
def bracket_nested(case):
    W, H, L = case.size(2, 2, 4), case.size(3, 2, 5), case.size(28, 20, 36)
    weights = bracket_weights(case, W, H, L)
    yield from bracket_case(case, weights, nested_windows(case, W, L))


# ------------------------------------------------------------------------------------------------
# Exercise 16.2: knock_out_bracket (an experiment on the shipped model)
# ------------------------------------------------------------------------------------------------

KNOCK_BRACKET = exercise(
    "knock_out_bracket",
    "answer: a dict {'seed': int, 'closing_before': float, 'closing_after': float}: with the shipped model "
    "load_text_model(0) and the windows text_batch(text_parts()[1], 64, 128, generator=torch.Generator()"
    ".manual_seed(seed)), the mean next-byte loss (token_losses) on the predictions of a closing bracket "
    "inside brackets (helped_tokens(windows)['open bracket']) with the model whole, and with its "
    "open-bracket head (load_results()['runs']['seed0']['found']['open bracket']) knocked out.")

KNOCK_WINDOWS, KNOCK_LENGTH = 64, 128


@functools.lru_cache(maxsize=1)
def text_model():
    """The shipped text model and the heads its results found for each role: {role: (layer, head)}."""
    from attnbook_tools.text_heads import load_results
    from attnbook_tools.text_study import load_text_model

    found = load_results()["runs"]["seed0"]["found"]
    return load_text_model(0), {role: (entry["layer"], entry["head"]) for role, entry in found.items()}


@functools.lru_cache(maxsize=64)
def closing_losses(seed: int, head: tuple[int, int] | None):
    """On the windows drawn with ``seed``: the helped mask (the predictions of a closing bracket
    inside brackets), and every prediction's loss with ``head`` knocked out (None: the model whole):
    bool (W, L - 1), (W, L - 1)."""
    from attnbook_tools.text_heads import helped_tokens, token_losses

    model, _ = text_model()
    windows = seeded_windows(seed)
    return helped_tokens(windows)["open bracket"], token_losses(model, windows, [] if head is None else [head])


def seeded_windows(seed: int, which: int = 1):
    from attnbook.tasks.text import text_batch
    from attnbook_tools.text_study import text_parts

    return text_batch(text_parts()[which], KNOCK_WINDOWS, KNOCK_LENGTH, generator=torch.Generator().manual_seed(seed))


@functools.lru_cache(maxsize=8)
def training_losses(seed: int):
    """The same seeded draw from the training text (a mistake to name): whole and head knocked out."""
    from attnbook_tools.text_heads import helped_tokens, token_losses

    model, found = text_model()
    windows = seeded_windows(seed, which=0)
    helped = helped_tokens(windows)["open bracket"]
    if not bool(helped.any()):
        return None
    return (token_losses(model, windows)[helped].mean().item(),
            token_losses(model, windows, [found["open bracket"]])[helped].mean().item())


@functools.lru_cache(maxsize=1)
def validation_losses():
    """The whole held-out text in windows (validation_windows), whole and head knocked out: the
    closing-bracket loss."""
    from attnbook.tasks.text import validation_windows
    from attnbook_tools.text_heads import helped_tokens, token_losses
    from attnbook_tools.text_study import text_parts

    model, found = text_model()
    windows = validation_windows(text_parts()[1], KNOCK_LENGTH)
    helped = helped_tokens(windows)["open bracket"]
    return (token_losses(model, windows)[helped].mean().item(),
            token_losses(model, windows, [found["open bracket"]])[helped].mean().item())


def knock_variants(key, seed, helped, before, after):
    """The typical wrong answers of exercise 16.2, each with what it got wrong: (message, number)
    pairs measured one at a time while the grader looks for the one an answer matches (the cheapest
    first)."""
    model, found = text_model()
    target = found["open bracket"]
    knocked = before if key == "closing_before" else after
    state = ("with the model whole" if key == "closing_before" else
             f"with the open-bracket head (layer {target[0]}, head {target[1]}) knocked out")
    yield (f"That is the mean loss of EVERY prediction {state}; average only over the predictions of a "
           "closing bracket inside brackets (helped_tokens(windows)['open bracket']).", knocked.mean().item())
    yield (f"That is the mean loss of the OTHER predictions {state} (the mask inverted); average over the "
           "predictions the mask marks.", knocked[~helped].mean().item())
    if key == "closing_before":
        yield ("That is the loss with the open-bracket head knocked out: 'closing_before' is the model whole. "
               "Did you swap before and after?", after[helped].mean().item())
    else:
        yield ("That is the loss of the model whole, with no head knocked out: 'closing_after' knocks out "
               f"the open-bracket head, token_losses(model, windows, [({target[0]}, {target[1]})]). Did you "
               "swap before and after, or pass no heads?", before[helped].mean().item())
        roles = {head: role for role, head in found.items()}
        for head in ((layer, h) for layer in range(model.num_layers) for h in range(model.num_heads)):
            if head == target:
                continue
            which = f"the {roles[head]} head" if head in roles else "a head that is not the open-bracket head"
            yield (f"That is the loss with layer {head[0]}, head {head[1]} knocked out, {which}; knock out "
                   "the open-bracket head, the one the results found for 'open bracket' (layer "
                   f"{target[0]}, head {target[1]}).", closing_losses(seed, head)[1][helped].mean().item())
    index = 0 if key == "closing_before" else 1
    training = training_losses(seed)
    if training is not None:
        yield ("That is the loss on windows drawn from the TRAINING text (text_parts()[0]); draw them "
               "from the held-out text, text_parts()[1].", training[index])
    yield ("That is the loss on the whole held-out text (validation_windows); the exercise measures the "
           "64 windows that text_batch draws with your seed.", validation_losses()[index])


def knock_bracket_part(key: str):
    def run(case):
        got, seed = yield from seeded_answer(("closing_before", "closing_after"), "torch.Generator().manual_seed")
        model, found = text_model()
        helped, before = closing_losses(seed, None)
        if not bool(helped.any()):
            raise Wrong(f"The windows drawn with seed {seed} hold no prediction of a closing bracket inside "
                        "brackets, so there is nothing to measure: choose another seed.")
        target = found["open bracket"]
        after = closing_losses(seed, target)[1]
        ref = (before if key == "closing_before" else after)[helped].mean().item()
        value = got.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isclose(
                float(value), ref, rel_tol=1e-4, abs_tol=1e-4):
            return  # right: the wrong variants below are measured only to name a mistake
        check_number(value, ref, f"{key!r} (seed {seed})", knock_variants(key, seed, helped, before, after),
                     rel_tol=1e-4, abs_tol=1e-4)
    run.__name__ = f"knock_out_bracket_{key}"
    return run


for _key in ("closing_before", "closing_after"):
    part(KNOCK_BRACKET, _key)(knock_bracket_part(_key))


# ------------------------------------------------------------------------------------------------
# Exercise 16.3: bracket_predict (a prediction; the answers are sealed)
# ------------------------------------------------------------------------------------------------

BRACKET_PREDICT = exercise(
    "bracket_predict",
    "answer: a dict {'bracket': int, 'line_start': int, 'closing': letter}: in the bytes of f(a, [b, c]) "
    "(positions 0 to 11), the position query 9 of an ideal open-bracket head attends to; in the bytes of "
    "'if a:\\n    b(c)\\n' (positions 0 to 14), the position query 12 of an ideal line-start head attends "
    "to; and which of A) } B) ] C) ) the shipped model finds likeliest after d = {\"a\": [1, 2.")

# "part=value": the right answer; "part@value": a note for that wrong value
# (python -m attnbook_classroom.grading.sealed).
PREDICT_NOTES = Sealed("bracket_predict", {
    "40aa1b604a29880004476a7dd28f0343": "",
    "2c397c049d1e70392a11c3c39eea867c": "",
    "f358c824ad87f8f242a278e6ed64136e": "",
    "ce7215f8be3d54b04950ccdc66a53efe": "5k/V3Knvg8VeSAODGXqh1szQofoikkwcbwr+i8m1kgVv49a5qslYZgxeVJEfmV6BOFijepeNCREMYVR7PMsWLrnOSt3l0xy+2DAp4qPhzs2mM8ENWxtkVDua7deGSQ2ZdlPgNNvZnAvdgRXU8ggMAXH/kyLsET+8NmEYrxdts8Ar32BDw9gt8w==",
    "6f110545e4e158eaf330d5bdcb43a8a4": "7M6IF48WPCvhbChjHAnM8wLtV+M8W2roFjSJcWIhYRpy3jthRL+KEj5iDJ6NkYcHfUsyGuXEBnxfUA47sKbk2+Qxg/D2K6GmqsQ4zh80Ke7OQaO0NbuI1RYht+ZVIm3KagxAlQq1/ezgNfSIDg==",
    "1b9081c76218097b9b7a6101be68a049": "jpf86xQKtsWw2BeiEwGGV4hVBdRja7slTt8Ds3lpz2mmOZoidB0O8mEt50brtSQ6KOijCLNPQrJcJmXJNf3fC2yRkzixTqgUYrg2FlQPYIYiqQGlTC4QzaDXhfBYVfP19aYvbdd5YKDZR8XyoQnj2sO/+DI6Ys94oss+zih3R1oViiv4GUesBw==",
    "c54237e2166f551e61c28f8943a7fb85": "Cb0YN7anGr+ksXTM7DIPBTZlPcX9YmqJJqsJ486qVV0ufW1Hyac+5QNUn+sAE1RMAoM5SoyR1JHHl1i5dV5AiYcZc8CNyDg4Z9tBdsjqumZFiENcS+tmYVPeSw34Mh8DP3htbUtZi50cv1pP4eZu+AN4LnRZoKcwuwIu7JuJWCfJ2zXM0kSjj4g5K/jYz5CdjeZMElG8QOIt22M=",
    "31d9e022d846111781b5c92b6018a8e3": "DA6WBEhTUm1950U4hyQaQAoS1aYEf+aW6NMq8nIBIoEq3l/CWLKSMQrUsdbtBjEYKPjVZ7nVVkRMGmU5kabE6wvbD9QpvYr2f8GNzJ1KilzPOK1HsFqPK2uEvkRQBNTbDfI4IdpVGUsPGO1f4ja/0mVGaMFz1YlNHMk1zKvtVVvx0ytBdczz5JY4zmdz",
    "7eb3e3466380a4899ed02903d3f1e4fb": "9VX16nK0+q6fbpU9ZwLnb1Om7WGI1irN2PmgU/pTRoTQKLEP+l7KHYX5MxfbyATRePNIp8TVBWzPL65jkHtDuZHVxvu5BCHvz77GzxzX/DCuSsRhCcxXSGUYOwbZkKie9VcwGd2m4Yw=",
    "806f91b1b13daf7550a6250e98b0c705": "IaFDx2In/5vJgQbd8D76mbRlEIeNpy9lwFrAXjPH6fIrNKmqSidNTWYiwoc6IC26CUJtqD4M1usX0w24IJLXuoYnDtnbj2uRKEVdJLd/hUE6ClA4L8/LxY49l2mPY24UYgrTOBAT/lBy7kYGngRU+HncnEsdok4=",
    "566fa81144e440a43dc830984d881544": "UxizqZIuSI1jcySK6ss7KClabw27eH1a//pwXQnnszPC4VMAW2/WIrVd2tspxBMhG82uOOJC50zt0tFlZSlsLRpNiKkxAxYXhAGd163iETOFg6/y2qHakPdabJpV9Km4KoScH17LVD1MQb3dMpDmfUwaSjWovNHgd0QxRpjXr+s=",
    "6e19e5c93218e052f805202622e79aa5": "aQ28XSAnlntbtm2UqkG9MAQLEZOLa0H0g9o7xsxKXcsueszBYZ4ZCYfyH2cMkm11QwJJvq3m2Wx2Jh1VwckPb4mfWrz9u6knl4WTjPQdFD9LFR2y79HBg45vcjMHxn3MMATSltSoof1utcMoFTha+HKbutmYog==",
    "77944d3d15a0ce5051e04a0b74768c16": "JFmlnwS1ygD3HtEpufiFfkFdQmmg8rEhuJjdNoEBx7C3YboAqh6TZPQy3Uiou9daHD+g8+/YBQCN3eskPfeIwsN7V7jcPLZTmVhePnkNpclIhxGl6y04IOunQAe4fx0jxjcVeua36GzJkn7gRMUuUmFRjfkjq637A32nY+OnuocAkQ==",
    "4efc746ccde12a706e65559aa20e2362": "k5fskFUoTAETNZaJoLxAafwfFozHGkgdLJDhIwdElAPM0FCm8gtGOZPTni3LTuqD2dBkkSmC/LkCpT6KenDHxOxBmerQBtTQ6EL1/AU0G2eoYuIyYF6M6L3gYKSpB3K0uVWFW/WH4F62qC/K/Mfc7fSYpZXq",
    "af4b50b71fa4eb70fbc1c803e0d5c524": "OOviRQjtNHWzH2qA7z8p376vQSS+U8a6RE3bgtLB7zmxkHyS8gFDJHVDEHh4S0j7VI/+rMA2GQl5mRGsvP9Xpn13GEkvHJzcN9rDlKkuGhT4T2PJd/RoSfRPQ80ZiLCMFYC9cKQ=",
    "4616a9d3030367023667e87e68123b0e": "4KhMDbDvTqNBv3wxwu5MZbImboHvfQBzzQOPdYTt6rNVlLpS0neUHN4FJUGwV63gma6drEUnW12lUdRYTX+7OB86pyZcCYdsw5N1kV8SyHdkAa8j7KypJ7Bj/mGlB5k6J/JBuoeS",
    "8684399c6410fe877a0b27772fae7564": "wspOX367swbtuy7nOXFbAEVQqwFAzuEN/h3/SiIyKGOBvNMiMpHIylIMPc4ZIU60KqmaZ1oyO9Q5Ut+jfxI3pLIkgPKsC1oQM6thZDszKjpcqCvdiNGHaQ3n21Icj/km",
    "72dca7d6d1b2013678a9cd759e418a1f": "2JDo1G64plMdhKoboUNljFJJTGCAHudq60X5M5E2e2bxo0a05uSjuzA8RTngGGSHpr6Zc3DzaMsrIz763nLMQ/vwrEsyhA8szgUFHM4d+XJj/0z4fJSRwm615veFNAlP6oEqeZpPH7FhB7T3MnXfNtsJOuK08bxK8xN5kiqd5xoi",
    "88ea636550add1bfc49af79ce9ec2b04": "S5jYE2/byzIpOwSjTUurLwUBSM7YcYxtBNarJgXm6sWhLMGamQlV1hauGoUiTjm8bFtoGcZEXibSbBTJEFSSgi98qtxLmgc8dEQz/0Jp7csQRdqZ9lkggqldt76jsyJZ0H9FZKn+QoVz1u0fMFD6K1MY3VZdv3sz7KDAqzgxxSCH1kmmjfHpG9qlKhMa6LqtECmpyWg=",
})

PREDICT_RANGES = {"bracket": 11, "line_start": 14}


def predict_part(name: str):
    def run(case):
        got = yield answer()
        if not isinstance(got, dict):
            raise Wrong(f"Your answer is {got!r:.80}; expected a dict such as "
                        "{'bracket': 2, 'line_start': 7, 'closing': 'A'}.")
        value = got.get(name)
        if name in PREDICT_RANGES:
            top = PREDICT_RANGES[name]
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
                raise Wrong(f"Your answer for {name!r} is {value!r:.40}; expected a position, an int in 0..{top}.")
        else:
            value = value.strip().upper() if isinstance(value, str) else value
            if value not in ("A", "B", "C"):
                raise Wrong(f"Your answer for {name!r} is {value!r:.40}; expected one of the letters 'A', 'B', 'C'.")
        if PREDICT_NOTES.holds(f"{name}={value}"):
            return
        note = PREDICT_NOTES.message(f"{name}@{value}")
        raise Wrong(f"Your answer for {name!r} is {value}, which is not right" + (f": {note}." if note else "."))
    run.__name__ = f"bracket_predict_{name}"
    return run


for _name in ("bracket", "line_start", "closing"):
    part(BRACKET_PREDICT, _name)(predict_part(_name))
