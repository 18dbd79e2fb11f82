"""The harness: exercises and their parts, the calls a part makes, and :func:`check`.

A *part* is a generator function registered with :func:`part`. It builds seeded inputs from its
:class:`Case`, yields the call (or list of calls) of the student's function it needs, receives the
results, and raises :class:`Wrong` with a message for the student when they are wrong::

    @part(MASKED_SOFTMAX, "values")
    def values(case):
        scores, mask = case.randn(2, 4, 6), case.mask(2, 4, 6)
        weights = yield call(scores, mask)       # run where the student's code runs
        compare(weights, masked_softmax(scores, mask), "weights")

The calls run in another process (a fork of the notebook's kernel in :func:`check`; a
bubblewrap sandbox when a class is graded), and come back as plain data (:mod:`.wire`). The
references and the comparison always run here, where the student's code does not.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import Tensor

from attnbook_classroom.grading import wire
from attnbook_classroom.grading.compare import Wrong, exception_message, warning_notes
from attnbook_classroom.grading.forked import isolated

__all__ = ["Feedback", "Wrong", "Exercise", "EXERCISES", "exercise", "part", "Case", "call", "watched",
           "Watched", "answer", "seeded_answer", "either", "check", "exercise_ids", "parts", "describe", "get_exercise", "PendingPart",
           "DEFAULT_TIMEOUT", "HIDDEN_SEED"]

DEFAULT_TIMEOUT = 5.0  # seconds per part
WIDTH = 76  # columns of a Feedback's text
HIDDEN_SEED = 1  # the seed of `check(..., hidden=True)` outside class grading


# ------------------------------------------------------------------------------------------------
# Feedback
# ------------------------------------------------------------------------------------------------

@dataclass
class Feedback:
    """The result of grading one exercise (or one part of it).

    ``score`` counts the parts passed (one point each), out of ``max_score``. ``messages`` says,
    for every part that failed, what is wrong and what to look at.
    """

    exercise_id: str
    score: float
    max_score: float
    messages: list[str] = field(default_factory=list)
    part: str | None = None

    @property
    def passed(self) -> bool:
        return self.max_score > 0 and self.score >= self.max_score

    def __str__(self) -> str:
        """The verdict, then each message as a list item wrapped at :data:`WIDTH` columns: nbgrader's
        ``validate`` cuts every line of an error at about 87 columns, and no message is lost."""
        where = self.exercise_id if self.part is None else f"{self.exercise_id} (part {self.part!r})"
        head = f"{where}: {'passed' if self.passed else 'not yet'}, {self.score:g}/{self.max_score:g}"
        lines = [head]
        for message in self.messages:
            for n, paragraph in enumerate(str(message).split("\n")):
                lines += textwrap.wrap(paragraph, WIDTH, initial_indent="  - " if n == 0 else "    ",
                                       subsequent_indent="    ", break_long_words=True,
                                       break_on_hyphens=False) or [""]
        return "\n".join(lines)

    def _repr_pretty_(self, printer, cycle) -> None:  # how IPython shows it outside a cell's result
        printer.text(str(self))

    def _ipython_display_(self) -> None:
        # Shown as display data, not as the cell's result: nbgrader reads a test cell's result
        # as a partial score and warns about any result that is not a number.
        from IPython.display import display

        display({"text/plain": str(self)}, raw=True)

    def assert_passed(self) -> "Feedback":
        """Raise ``AssertionError`` carrying the messages unless every part passed; else return self."""
        if not self.passed:
            raise AssertionError(str(self))
        return self


# ------------------------------------------------------------------------------------------------
# Registry
# ------------------------------------------------------------------------------------------------

@dataclass
class Exercise:
    """An exercise: its contract, its parts in the order ``check`` runs them, and the names
    (``module.attribute``) that the student's code may not use while it is graded: ``blocks``
    from the notebook's first cell on, ``check_blocks`` while the tests call the student's
    functions (for a name another exercise's experiment needs while its cells run)."""

    id: str
    contract: str
    parts: dict[str, Callable[["Case"], Iterator]] = field(default_factory=dict)
    blocks: tuple[str, ...] = ()
    check_blocks: tuple[str, ...] = ()


EXERCISES: dict[str, Exercise] = {}


def exercise(exercise_id: str, contract: str, *, blocks: tuple[str, ...] | list[str] = (),
             check_blocks: tuple[str, ...] | list[str] = ()) -> Exercise:
    """Register an exercise (in the calling chapter module); add its parts with :func:`part`.
    ``blocks`` are unusable in the whole notebook while it is graded; ``check_blocks`` only
    while the tests run (the cells before them may use them, e.g. in another exercise's
    experiment), so a function the student writes still cannot call them."""
    if exercise_id in EXERCISES:
        raise ValueError(f"exercise: {exercise_id!r} is registered twice")
    ex = Exercise(exercise_id, contract, blocks=tuple(blocks), check_blocks=tuple(check_blocks))
    EXERCISES[exercise_id] = ex
    return ex


def part(ex: Exercise, name: str):
    """Register the decorated generator function as the part ``name`` of ``ex``."""
    def register(func):
        if name in ex.parts:
            raise ValueError(f"part: {ex.id!r} already has a part {name!r}")
        ex.parts[name] = func
        return func
    return register


def exercise_ids() -> list[str]:
    """Every exercise id the grader knows, in the book's order."""
    return list(EXERCISES)


def parts(exercise_id: str) -> list[str]:
    """The names of an exercise's parts, in the order ``check`` runs them."""
    return list(get_exercise(exercise_id).parts)


def describe(exercise_id: str) -> str:
    """The contract of an exercise: what the student's function takes and returns."""
    ex = get_exercise(exercise_id)
    return f"{ex.id}: {ex.contract}\nparts: {', '.join(ex.parts)}"


def get_exercise(exercise_id: str, where: str = "check") -> Exercise:
    if not isinstance(exercise_id, str) or exercise_id not in EXERCISES:
        raise ValueError(
            f"{where}: unknown `exercise_id` {exercise_id!r}; expected one of {sorted(EXERCISES)}"
        )
    return EXERCISES[exercise_id]


# ------------------------------------------------------------------------------------------------
# Inputs and calls
# ------------------------------------------------------------------------------------------------

class Case:
    """The seeded inputs of one run of a part. Seed 0 gives the inputs a student sees; any other
    seed (hidden tests, one per student when a class is graded) also varies the sizes that
    :meth:`size` chooses, so that no table of answers to the visible inputs can pass."""

    def __init__(self, seed: int):
        self.seed = seed
        self.gen = torch.Generator().manual_seed(1000 + seed)

    def randn(self, *shape: int, dtype=torch.float32) -> Tensor:
        return torch.randn(*shape, generator=self.gen).to(dtype)

    def mask(self, *shape: int, fully_masked_rows: int = 0) -> Tensor:
        """A bool mask (..., S) with at least one True and one False per row; then some rows all False."""
        mask = torch.rand(*shape, generator=self.gen) < 0.6
        S = shape[-1]
        flat = mask.reshape(-1, S)  # (rows, S)
        for r in range(flat.shape[0]):
            flat[r, r % S] = True
            flat[r, (r + 1) % S] = False
        for r in range(fully_masked_rows):
            flat[(3 * r + 1) % flat.shape[0]] = False
        return flat.reshape(shape)

    def randint(self, low: int, high: int) -> int:
        """A random int in [low, high]."""
        return int(torch.randint(low, high + 1, (1,), generator=self.gen))

    def size(self, public: int, low: int, high: int) -> int:
        """``public`` for the visible inputs (seed 0), else a random int in [low, high]."""
        return public if self.seed == 0 else self.randint(low, high)

    def lengths(self, public: list[int], low: int, high: int) -> list[int]:
        """``public`` for the visible inputs (seed 0), else as many random ints in [low, high]."""
        return list(public) if self.seed == 0 else [self.randint(low, high) for _ in public]

    def branch(self) -> "Case":
        """A copy of this case whose generator continues from the same state."""
        other = Case.__new__(Case)
        other.seed = self.seed
        other.gen = torch.Generator()
        other.gen.set_state(self.gen.get_state())
        return other


@dataclass
class Call:
    """One call of the student's answer, as plain data, with the hints that explain its errors."""

    spec: dict
    hints: Callable[[wire.ErrorInfo], str | None] | None = None


def call(*args, hints=None, **kwargs) -> Call:
    """The student's function called with these arguments; the part receives its return value."""
    return Call({"op": "call", "args": wire.encode(args), "kwargs": wire.encode(kwargs)}, hints)


def watched(c: Call) -> Call:
    """``c``, run while recording the largest tensor the student's code makes: the part receives a
    :class:`Watched` (the value and that tensor's shape)."""
    return Call({**c.spec, "largest": True}, c.hints)


@dataclass
class Watched:
    """A watched call's result: its ``value`` and ``largest``, the shape of the largest tensor
    (by number of elements) that any operation made during the call."""

    value: Any
    largest: tuple


def answer() -> Call:
    """The student's answer itself (a dict, a set, a number); the part receives a copy of it."""
    return Call({"op": "answer"})


def seeded_answer(keys: tuple[str, ...], seed_from: str) -> Iterator[Call]:
    """The student's answer to an experiment they ran with a seed of their choice: a dict
    ``{'seed': int, key: ... for key in keys}``. :class:`Wrong` unless it is a dict whose seed is
    an int in 0..2**31 - 1 (``seed_from`` says where they passed it). A part calls it as
    ``got, seed = yield from seeded_answer(...)``."""
    got = yield answer()
    if not isinstance(got, dict):
        fields = ", ".join(f"'{key}': ..." for key in ("seed", *keys))
        raise Wrong(f"Your answer is {type(got).__name__}; expected a dict {{{fields}}}.")
    seed = got.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise Wrong(f"Your answer's 'seed' is {seed!r:.40}; expected the int you passed to {seed_from}.")
    return got, seed


def either(function: Call | None, init: tuple | None = None, weights=None, args: tuple = (),
           kwargs: dict | None = None) -> Call:
    """``function`` when the answer is a function; when it is an ``nn.Module`` class, build it as
    ``cls(*init)`` and, with ``weights`` (four (E, E) tensors q, k, v, out), load them, zero the
    biases and call it on ``args``. Either side may be None (skipped). The part receives an
    :class:`Answered`."""
    module = None if init is None else {
        "init": wire.encode(tuple(init)), "weights": None if weights is None else wire.encode(list(weights)),
        "args": wire.encode(tuple(args)), "kwargs": wire.encode(kwargs or {})}
    spec = {"op": "either", "call": None if function is None else function.spec, "module": module}
    return Call(spec, None if function is None else function.hints)


@dataclass
class Answered:
    """What :func:`either` found: ``kind`` "function" or "module"; for a module, how it is built
    (``built``: its class made an ``nn.Module``; ``lists``: attributes holding layers in plain
    lists; ``shapes``: its 2-D parameters' shapes; ``loaded``: the weights could be loaded)."""

    kind: str
    value: Any = None
    skipped: bool = False
    built: bool = True
    name: str = ""
    lists: list = field(default_factory=list)
    shapes: list = field(default_factory=list)
    n_params: int = 0
    loaded: bool = False


# ------------------------------------------------------------------------------------------------
# Running a part
# ------------------------------------------------------------------------------------------------

class PendingPart:
    """One part, run in two steps: ``specs`` lists the calls to make where the student's code
    runs; :meth:`finish` judges their raw results and returns the messages (empty = passed)."""

    def __init__(self, exercise_id: str, name: str, seed: int):
        ex = get_exercise(exercise_id)
        self.exercise_id, self.name, self.seed = exercise_id, name, seed
        self._gen = ex.parts[name](Case(seed))
        request = next(self._gen)
        self._single = isinstance(request, Call)
        self.calls: list[Call] = [request] if self._single else list(request)
        self.specs = [c.spec for c in self.calls]

    def finish(self, raws: list[dict]) -> list[str]:
        notes = warning_notes([w for raw in raws if isinstance(raw, dict) for w in raw.get("warnings", [])
                               if isinstance(w, str)])
        try:
            if not isinstance(raws, list) or len(raws) != len(self.calls):
                raise Wrong("The grader could not read your function's results.")
            values = [_value(raw, c) for raw, c in zip(raws, self.calls)]
            self._gen.send(values[0] if self._single else values)
        except StopIteration:
            return []
        except Wrong as wrong:
            self._gen.close()
            return [str(wrong)] + notes
        except Exception as exc:  # the student's results broke a comparison
            self._gen.close()
            return [f"Grading stopped on {type(exc).__name__}: {exc}"]
        self._gen.close()
        raise RuntimeError(f"part {self.exercise_id}/{self.name} yielded more than once")


def _mib(n: Any) -> str:
    try:
        return f"{float(n) / (1 << 20):.1f} MiB"
    except (TypeError, ValueError):
        return "?"


def too_large_message(size: Any, limit: Any) -> str:
    """What the student reads when their results were too large to cross back to the grader."""
    return (f"Your function's results for this test came to {_mib(size)}, more than the {_mib(limit)} the "
            "grader accepts from one test, so they were not compared. The expected result is far smaller: "
            "check the shape and the dtype of what you return (a tensor of the wrong shape, broadcast "
            "too far, or a copy of the inputs returned with it).")


def _value(raw: Any, c: Call) -> Any:
    """The decoded result of one call; raises Wrong when the student's code raised."""
    if not isinstance(raw, dict):
        raise Wrong("The grader could not read your function's result.")
    if not raw.get("ok"):
        if "too_large" in raw:
            raise Wrong(too_large_message(raw.get("too_large"), raw.get("limit")))
        if "not_callable" in raw:
            raise Wrong(f"Expected a function, got {raw['not_callable']} {raw.get('text', '')!s:.80}.")
        err = raw.get("error") or {}
        info = wire.ErrorInfo(str(err.get("type", "Exception")), str(err.get("message", "")),
                              tuple(str(b) for b in err.get("bases", [])))
        raise Wrong(exception_message(info, c.hints))
    try:
        value = wire.decode(raw.get("value"))
        if c.spec.get("largest"):
            largest = raw.get("largest")
            if not isinstance(largest, list) or not all(isinstance(n, int) for n in largest):
                raise Wrong("The grader could not read the sizes of the tensors your function made.")
            return Watched(value, tuple(largest))
        if raw.get("kind") is None:
            return value
        fields = {k: raw.get(k) for k in ("skipped", "built", "name", "lists", "shapes", "n_params", "loaded")
                  if raw.get(k) is not None}
        return Answered(raw["kind"], value, **fields)
    except (ValueError, TypeError) as exc:
        raise Wrong(f"The grader could not read your function's result ({exc}).") from None


def run_in_fork(fn: Any, specs: list[dict]) -> bytes:
    """Run ``specs`` against ``fn`` (in the child process) and return the raw results, written."""
    torch.set_num_threads(1)
    return wire.dumps_results([wire.execute(fn, spec) for spec in specs])


def check(exercise_id: str, fn: Any, part: str | None = None, *, seed: int = 0,
          timeout: float = DEFAULT_TIMEOUT, hidden: bool = False) -> Feedback:
    """Grade ``fn`` on one exercise, or on one part of it.

    Args:
        exercise_id: one of :func:`exercise_ids`, e.g. ``"masked_softmax"``.
        fn: the student's function (or, for a conceptual exercise, the answer).
        part: one of :func:`parts`; None runs every part.
        seed: seeds the random inputs (0: the inputs the student sees).
        timeout: seconds allowed for each part before it is stopped and reported as too slow.
        hidden: a hidden test: seed :data:`HIDDEN_SEED` here; when a class is graded, a seed
            derived for each student from the course's secret.

    Returns:
        A :class:`Feedback`; one point per part passed.
    """
    ex = get_exercise(exercise_id)
    if part is None:
        names = list(ex.parts)
    elif part in ex.parts:
        names = [part]
    else:
        raise ValueError(f"check: `part` {part!r} is not a part of {exercise_id!r}; "
                         f"expected one of {list(ex.parts)} or None")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"check: `seed` must be an int; got {seed!r}")
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout > 0:
        raise ValueError(f"check: `timeout` must be a positive number of seconds; got {timeout!r}")
    if not isinstance(hidden, bool):
        raise TypeError(f"check: `hidden` must be True or False; got {hidden!r}")
    if hidden and seed == 0:
        seed = HIDDEN_SEED
    score, messages = 0, []
    for name in names:
        pending = PendingPart(exercise_id, name, seed)
        status, value = isolated(lambda: run_in_fork(fn, pending.specs), float(timeout))
        found = verdict_messages(pending, status, value, timeout)
        label = f"[{name}] " if len(names) > 1 else ""
        score += not found
        messages += [label + m for m in found]
    return Feedback(exercise_id, score, len(names), messages, part)


def verdict_messages(pending: PendingPart, status: str, value: Any, timeout: float) -> list[str]:
    """The messages of one part from how its calls ended: ``ok`` (``value``: the written raw
    results), ``timeout`` or ``crash`` (``value``: what happened)."""
    if status == "ok":
        try:
            raws = wire.loads(value)
        except Exception as exc:
            return [f"The grader could not read your function's results ({exc})."]
        return pending.finish(raws)
    if status == "timeout":
        return [f"Too slow: your code did not finish within {timeout:g} s, so it was stopped. Look "
                "for a loop that never ends (a `while` whose condition never changes) or for work far "
                "bigger than the inputs need."]
    return [f"Your code crashed the process that ran it ({value})."]
