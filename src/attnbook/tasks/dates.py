"""Dates as people write them, translated to ISO 8601: a task whose attention a reader can check.

A source is one calendar date written in one of the human formats of :data:`FORMATS`
("3rd of March 1994", "Mar 3, 94", "03/03/1994", "Thursday 3 March 1994", ...); its target is the
same date in ISO form, "1994-03-03". Everything is generated from a seed; nothing is downloaded.
Each example also records where the day, the month, the year and the weekday sit in the source
(:attr:`DateExample.spans`), so that an attention map can be checked against them: to write the
month digits "03", a model should read "March", "Mar" or "03".

Conventions that keep every source unambiguous:

* dates run from :data:`FIRST_DATE` (1950-01-01) to :data:`LAST_DATE` (2049-12-31); a two-digit
  year "yy" means 19yy for 50-99 and 20yy for 00-49;
* numeric formats put the day first ("03/04/1994" is the 3rd of April), except the year-first
  "1994/04/03";
* a weekday, where a format shows one, is the true weekday of the date.

The test dates are held out: :func:`is_test_date` selects about one date in eleven, training
batches never contain one, and :func:`test_set` contains nothing else.

Tokens are characters: ``PAD`` = 0, ``SOS`` = 1, ``EOS`` = 2, then every character any format can
produce (:data:`VOCAB`). Sources and targets share the vocabulary.

Shapes:
    B batch, S source length (padded), L = 11 target positions (the ISO date and EOS, or SOS and the ISO date).
    DateBatch.src (B, S), DateBatch.src_key_mask (B, S), DateBatch.tgt_in (B, L),
    DateBatch.tgt_out (B, L)
"""

from __future__ import annotations

import datetime
import string
from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from attnbook.masks import padding_mask
from attnbook.tasks.reversal import checked_ids, pad_sequences

__all__ = [
    "PAD",
    "SOS",
    "EOS",
    "FIRST_DATE",
    "LAST_DATE",
    "FORMATS",
    "FIELDS",
    "VOCAB",
    "VOCAB_SIZE",
    "ISO_LENGTH",
    "ISO_SPANS",
    "DateExample",
    "DateBatch",
    "ordinal",
    "render",
    "to_iso",
    "encode",
    "decode",
    "is_test_date",
    "sample_examples",
    "make_batch",
    "train_batch",
    "test_set",
    "alignment",
]

PAD, SOS, EOS = 0, 1, 2
FIRST_DATE = datetime.date(1950, 1, 1)
LAST_DATE = datetime.date(2049, 12, 31)
TEST_SEED = 2024

# English names, written out (the calendar module's names follow the machine's locale).
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")  # date.weekday() order


