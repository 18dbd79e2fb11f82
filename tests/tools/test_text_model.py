"""The real-text model: its corpus (attnbook.tasks.text, attnbook_tools.text_study), the shipped
checkpoint and curves, and the head scores of attnbook_tools.text_heads, each score checked on an
attention pattern built by hand."""

from __future__ import annotations

import pytest
import torch

from attnbook.models.transformer import TinyTransformer
from attnbook.tasks.text import decode, encode, next_token_losses, split_text, text_batch, validation_windows
from attnbook_tools import text_heads as heads
from attnbook_tools import text_study as study
from attnbook_tools.datafiles import DATA_DIR, DataFileError, verified


def windows_of(*texts: str) -> torch.Tensor:
    return torch.stack([encode(t) for t in texts])  # (W, L)


# ----------------------------------------------------------------------------- the corpus
def test_the_corpus_is_shipped_with_its_license_and_digest():
    text = study.load_text()
    assert len(text.encode("utf-8")) >= 400_000 and "The \"assert\" statement" in text
    license_text = verified(DATA_DIR / study.LICENSE).read_text()
    for needed in ("PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2", "Lib/pydoc_data/topics.py", "Python Software Foundation"):
        assert needed in license_text


def test_a_changed_corpus_is_refused(tmp_path):
    for name in ("manifest.json", study.CORPUS):
        (tmp_path / name).write_bytes((DATA_DIR / name).read_bytes())
    (tmp_path / study.CORPUS).write_text(study.load_text().replace("assert", "assort", 1))
    with pytest.raises(DataFileError, match="python_reference.txt.*digest"):
        study.load_text(tmp_path)


def test_the_held_out_part_is_the_last_tenth():
    tokens = encode(study.load_text())
    train, held_out = study.text_parts()
    assert len(held_out) == round(0.1 * len(tokens)) and torch.equal(torch.cat([train, held_out]), tokens)


def test_bytes_round_trip_and_batches_are_windows_of_the_text():
    tokens = encode("naïve café")
    assert len(tokens) == 12 and decode(tokens) == "naïve café"
    batch = text_batch(tokens, 5, 4, generator=torch.Generator().manual_seed(0))
    text = bytes(tokens.tolist())
    assert batch.shape == (5, 4) and all(bytes(row.tolist()) in text for row in batch)
    assert validation_windows(tokens, 5).tolist() == [tokens[:5].tolist(), tokens[5:10].tolist()]
    with pytest.raises(ValueError, match="split_text.*validation"):
        split_text(tokens, 1.0)


def test_next_token_losses_score_position_t_on_token_t_plus_1():
    tokens = torch.tensor([[3, 1, 4, 1]])
    logits = torch.zeros(1, 4, 256)
    logits[0, torch.arange(3), tokens[0, 1:]] = 50.0  # every prediction right
    assert next_token_losses(logits, tokens).abs().max().item() < 1e-12
    logits[0, 1] = 0.0  # position 1 says nothing: log 256
    assert next_token_losses(logits, tokens)[0, 1].item() == pytest.approx(torch.log(torch.tensor(256.0)).item())


# ----------------------------------------------------------------------------- the shipped model
def test_the_shipped_model_loads_and_its_validation_loss_is_the_recorded_one():
    model = study.load_text_model(0)
    run = study.load_results()["runs"]["seed0"]
    assert isinstance(model, TinyTransformer) and not model.training
    assert all(t.dtype == torch.float32 for t in model.state_dict().values())
    loss = study.validation_loss(model, study.text_parts()[1])
    assert loss == pytest.approx(run["final_validation_loss"], abs=1e-4)
    curve = [v for _, v in run["validation"]]
    assert curve[-1] < curve[0] and run["loss_every_10"][-1] < run["loss_every_10"][0] - 2


def test_another_seeds_checkpoint_is_refused(tmp_path):
    (tmp_path / "manifest.json").write_bytes((DATA_DIR / "manifest.json").read_bytes())
    study.checkpoint_path(1, tmp_path).write_bytes(study.checkpoint_path(0).read_bytes())
    with pytest.raises(DataFileError, match="text_model_seed1.pt"):
        study.load_text_model(1, tmp_path)


