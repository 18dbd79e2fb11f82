"""The encoder-decoder: shapes, padding and causality, cross-attention weights, greedy decoding,
bad input, and checkpoints loaded only after their digest and configuration are checked."""

from __future__ import annotations

import datetime

import pytest
import torch

from attnbook.tasks import dates
from attnbook_tools.datafiles import DATA_DIR, DataFileError, record
from attnbook_tools.dropout_study import (
    DROPOUT_RESULTS, DROPOUT_STUDY, dropout_checkpoint, dropout_pool, load_dropout_results, run_dropout_study,
)
from attnbook.models.encoder_decoder import EncoderDecoder
from attnbook_tools.dates_model import (
    DATES_CHECKPOINT, DATES_CONFIG, DATES_RESULTS, evaluate_dates, load_dates_results, load_model, save_model,
)

V = dates.VOCAB_SIZE


def small_model(seed: int = 0) -> EncoderDecoder:
    torch.manual_seed(seed)
    return EncoderDecoder(V, 32, embed_dim=16, num_heads=2, num_encoder_layers=2, num_decoder_layers=2).eval()


def a_batch() -> dates.DateBatch:
    day = datetime.date(1994, 3, 3)
    return dates.make_batch([dates.render(day, "slashes"), dates.render(day, "weekday_month_ordinal")])


def test_shapes_and_weights():
    model, batch = small_model(), a_batch()
    logits, attentions = model(batch.src, batch.key_mask, batch.tgt_in, need_weights=True)
    B, S = batch.src.shape
    L = batch.tgt_in.shape[1]
    assert logits.shape == (B, L, V)
    assert [w.shape for w in attentions.encoder] == [(B, 2, S, S)] * 2
    assert [w.shape for w in attentions.decoder_self] == [(B, 2, L, L)] * 2
    assert [w.shape for w in attentions.cross] == [(B, 2, L, S)] * 2
    real = batch.key_mask.sum(1).tolist()
    for w in attentions.cross + attentions.encoder:
        for b, n in enumerate(real):
            torch.testing.assert_close(w[b, ..., :n].sum(-1), torch.ones(w.shape[1:-1]))
            assert torch.all(w[b, ..., n:] == 0)
    for w in attentions.decoder_self:
        assert torch.all(w.triu(1) == 0)
    torch.testing.assert_close(model(batch.src, batch.key_mask, batch.tgt_in), logits, rtol=0, atol=0)


def test_padding_changes_nothing_and_the_decoder_is_causal(differs):
    model, batch = small_model(1), a_batch()
    logits = model(batch.src, batch.key_mask, batch.tgt_in)
    src = batch.src.clone()
    src[~batch.key_mask] = 7  # other tokens on the padded positions
    assert (~batch.key_mask).any()
    torch.testing.assert_close(model(src, batch.key_mask, batch.tgt_in), logits, rtol=0, atol=0)
    # without the mask the padding is read, and the logits change
    differs(model(src, None, batch.tgt_in), logits, at_least=1e-2)
    tgt = batch.tgt_in.clone()
    tgt[:, 6:] = 5  # change the target from position 6 on
    changed = model(batch.src, batch.key_mask, tgt)
    torch.testing.assert_close(changed[:, :6], logits[:, :6], rtol=0, atol=0)
    differs(changed[:, 6:], logits[:, 6:], at_least=1e-2)


def test_a_padded_batch_gives_each_sequence_its_own_answer():
    model = small_model(2)
    examples = [dates.render(datetime.date(2001, 9, 11), "upper"), dates.render(datetime.date(1994, 3, 3), "the_ordinal_of")]
    batch = dates.make_batch(examples)
    one = dates.make_batch(examples[:1])
    together = model(batch.src, batch.key_mask, batch.tgt_in)[0]
    alone = model(one.src, one.key_mask, one.tgt_in)[0]
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=0)


def test_generate_is_greedy_and_stops_at_eos():
    model, batch = small_model(3), a_batch()
    tokens = model.generate(batch.src, batch.key_mask, 11)  # (B, N)
    assert tokens.shape[0] == 2 and 1 <= tokens.shape[1] <= 11
    start = torch.full((2, 1), dates.SOS)
    logits = model(batch.src, batch.key_mask, torch.cat([start, tokens[:, :-1]], dim=1))
    greedy = logits.argmax(-1)
    for b in range(2):
        row = tokens[b].tolist()
        end = row.index(dates.EOS) + 1 if dates.EOS in row else len(row)
        assert greedy[b, :end].tolist() == row[:end]  # each token is the argmax given the ones before
        assert all(t == dates.PAD for t in row[end:])  # and only padding after the end
    assert model.training is False
    model.train()
    model.generate(batch.src, batch.key_mask, 3)
    assert model.training is True  # the mode is restored