def ordinal(day: int) -> str:
    """The English ordinal of a day of the month: 1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, 21st.

    Shapes:
        no tensors
    """
    if isinstance(day, bool) or not isinstance(day, int) or not 1 <= day <= 31:
        raise ValueError(f"ordinal: `day` must be an int in 1..31; got {day!r}")
    if 11 <= day <= 13:
        return f"{day}th"
    return f"{day}" + {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")


# Each field renders one part of a date; its name says which part (day, month, year, weekday).
FIELDS = {
    "day": ("day", lambda d: str(d.day)),  # 3
    "day2": ("day", lambda d: f"{d.day:02d}"),  # 03
    "day_ordinal": ("day", lambda d: ordinal(d.day)),  # 3rd
    "month2": ("month", lambda d: f"{d.month:02d}"),  # 03
    "month_name": ("month", lambda d: MONTHS[d.month - 1]),  # March
    "month_abbr": ("month", lambda d: MONTHS[d.month - 1][:3]),  # Mar
    "month_lower": ("month", lambda d: MONTHS[d.month - 1][:3].lower()),  # mar
    "month_upper": ("month", lambda d: MONTHS[d.month - 1].upper()),  # MARCH
    "year": ("year", lambda d: str(d.year)),  # 1994
    "year2": ("year", lambda d: f"{d.year % 100:02d}"),  # 94
    "weekday": ("weekday", lambda d: WEEKDAYS[d.weekday()]),  # Thursday
    "weekday_abbr": ("weekday", lambda d: WEEKDAYS[d.weekday()][:3]),  # Thu
}

# name -> template; the example in each comment is 1994-03-03, a Thursday.
FORMATS = {
    "ordinal_of": "{day_ordinal} of {month_name} {year}",  # 3rd of March 1994
    "the_ordinal_of": "the {day_ordinal} of {month_name}, {year}",  # the 3rd of March, 1994
    "abbr_short_year": "{month_abbr} {day}, {year2}",  # Mar 3, 94
    "slashes": "{day2}/{month2}/{year}",  # 03/03/1994
    "dots_short_year": "{day2}.{month2}.{year2}",  # 03.03.94
    "year_first": "{year}/{month2}/{day2}",  # 1994/03/03
    "weekday_day_month": "{weekday} {day} {month_name} {year}",  # Thursday 3 March 1994
    "day_month": "{day} {month_name} {year}",  # 3 March 1994
    "month_day": "{month_name} {day}, {year}",  # March 3, 1994
    "month_ordinal": "{month_name} {day_ordinal} {year}",  # March 3rd 1994
    "weekday_month_ordinal": "{weekday}, {month_name} {day_ordinal}, {year}",  # Thursday, March 3rd, 1994
    "abbr_weekday": "{weekday_abbr}, {day} {month_abbr} {year}",  # Thu, 3 Mar 1994
    "hyphens": "{day}-{month_abbr}-{year}",  # 3-Mar-1994
    "lower_short_year": "{day} {month_lower} {year2}",  # 3 mar 94
    "upper": "{month_upper} {day} {year}",  # MARCH 3 1994
}

ISO_LENGTH = 10  # "YYYY-MM-DD"
ISO_SPANS = {"year": (0, 4), "month": (5, 7), "day": (8, 10)}  # where each part sits in the target


def _parse(template: str) -> list[tuple[str, str | None]]:
    """A template as (literal text, field name or None) pieces."""
    return [(literal, field) for literal, field, _, _ in string.Formatter().parse(template)]


_TEMPLATES = {name: _parse(template) for name, template in FORMATS.items()}


def _characters() -> str:
    """Every character any format can produce, in a fixed order."""
    chars = set("0123456789-")  # digits of every numeric field, the ISO hyphen
    for pieces in _TEMPLATES.values():
        for literal, _ in pieces:
            chars.update(literal)
    for text in MONTHS + WEEKDAYS:
        chars.update(text + text.upper() + text.lower())
    chars.update("stndrh")  # ordinal suffixes
    return "".join(sorted(chars))


VOCAB = ("<pad>", "<sos>", "<eos>") + tuple(_characters())  # id -> symbol
VOCAB_SIZE = len(VOCAB)
_ID = {symbol: index for index, symbol in enumerate(VOCAB)}


class DateExample(NamedTuple):
    """One source/target pair and where each part of the date sits in the source.

    ``spans[part] = (start, stop)``: ``text[start:stop]`` is that part ("March", "03", "94"...),
    for each part the format shows (day, month, year and perhaps weekday).
    """

    date: datetime.date
    format: str
    text: str
    iso: str
    spans: dict[str, tuple[int, int]]


def to_iso(date: datetime.date) -> str:
    """The ISO 8601 form "YYYY-MM-DD" of ``date``.

    Shapes:
        no tensors
    """
    return f"{date.year:04d}-{date.month:02d}-{date.day:02d}"


def render(date: datetime.date, format: str) -> DateExample:
    """Write ``date`` in the human format ``format`` (a key of :data:`FORMATS`).

    Shapes:
        no tensors

    >>> render(datetime.date(1994, 3, 3), "weekday_day_month").text
    'Thursday 3 March 1994'
    """
    if not isinstance(date, datetime.date) or isinstance(date, datetime.datetime):
        raise TypeError(f"render: `date` must be a datetime.date; got {type(date).__name__}")
    if not FIRST_DATE <= date <= LAST_DATE:
        raise ValueError(f"render: `date` must lie in {FIRST_DATE}..{LAST_DATE}; got {date}")
    if format not in _TEMPLATES:
        raise ValueError(f"render: `format` must be one of {sorted(FORMATS)}; got {format!r}")
    text, spans = "", {}
    for literal, field in _TEMPLATES[format]:
        text += literal
        if field is not None:
            part, write = FIELDS[field]
            piece = write(date)
            spans[part] = (len(text), len(text) + len(piece))
            text += piece
    return DateExample(date, format, text, to_iso(date), spans)


def encode(text: str) -> list[int]:
    """Character ids of ``text`` (no SOS/EOS).

    Shapes:
        n characters -> n ids
    """
    try:
        return [_ID[c] for c in text]
    except KeyError as exc:
        raise ValueError(f"encode: the character {exc.args[0]!r} of {text!r} is not in the vocabulary") from None


def decode(ids: Sequence[int] | Tensor, strip: bool = True) -> str:
    """The text of a sequence of ids. With ``strip``, stop at the first EOS and drop PAD and SOS.

    Shapes:
        ids (n,) -> a string of at most n characters
    """
    out = []
    for i in checked_ids("decode", ids, VOCAB_SIZE):
        if strip and i == EOS:
            break
        if strip and i in (PAD, SOS):
            continue
        out.append(VOCAB[i])
    return "".join(out)


def is_test_date(date: datetime.date) -> bool:
    """True for the held-out test dates: those whose day number since 0001-01-01 is divisible by 11.

    Eleven and seven share no factor, so the test dates fall on every weekday; every day of the
    month, month and year occurs among both the training and the test dates.
    """
    return date.toordinal() % 11 == 0


_FIRST, _LAST = FIRST_DATE.toordinal(), LAST_DATE.toordinal()
_SPLIT_DAYS = {
    split: torch.tensor([n for n in range(_FIRST, _LAST + 1) if (n % 11 == 0) == (split == "test")])
    for split in ("train", "test")
}
_FORMAT_NAMES = tuple(FORMATS)


def sample_examples(
    num_examples: int,
    generator: torch.Generator,
    *,
    split: str = "train",
    formats: Sequence[str] | None = None,
) -> list[DateExample]:
    """Draw dates uniformly from ``split`` ("train" or "test") and a format uniformly from ``formats``
    (default: all of them), with ``generator``: the same generator state gives the same examples.

    Shapes:
        no tensors: a list of ``num_examples`` examples
    """
    if isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples < 0:
        raise ValueError(f"sample_examples: `num_examples` must be an int >= 0; got {num_examples!r}")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"sample_examples: `generator` must be a torch.Generator; got {type(generator).__name__}")
    if split not in _SPLIT_DAYS:
        raise ValueError(f"sample_examples: `split` must be 'train' or 'test'; got {split!r}")
    names = _FORMAT_NAMES if formats is None else tuple(formats)
    unknown = [name for name in names if name not in FORMATS]
    if unknown or not names:
        raise ValueError(f"sample_examples: `formats` must be names from {sorted(FORMATS)}; got {list(names)}")
    days = _SPLIT_DAYS[split]
    day_index = torch.randint(len(days), (num_examples,), generator=generator).tolist()
    format_index = torch.randint(len(names), (num_examples,), generator=generator).tolist()
    return [
        render(datetime.date.fromordinal(int(days[d])), names[f]) for d, f in zip(day_index, format_index)
    ]