# ----------------------------------------------------------------------------- the positions each role scores
def test_repeat_positions_point_after_the_earlier_occurrence():
    rows, queries, keys = heads.repeat_positions(windows_of("abcdXabcdY"))
    assert (rows.tolist(), queries.tolist(), keys.tolist()) == ([0], [8], [4])  # "abcd" again -> "X"


def test_line_and_bracket_positions():
    _, queries, keys = heads.line_positions(windows_of("ab\ncd\ne"))
    assert list(zip(queries.tolist(), keys.tolist())) == [(3, 2), (4, 2), (5, 2), (6, 5)]
    _, queries, keys = heads.bracket_positions(windows_of("f(a[b]c)d"))
    assert list(zip(queries.tolist(), keys.tolist())) == [(2, 1), (3, 1), (4, 3), (5, 3), (6, 1), (7, 1)]


# ----------------------------------------------------------------------------- scores on built attention
def test_each_score_finds_the_head_built_to_have_its_role():
    windows = windows_of("ab(cd)\n  ab(cd)\n  x")
    W, L = windows.shape
    roles = heads.role_positions(windows)
    weights = torch.zeros(W, 4, L, L)
    weights[:, :, 0, 0] = 1.0
    for h, role in enumerate(heads.ROLES):  # head h puts all its weight on its role's key
        rows, queries, keys = roles[role]
        for t in range(1, L):
            weights[0, h, t, 0] = 1.0  # by default: the first token
        weights[0, h, queries, :] = 0.0
        weights[0, h, queries, keys] = 1.0
    for h, role in enumerate(heads.ROLES):
        score = heads.mean_weight_at(weights, *roles[role])
        assert score[h].item() == 1.0 and int(score.argmax()) == h, role
    # attention spread evenly gets exactly the uniform baseline
    even = torch.tril(torch.ones(L, L)) / torch.arange(1, L + 1)[:, None]
    score = heads.mean_weight_at(even.expand(W, 1, L, L), *roles["induction"])
    assert score.item() == pytest.approx(heads.uniform_weight_at(roles["induction"][1]))


def test_a_key_after_its_query_is_refused():
    with pytest.raises(ValueError, match="mean_weight_at.*causal"):
        heads.mean_weight_at(torch.zeros(1, 1, 4, 4), torch.tensor([0]), torch.tensor([1]), torch.tensor([2]))


def test_a_knocked_out_head_is_the_head_with_its_output_columns_zeroed():
    torch.manual_seed(0)
    model = TinyTransformer(256, 16, embed_dim=32, num_heads=4, num_layers=2).eval()
    tokens = torch.randint(256, (2, 16))
    with torch.no_grad():
        before = model(tokens)
        with heads.knocked_out(model, [(1, 2)]):
            knocked = model(tokens)
        assert torch.equal(model(tokens), before)  # the hook is gone
        model.blocks[1].attn.out_proj.weight[:, 16:24] = 0.0  # head 2's D = 8 columns
        assert torch.allclose(model(tokens), knocked, atol=1e-6) and not torch.allclose(knocked, before)
    with pytest.raises(ValueError, match="knocked_out.*layer in 0..1"):
        with heads.knocked_out(model, [(2, 0)]):
            pass


def test_a_mean_ablated_head_outputs_its_mean_over_the_windows_at_every_position():
    torch.manual_seed(0)
    model = TinyTransformer(256, 16, embed_dim=32, num_heads=4, num_layers=2).eval()
    windows = torch.randint(256, (3, 16))
    seen = []
    out_proj = model.blocks[1].attn.out_proj
    with torch.no_grad():
        hook = out_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0].clone()))
        before = model(windows)
        hook.remove()
        mean = seen[0].reshape(-1, 32).mean(dim=0)  # (E,): every head's mean output
        with heads.mean_ablated(model, [(1, 2)], windows):
            hook = out_proj.register_forward_pre_hook(lambda m, a: seen.append(a[0].clone()))  # after the ablation's
            ablated = model(windows)
            hook.remove()
        assert torch.equal(model(windows), before)  # the ablation's hooks are gone
    fed = seen[-1]  # (W, L, E): what out_proj read inside
    assert torch.allclose(fed[..., 16:24], mean[16:24].expand(3, 16, 8))  # head 2: its mean everywhere
    assert torch.equal(fed[..., :16], seen[0][..., :16]) and not torch.allclose(ablated, before)