def test_bad_input_is_named():
    model, batch = small_model(), a_batch()
    src, mask, tgt = batch.src, batch.key_mask, batch.tgt_in
    cases = [
        ((src.float(), mask, tgt), TypeError, "`src`.*int"),
        ((src[0], mask, tgt), ValueError, r"`src` must be 2-D"),
        ((src + 100, mask, tgt), ValueError, "`src` holds the id"),
        ((src, mask, tgt - 5), ValueError, "`tgt_in` holds the id -"),
        ((src, mask.long(), tgt), TypeError, "`key_mask` must be .*bool"),
        ((src, mask[:, :-1], tgt), ValueError, r"`key_mask` must have shape \(B, S\)"),
        ((src, torch.zeros_like(mask), tgt), ValueError, "a row that is all False"),
        ((src, mask, tgt[:1]), ValueError, "same batch size"),
        ((torch.ones(2, 40, dtype=torch.long), None, tgt), ValueError, "max_len=32"),
        (([[1, 2]], mask, tgt), TypeError, "`src` must be a tensor"),
    ]
    for args, error, message in cases:
        with pytest.raises(error, match=message):
            model(*args)
    with pytest.raises(ValueError, match="`max_new_tokens`"):
        model.generate(src, mask, 0)
    with pytest.raises(TypeError, match="`need_weights`"):
        model(src, mask, tgt, need_weights=1)
    with pytest.raises(ValueError, match="`memory`"):
        model.decode(tgt, torch.randn(2, 3, 5), mask)
    with pytest.raises(ValueError, match="`num_encoder_layers`"):
        EncoderDecoder(V, 32, num_encoder_layers=0)


def test_checkpoints_load_only_when_verified(tmp_path):
    torch.manual_seed(0)
    config = {**DATES_CONFIG, "embed_dim": 16, "steps": 0, "seed": 0}
    model = EncoderDecoder(**{k: config[k] for k in DATES_CONFIG}).eval()
    path = tmp_path / "model.pt"
    save_model(model, path, config)
    with pytest.raises(DataFileError, match="not listed"):
        load_model(path, {"embed_dim": 16})
    record([path], tmp_path)
    loaded, got = load_model(path, {"embed_dim": 16})
    assert got["steps"] == 0 and not loaded.training
    batch = a_batch()
    torch.testing.assert_close(loaded(batch.src, batch.key_mask, batch.tgt_in),
                               model(batch.src, batch.key_mask, batch.tgt_in), rtol=0, atol=0)
    with pytest.raises(DataFileError, match="embed_dim=16"):
        load_model(path)  # the shipped configuration has another width
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DataFileError, match="digest"):
        load_model(path, {"embed_dim": 16})


@pytest.mark.skipif(not (DATA_DIR / DATES_CHECKPOINT).exists(), reason="the dates model is not trained yet")
def test_the_shipped_dates_model():
    model, config = load_model()
    results = load_dates_results()
    assert results["config"] == config
    examples = dates.test_set()[::20]  # two of every format
    predicted = evaluate_dates(model, examples)
    recorded = [results["predictions"][i] for i in range(0, len(dates.test_set()), 20)]
    # the same translations as when it was trained (one may flip under another CPU's rounding)
    assert sum(p == r for p, r in zip(predicted, recorded)) >= len(examples) - 1
    assert sum(p == e.iso for p, e in zip(predicted, examples)) >= 0.9 * len(examples)
    assert (DATA_DIR / DATES_RESULTS).exists()


def test_dropout_study_writes_verified_results(tmp_path):
    results = run_dropout_study(seeds=[4], save_seeds=[4], out=tmp_path, steps=2, test_per_format=1)
    assert set(results["runs"]) == {f"p{p:.1f}/seed4" for p in DROPOUT_STUDY["dropouts"]}
    assert results["setup"]["steps"] == 2 and results["setup"]["pool_size"] == len(dropout_pool())
    assert results["setup"]["test_size"] == len(dates.FORMATS)
    p = max(DROPOUT_STUDY["dropouts"])
    model, config = load_model(dropout_checkpoint(p, 4, tmp_path), {**DROPOUT_STUDY["model"], "dropout": p, "seed": 4})
    assert config["steps"] == 2 and not model.training
    assert load_dropout_results(tmp_path / DROPOUT_RESULTS)["runs"] == results["runs"]
    assert all(not dates.is_test_date(e.date) for e in dropout_pool())
    with pytest.raises(ValueError, match="`dropout`"):
        dropout_checkpoint(0.5, 0)
