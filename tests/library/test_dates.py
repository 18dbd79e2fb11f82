"""The dates task: every format renders the right date, the ISO answer is right, weekdays match,
spans point at the parts, the split holds out the test dates, batches and the vocabulary work."""

from __future__ import annotations

import datetime
import re

import pytest
import torch

from attnbook.tasks import dates

MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september",
          "october", "november", "december"]
WEEKDAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]


def parse_back(example: dates.DateExample) -> datetime.date:
    """Read the date back from the rendered text with the spans, independently of the renderer."""
    parts = {part: example.text[a:b] for part, (a, b) in example.spans.items()}
    day = int(re.fullmatch(r"(\d{1,2})(st|nd|rd|th)?", parts["day"]).group(1))
    month_text = parts["month"]
    if month_text.isdigit():
        month = int(month_text)
    else:
        matches = [i + 1 for i, name in enumerate(MONTHS) if name.startswith(month_text.lower())]
        assert len(matches) == 1 and len(month_text) >= 3, month_text
        month = matches[0]
    year_text = parts["year"]
    year = int(year_text) if len(year_text) == 4 else (1900 if int(year_text) >= 50 else 2000) + int(year_text)
    return datetime.date(year, month, day)


# Dates that exercise the corners: ordinals 1st/2nd/3rd/11th-13th/21st-23rd/31st, leap days,
# two-digit years on both sides of the century rule, the first and last dates.
CORNERS = [
    datetime.date(1950, 1, 1), datetime.date(2049, 12, 31), datetime.date(1999, 12, 31),
    datetime.date(2000, 1, 1), datetime.date(2000, 2, 29), datetime.date(1996, 2, 29),
    datetime.date(2011, 11, 11), datetime.date(2012, 12, 12), datetime.date(2013, 1, 13),
    datetime.date(1972, 5, 2), datetime.date(1983, 6, 3), datetime.date(2021, 7, 21),
    datetime.date(2022, 8, 22), datetime.date(2023, 9, 23), datetime.date(1994, 3, 3),
    datetime.date(2031, 10, 31), datetime.date(1968, 4, 30), datetime.date(2049, 1, 9),
]


@pytest.mark.parametrize("fmt", list(dates.FORMATS))
def test_every_format_renders_the_right_date(fmt):
    generator = torch.Generator().manual_seed(5)
    examples = [dates.render(d, fmt) for d in CORNERS] + dates.sample_examples(300, generator, formats=[fmt])
    for example in examples:
        assert example.format == fmt
        assert example.iso == example.date.isoformat()  # the ISO answer, by Python's own formatter
        assert parse_back(example) == example.date, example
        if "weekday" in example.spans:  # a weekday shown is the date's true weekday
            a, b = example.spans["weekday"]
            shown = example.text[a:b].lower()
            assert WEEKDAYS[example.date.weekday()].startswith(shown) and len(shown) >= 3, example
        assert set(example.spans) >= {"day", "month", "year"}
        spans = sorted(example.spans.values())
        assert all(a < b <= c for (a, b), (c, _) in zip(spans, spans[1:])), "spans overlap"


def test_known_examples_and_weekday():
    day = datetime.date(1994, 3, 3)
    assert day.strftime("%A") == "Thursday" or day.weekday() == 3
    expected = {
        "ordinal_of": "3rd of March 1994",
        "abbr_short_year": "Mar 3, 94",
        "slashes": "03/03/1994",
        "weekday_day_month": "Thursday 3 March 1994",
        "dots_short_year": "03.03.94",
        "year_first": "1994/03/03",
        "lower_short_year": "3 mar 94",
        "upper": "MARCH 3 1994",
    }
    for fmt, text in expected.items():
        example = dates.render(day, fmt)
        assert example.text == text and example.iso == "1994-03-03"
    # day first: the 3rd of April, not March the 4th
    assert dates.render(datetime.date(1994, 4, 3), "slashes").text == "03/04/1994"
    assert dates.render(datetime.date(2004, 4, 3), "weekday_day_month").text == "Saturday 3 April 2004"