class DateBatch(NamedTuple):
    """Padded tensors for a batch of examples.

    src: source character ids, PAD after each source's end; src_key_mask: True on real source
    characters (the keys attention may use); tgt_in: SOS then the ISO characters (the decoder's
    input); tgt_out: the ISO characters then EOS (what it must predict at each step).

    Shapes:
        src (B, S), src_key_mask (B, S), tgt_in (B, L), tgt_out (B, L), L = 11
    """

    src: Tensor
    src_key_mask: Tensor
    tgt_in: Tensor
    tgt_out: Tensor


def make_batch(examples: Sequence[DateExample]) -> DateBatch:
    """Encode and pad a list of examples.

    Shapes:
        B examples -> src (B, S), src_key_mask (B, S), tgt_in (B, 11), tgt_out (B, 11),
        S = the longest source in the batch
    """
    if not examples:
        raise ValueError("make_batch: `examples` must hold at least one DateExample; got none")
    src, lengths = pad_sequences([encode(e.text) for e in examples], pad=PAD)  # (B, S), (B,)
    src_key_mask = padding_mask(lengths, max_len=src.shape[1])  # (B, S)
    target = torch.tensor([encode(e.iso) for e in examples])  # (B, 10)
    column = torch.full((len(examples), 1), SOS)  # (B, 1)
    tgt_in = torch.cat([column, target], dim=1)  # (B, 11)
    tgt_out = torch.cat([target, column.fill_(EOS)], dim=1)  # (B, 11)
    return DateBatch(src, src_key_mask, tgt_in, tgt_out)