def test_nested_bracket_weights_read_the_inner_the_outer_and_the_bracket_closed_last():
    windows = windows_of("a([b])c")  # ( at 1, [ at 2; b at 3 is two deep; ) at 5 closes (; c at 6 outside
    weights = torch.zeros(1, 7, 7)
    weights[0, 3, 2], weights[0, 3, 1] = 0.5, 0.25  # b: inner [ and outer (
    weights[0, 6, 1] = 0.125  # c: the opening bracket of the bracket closed last
    got = heads.nested_bracket_weights(weights, windows)
    assert got["deep_queries"] == 2 and got["outside_queries"] == 1  # b and ] are two deep
    assert got["inner"] == pytest.approx(0.25) and got["outer"] == pytest.approx(0.125)
    assert got["outside"] == pytest.approx(0.125) and got["outside_even"] == pytest.approx(1 / 7)


def test_closing_losses_split_the_loss_of_a_closer_into_whether_and_which():
    model = study.load_text_model(0)
    windows = windows_of("f(a[b]) c) d")  # closers predicted inside brackets: ] and the first )
    got = heads.closing_losses(model, windows)
    assert got["count"] == 2
    losses = heads.token_losses(model, windows)[heads.helped_tokens(windows)["open bracket"]]
    assert got["whether"] + got["which"] == pytest.approx(got["loss"], abs=1e-5)
    assert got["loss"] == pytest.approx(losses.mean().item(), abs=1e-5) and got["which"] > 0 < got["whether"]


def test_helped_tokens_mark_the_copy_the_indentation_and_the_closing_bracket():
    helped = heads.helped_tokens(windows_of("abcdXabcdX\n  (a)"))
    assert helped["induction"][0].nonzero().flatten().tolist() == [8]  # "abcd" -> predicts "X"
    assert helped["line start"][0].nonzero().flatten().tolist() == [10, 11, 12]  # "\n", " ", " "
    assert helped["open bracket"][0].nonzero().flatten().tolist() == [14]  # "a" -> predicts ")"


def test_icl_score_and_knockout_effects_on_built_losses():
    losses = torch.linspace(3.0, 1.0, 127).expand(5, 127)  # the loss falls along the window
    early = losses[0, heads.EARLY[0] : heads.EARLY[1]].mean()
    late = losses[0, heads.LATE[0] : heads.LATE[1]].mean()
    assert heads.icl_score(losses) == pytest.approx((late - early).item()) and heads.icl_score(losses) < -1
    helped = torch.zeros(5, 127, dtype=torch.bool)
    helped[:, :10] = True
    effects = heads.knockout_effects(losses, losses + helped.float(), helped)
    assert effects["helped_after"] - effects["helped_before"] == pytest.approx(1.0)
    assert effects["others_after"] == effects["others_before"] and effects["helped_count"] == 50


# ----------------------------------------------------------------------------- the shipped head scores
def test_the_shipped_heads_are_the_best_of_their_scores():
    run = heads.load_results()["runs"]["seed0"]
    for role, entry in run["found"].items():
        table = torch.tensor(run["scores"][role])
        assert entry["score"] == table.max().item() == table[entry["layer"], entry["head"]].item()


def test_sampling_at_temperature_zero_is_the_models_greedy_decoding():
    model = study.load_text_model(0)
    prompt = "The \"while\" statement\n"
    greedy = study.sample_text(model, prompt, 40, temperature=0.0)
    expected = model.generate(encode(prompt)[None], 40)[0, len(encode(prompt)):]
    assert greedy.encode("utf-8") == bytes(expected.tolist())
    assert study.sample_text(model, prompt, 40, temperature=3.0, top_k=1, seed=5) == greedy
    warm = study.sample_text(model, prompt, 40, temperature=1.0, top_k=20, seed=1)
    assert warm == study.sample_text(model, prompt, 40, temperature=1.0, top_k=20, seed=1) and warm != greedy