def test_ordinals():
    assert [dates.ordinal(d) for d in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 24, 30, 31)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "24th", "30th", "31st"]
    with pytest.raises(ValueError, match="`day`"):
        dates.ordinal(32)


def test_every_character_of_every_format_is_in_the_vocabulary():
    for month in range(1, 13):
        for weekday_offset in range(7):
            day = datetime.date(2001, month, 1) + datetime.timedelta(days=weekday_offset)
            for fmt in dates.FORMATS:
                example = dates.render(day, fmt)
                ids = dates.encode(example.text)
                assert dates.decode(ids) == example.text
                assert dates.decode(dates.encode(example.iso)) == example.iso
    assert dates.VOCAB[: 3] == ("<pad>", "<sos>", "<eos>") and len(set(dates.VOCAB)) == dates.VOCAB_SIZE


def test_split_holds_out_the_test_dates():
    generator = torch.Generator().manual_seed(0)
    train = dates.sample_examples(2000, generator, split="train")
    assert not any(dates.is_test_date(e.date) for e in train)
    test = dates.test_set()
    assert len(test) == 40 * len(dates.FORMATS)
    assert all(dates.is_test_date(e.date) for e in test)
    assert {e.date.weekday() for e in test} == set(range(7))
    assert [e.format for e in test[::40]] == list(dates.FORMATS)
    assert dates.test_set() == test  # fixed
    again = dates.sample_examples(2000, torch.Generator().manual_seed(0), split="train")
    assert again == train  # deterministic from the seed
    assert dates.sample_examples(5, torch.Generator().manual_seed(1)) != train[:5]


def test_batches_pad_and_shift():
    examples = [dates.render(datetime.date(1994, 3, 3), "slashes"), dates.render(datetime.date(1994, 3, 3), "upper")]
    batch = dates.make_batch(examples)
    assert batch.src.shape == (2, 12) and batch.key_mask.dtype == torch.bool
    assert batch.key_mask.sum(1).tolist() == [10, 12]
    assert (batch.src[0, 10:] == dates.PAD).all()
    assert batch.tgt_in[:, 0].eq(dates.SOS).all() and batch.tgt_out[:, -1].eq(dates.EOS).all()
    assert torch.equal(batch.tgt_in[:, 1:], batch.tgt_out[:, :-1])
    assert dates.decode(batch.tgt_out[0]) == "1994-03-03" == dates.decode(batch.tgt_in[0])


def test_alignment_fractions():
    example = dates.render(datetime.date(1994, 3, 3), "ordinal_of")  # "3rd of March 1994"
    a, b = example.spans["month"]
    weights = torch.zeros(1, dates.ISO_LENGTH + 1, len(example.text))  # (B, L, S)
    weights[0, :, 0] = 1.0
    weights[0, 5, a:b] = 1.0 / (b - a)  # the first month digit reads the month name only
    weights[0, 6, a] = 0.25  # the second a quarter of it
    weights[0, 6, 0] = 0.75
    got = dates.alignment(weights, [example], "month")  # (B, 2)
    torch.testing.assert_close(got, torch.tensor([[1.0, 0.25]]))
    with pytest.raises(ValueError, match="`weights`"):
        dates.alignment(weights[0], [example], "month")
    with pytest.raises(ValueError, match="`part`"):
        dates.alignment(weights, [example], "weekday")


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="`format`"):
        dates.render(datetime.date(1994, 3, 3), "nope")
    with pytest.raises(ValueError, match="`date`"):
        dates.render(datetime.date(1949, 12, 31), "slashes")
    with pytest.raises(TypeError, match="`date`"):
        dates.render("1994-03-03", "slashes")
    with pytest.raises(ValueError, match="not in the vocabulary"):
        dates.encode("Kx")
    with pytest.raises(ValueError, match="`ids`"):
        dates.decode([0, 99])
    with pytest.raises(ValueError, match="`split`"):
        dates.sample_examples(3, torch.Generator(), split="dev")
    with pytest.raises(ValueError, match="`formats`"):
        dates.sample_examples(3, torch.Generator(), formats=["nope"])
    with pytest.raises(ValueError, match="`examples`"):
        dates.make_batch([])