def train_batch(batch_size: int, generator: torch.Generator) -> DateBatch:
    """A batch of ``batch_size`` training examples (dates that are not test dates, any format).

    Shapes:
        -> DateBatch with B = batch_size
    """
    return make_batch(sample_examples(batch_size, generator, split="train"))


def test_set(per_format: int = 40, seed: int = TEST_SEED) -> list[DateExample]:
    """The fixed test set: ``per_format`` held-out dates written in each format, in the order of
    :data:`FORMATS` (the same list on every machine for the same arguments).

    Shapes:
        no tensors: a list of ``per_format * len(FORMATS)`` examples
    """
    generator = torch.Generator().manual_seed(seed)
    examples = []
    for name in FORMATS:
        examples += sample_examples(per_format, generator, split="test", formats=[name])
    return examples


def alignment(weights: Tensor, examples: Sequence[DateExample], part: str) -> Tensor:
    """For each target character of ``part`` ("year", "month" or "day"), the attention weight that
    lands on that part's characters in the source: 1.0 when the model reads only "March" (or "Mar",
    "03") while writing each month digit.

    ``weights`` are cross-attention weights of teacher-forced or generated targets: row t is the
    decoder step that writes the t-th ISO character (row 0 reads SOS and writes the first digit).

    Shapes:
        weights (B, L, S) or (B, H, L, S) with L >= 10 -> (B, n) or (B, H, n), n = the part's length
        in the ISO form (4 for the year, 2 for month and day)
    """
    if part not in ISO_SPANS:
        raise ValueError(f"alignment: `part` must be one of {sorted(ISO_SPANS)}; got {part!r}")
    B = len(examples)
    if not isinstance(weights, Tensor) or weights.dim() not in (3, 4) or weights.shape[0] != B \
            or weights.shape[-2] < ISO_LENGTH:
        got = tuple(weights.shape) if isinstance(weights, Tensor) else type(weights).__name__
        raise ValueError(
            f"alignment: `weights` must be (B, L, S) or (B, H, L, S) with B = {B} examples and L >= {ISO_LENGTH}; got {got}"
        )
    S = weights.shape[-1]
    in_part = torch.zeros(B, S, dtype=torch.bool, device=weights.device)  # (B, S)
    for b, example in enumerate(examples):
        start, stop = example.spans[part]
        if stop > S:
            raise ValueError(f"alignment: example {b} ({example.text!r}) is longer than the S = {S} keys of `weights`")
        in_part[b, start:stop] = True
    first, last = ISO_SPANS[part]
    rows = weights[..., first:last, :]  # (B, [H,] n, S)
    keys = in_part[:, None, :] if weights.dim() == 3 else in_part[:, None, None, :]  # broadcast over rows
    return (rows * keys).sum(dim=-1)  # (B, [H,] n)
