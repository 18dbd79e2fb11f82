"""What today's chapters still owe the book's rules: the exact list, per rule and per chapter.

Several tests check every chapter against a rule (claims tied to figures, one notation, reading
order, foldable checks, code that fits the column, legible figures, controls that work on the
website). A chapter written before a rule existed breaks it in known places, listed here under
DEBTS[rule][chapter] by a short key per violation (a glue key, a symbol, a cell's first line).

For each rule and chapter, :func:`settle` then

- fails on any violation that is not listed (new content is born compliant);
- fails on a listed violation that is gone (delete its entry: the list stays exact);
- otherwise marks the test as an expected failure (xfail) that names every listed violation.

The chapters' owners delete entries as they fix them; nobody adds entries (a justified
exception is allowed in the chapter itself, in the cell's metadata: see each rule's test).
Run ``python tests/chapter_debts.py`` to print every chapter's current violations.
"""

from __future__ import annotations

import pytest

# Generated from the chapters as they stood when these rules were added; entries are only deleted.
DEBTS: dict[str, dict[str, list[str]]] = {
    'claims': {
        'chapters/00_attention_at_a_glance': [
            'fig-00-self-weights',
            'fig-00-temperature',
        ],
        'chapters/01_seq2seq_bottleneck': [
            'fig-01-loss',
            'fig-01-accuracy',
            'fig-01-position',
        ],
        'chapters/02_attention_in_seq2seq': [
            'fig-02-accuracy',
            'fig-02-heatmaps',
        ],
        'chapters/03_scaled_dot_product': [
            'fig-03-variance',
            'fig-03-saturation',
            'fig-03-weights',
        ],
        'chapters/04_bilinear_score': [
            'fig-04-learned-w',
        ],
        'chapters/05_additive_score': [
            'fig-05-cost',
        ],
        'chapters/05b_four_scores': [
            'fig-05b-accuracy',
            'fig-05b-loss',
        ],
        'chapters/06_queries_keys_values': [
            'fig-06-sinusoids',
            'fig-06-weights',
        ],
        'chapters/07_masking': [
            'fig-07-masks',
            'fig-07-editor',
        ],
        'chapters/08_multi_head_attention': [
            'fig-08-loss',
            'fig-08-heads',
            'fig-08-timing',
        ],
        'chapters/09_attention_at_scale': [
            'fig-09-scaling',
        ],
    },
    'notation': {
        'chapters/00_attention_at_a_glance': [
            'value-width: Ev',
            'scale-width: \\sqrt{E}',
            'scale-width: sqrt(E)',
            'weight-symbols: w_j',
            'score-symbols: s_j',
            "score-symbols: s_{j'}",
            'scale-width: √E',
            'value-width: E_v',
        ],
        'chapters/01_seq2seq_bottleneck': [
            'length-T: y_T',
            'vocab-V: (B, T, V)',
            'length-T: (B, T,',
        ],
        'chapters/03_scaled_dot_product': [
            'scale-width: √d',
            'query-key-symbols: key $v$',
            'query-key-symbols: u \\cdot v',
            'scale-width: \\sqrt{E}',
            'scale-width: √E',
            'scale-width: sqrt(E)',
        ],
        'chapters/04_bilinear_score': [
            'width-symbols: d_\\text{out}',
            'width-symbols: d_\\text{in}',
        ],
        'chapters/05_additive_score': [
            'additive-vector: v^\\top \\tanh',
            'additive-bias: \\tanh\\!\\big(W [q; k] + c\\big)',
            'row-vectors: W [q; k]',
            'additive-bias: \\tanh\\!\\big(W_q\\, q + W_k\\, k + c\\big)',
            'row-vectors: W_q\\, q',
            'row-vectors: W_k\\, k',
            'additive-vector: v @ torch.tanh',
            'additive-bias: tanh(W @ torch.cat([q, k]) + c)',
            'additive-bias: tanh(W_q @ q + W_k @ k + c)',
            'row-vectors: W @ torch.cat([q',
            'row-vectors: W_q @ q',
            'row-vectors: W_k @ k',
            'row-vectors: W_q q_i',
            'row-vectors: W_k k_j',
            'additive-bias: \\tanh(W [q; k] + c)',
            'additive-bias: \\tanh(W_q q + W_k k + c)',
            'row-vectors: W_q q',
            'row-vectors: W_k k',
            'additive-vector: v · tanh',
        ],
        'chapters/05b_four_scores': [
            'additive-vector: v^\\top \\tanh',
            'row-vectors: W_q s',
            'row-vectors: W_k h',
        ],
        'chapters/06_queries_keys_values': [
            'weight-symbols: w_{ij}',
        ],
        'chapters/07_masking': [
            'weight-symbols: w_{ij}',
            'width-symbols: d_k',
            'width-symbols: d_model',
            'width-symbols: d_{model}',
        ],
        'chapters/08_multi_head_attention': [
            'weight-symbols: w_j',
            'vocab-V: (B, 2N, V)',
            'width-symbols: $d$',
            'width-symbols: n\\,d^2',
            'width-symbols: n^2 d',
            'width-symbols: d = 6',
            'width-symbols: (d = 6',
        ],
        'chapters/09_attention_at_scale': [
            'weight-symbols: w_j',
            'score-symbols: s_1, \\dots, s_S',
            'score-symbols: s_j',
        ],
    },
    'order': {
        'chapters/06_queries_keys_values': [
            'MultiHeadAttention',
        ],
        'chapters/07_masking': [
            'KVCache',
            'CausalSelfAttention',
            'MultiHeadAttention',
        ],
    },
    'checks': {
        'chapters/00_attention_at_a_glance': [
            'exps = [math.exp(s) for s in scores_by_hand[0].tolist()]',
            'output, weights = attention(query, keys, values)',
            'self_output, self_weights = attention(keys, keys, values)  # queries = keys: (4, 2)',
            'scales = [0.1, 1 / math.sqrt(2), 5.0]',
            'torch.manual_seed(1)',
        ],
        'chapters/01_seq2seq_bottleneck': [
            'task = ReversalTask(min_len=4, max_len=24)',
            'print(VOCAB_SIZE, "symbols:", " ".join(VOCAB))',
            'n = int(batch.tgt_lengths[0])',
            'torch.manual_seed(0)',
            'start_loss, end_loss = sum(history.losses[:20]) / 20, sum(history.losses[-50:]) / 50',
            'test_sources, test_targets = task.test_set(per_length=100)',
            'long_sources = [s for s in test_sources if len(s) >= 19]',
        ],
        'chapters/02_attention_in_seq2seq': [
            's = torch.tensor([[1.0, 0.5, -1.0]])  # (B, Dq) = (1, 3)',
            'words = ["Helga", "ate", "an", "apple"]',
            'scores1, weights1 = helga_weights(1.0)',
            'models, configs = {}, {}',
            'long_attention = results["dot-product attention"].bucketed()["19-24"]',
            'all_outputs, all_weights = predict(attention_model, test_sources)',
        ],
        'chapters/03_scaled_dot_product': [
            'N = 10_000  # pairs per width',
            'u = torch.randn(N, 2)',
            'H_unscaled = np.array(results["unscaled"])',
            'def score_gradient_norms(score, D, n=n_queries, S=S):',
            'fig = small_multiples(draw_weights, [{"D": 4}, {"D": 64}, {"D": 1024}],',
        ],
        'chapters/04_bilinear_score': [
            'B, L, S, Dq, Dk = 2, 3, 5, 4, 6',
            'D = 8',
            'Dq, Dk, Dv = 6, 10, 10  # decoder states of width 6, bidirectional encoder states of width 2 * 5',
            'A = wrong.w.weight.detach()  # (d_out, d_in)',
            'D, S, noise = 16, 8, 0.3',
            'W = learned.weight.detach()',
            'def flops(score, queries, keys):',
            'for D in (16, 256):',
        ],
        'chapters/05_additive_score': [
            'B, L, S, Dq, Dk, Dh = 2, 3, 4, 5, 6, 7',
            'score64 = AdditiveScore(Dq, Dk, Dh).double()',
            'attend = Attention(AdditiveScore(Dq, Dk, Dh))',
            'bytes_per_float = 4',
            'times = {"broadcast": [], "concat": []}',
            'n = lengths[-2]',
        ],
        'chapters/05b_four_scores': [
            'parameters = {name: sum(p.numel() for p in make_score(name, 64, 64).parameters())',
            'recorded = load_results()',
            'long_bucket = bucket_names[-1]',
            'def beats_on_every_seed(a, b):',
            'sharpness = {}',
            'losses = {LABELS[s]: recorded["runs"][f"{s}/seed{seeds[0]}"]["loss_every_10"] for s in SCORE_NAMES}',
        ],
        'chapters/06_queries_keys_values': [
            'B, L, E, D = 2, 5, 6, 4',
            'i = 3',
            'mixer = nn.Linear(L, L, bias=False)  # mixes the L positions with a learned (L, L) matrix',
            'square_q, square_k, square_v = (nn.Linear(E, E, bias=False) for _ in range(3))  # D = E for one head',
            'self_attention = MultiHeadAttention(E, num_heads=2).eval()',
            'vocab = {word: n for n, word in enumerate(["the", "dog", "bites", "man", "saw", "cat"])}',
            'table = sinusoidal_positions(64, 32)  # (L, E)',
            'with torch.no_grad():',
        ],
        'chapters/07_masking': [
            'lengths = torch.tensor([5, 3, 2])',
            'x_noisy = x.clone()',
            'L = 5',
            'both = combine_masks(keys_ok[:, None, :], causal)  # (B, L, S)',
            'L_new, S_all = 2, 5',
            'layer = CausalSelfAttention(E, num_heads=2).eval()',
            'scores = torch.randn(1, L, L)  # (B, L, S)',
            'def exhibit2_fill_minus_1e9(scores, mask):',
            'row_mask = causal.clone()',
            'class ExhibitFourListOfHeads(nn.Module):',
            'torch_mha = nn.MultiheadAttention(E, 2, batch_first=True).eval()',
            'def exhibit6_causal_without_diagonal(n):',
            'D_wide = 256',
            'no_mask = torch.ones(5, 5, dtype=torch.bool)',
        ],
        'chapters/08_multi_head_attention': [
            'with torch.no_grad():',
            'params = {heads: sum(p.numel() for p in MultiHeadAttention(64, heads).parameters()) for heads in (1, 2, 4, 8)}',
            'values = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, -1.0, -1.0], [-1.0, -1.0, 1.0, 1.0]])  # (S, E)',
            'torch_mha = nn.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64).eval()',
            'sdpa = MultiHeadAttention.from_torch(torch_mha, backend="sdpa")',
            'test_tokens = repeat_batch(1000, N, vocab_size, generator=torch.Generator().manual_seed(1))  # (B, 2N)',
            'example = repeat_batch(1, N, vocab_size, generator=torch.Generator().manual_seed(7))  # (1, 2N)',
            'prompts = test_tokens[:8, :N]  # (B, N): first halves only',
            "# n grows 8 times: attention's quadratic work should grow far faster than the convolution's linear",
        ],
        'chapters/09_attention_at_scale': [
            'def attention_flops(B, H, L, S, D):',
            'B, L, E, H = 8, 1024, 768, 12',
            '# From L = 1024 to 4096 the work grows 16 times. Both paths do all of it, so both times grow',
            'scores = torch.tensor([1.0, 3.0, 0.5, 4.0, 2.0, -1.0], dtype=torch.float64)  # (S,) for one query',
            'B, H, L, S, D = 2, 3, 37, 50, 16',
            'n = 4096',
            'torch.manual_seed(0)',
            'with torch.inference_mode():',
        ],
    },
    'code-width': {
        'chapters/00_attention_at_a_glance': [
            'code tokens = ["the", "cat", "sat", "down"]',
            'output tokens = ["the", "cat", "sat", "down"]',
            'code E = query.shape[-1]',
            'code exps = [math.exp(s) for s in scores_by_hand[0].tolist()]',
            'code output_by_hand = sum(weights_by_hand[0, j] * values[j] for j in range(4)).unsqueeze(0)  # (1, Ev)',
            'literalinclude attention',
            'code self_output, self_weights = attention(keys, keys, values)  # queries = keys: (4, 2)',
            'code def show_temperature(scale=1 / math.sqrt(2)):',
            'output def show_temperature(scale=1 / math.sqrt(2)):',
            'code scales = [0.1, 1 / math.sqrt(2), 5.0]',
            'code torch.manual_seed(1)',
            'output torch.manual_seed(1)',
            'code import torch',
            'code check("masked_softmax", my_masked_softmax, part="values").assert_passed()',
            'code check("masked_softmax", my_masked_softmax, part="fully_masked").assert_passed()',
            'code check("masked_softmax", my_masked_softmax, part="broadcast").assert_passed()',
            'code check("masked_softmax", my_masked_softmax, part="fp16").assert_passed()',
            'code check("masked_softmax", my_masked_softmax, part="large_scores").assert_passed()',
            'code import math',
            'code check("scaled_dot_product_attention", my_attention, part="no_mask").assert_passed()',
            'code check("scaled_dot_product_attention", my_attention, part="mask").assert_passed()',
            'code check("scaled_dot_product_attention", my_attention, part="fully_masked").assert_passed()',
            'code check("scaled_dot_product_attention", my_attention, part="heads").assert_passed()',
            'code check("scaled_dot_product_attention", my_attention, part="fp16").assert_passed()',
            'code def predicted_shapes(B, H, L, S, E, Ev):',
            'code check("weights_shape", predicted_shapes, part="weights").assert_passed()',
            'code check("weights_shape", predicted_shapes, part="output").assert_passed()',
        ],
        'chapters/01_seq2seq_bottleneck': [
            'code import matplotlib.pyplot as plt',
            'code task = ReversalTask(min_len=4, max_len=24)',
            'code print(VOCAB_SIZE, "symbols:", " ".join(VOCAB))',
            'output print(VOCAB_SIZE, "symbols:", " ".join(VOCAB))',
            'code n = int(batch.tgt_lengths[0])',
            'literalinclude Encoder',
            'literalinclude BottleneckDecoder',
            'code torch.manual_seed(0)',
            'code history = train(model, task=task, steps=800, batch_size=64, lr=3e-3, seed=0, desc="bottleneck")',
            'code start_loss, end_loss = sum(history.losses[:20]) / 20, sum(history.losses[-50:]) / 50',
            'code fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))',
            'code long_sources = [s for s in test_sources if len(s) >= 19]',
            'output long_sources = [s for s in test_sources if len(s) >= 19]',
            'code for length in (4, 8, 14, 20):',
            'output for length in (4, 8, 14, 20):',
            'code import torch',
            'code check("final_state", my_final_state, part="full_length").assert_passed()',
            'code check("final_state", my_final_state, part="length_one").assert_passed()',
            'code def my_masked_mean(outputs, mask):',
            'code check("masked_mean", my_masked_mean, part="no_padding").assert_passed()',
        ],
        'chapters/02_attention_in_seq2seq': [
            'code import collections',
            'literalinclude attention_step',
            'literalinclude AttentionDecoder.step',
            'code s = torch.tensor([[1.0, 0.5, -1.0]])  # (B, Dq) = (1, 3)',
            'code words = ["Helga", "ate", "an", "apple"]',
            'code scores1, weights1 = helga_weights(1.0)',
            'code models, configs = {}, {}',
            'output models, configs = {}, {}',
            'code long_attention = results["dot-product attention"].bucketed()["19-24"]',
            'code attention_model = models["dot-product attention"]',
            'code all_outputs, all_weights = predict(attention_model, test_sources)',
            'output all_outputs, all_weights = predict(attention_model, test_sources)',
            'code import torch',
            'code check("seq2seq_attention_step", my_attention_step, part="values").assert_passed()',
            'code check("seq2seq_attention_step", my_attention_step, part="padding").assert_passed()',
            'code check("seq2seq_attention_step", my_attention_step, part="empty_source").assert_passed()',
            'code check("padding_mask", my_padding_mask, part="longer_S").assert_passed()',
            'code check("padding_mask", my_padding_mask, part="zero_length").assert_passed()',
        ],
        'chapters/03_scaled_dot_product': [
            'code import math',
            'code N = 10_000  # pairs per width',
            'code u = torch.randn(N, 2)',
            'output u = torch.randn(N, 2)',
            'code fig, ax = plt.subplots(figsize=(5.5, 3.8))',
            'code def entropy(weights):',
            'output def entropy(weights):',
            'code H_unscaled = np.array(results["unscaled"])',
            'code def score_gradient_norms(score, D, n=n_queries, S=S):',
            'code fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))',
            'code def draw_weights(ax, D, S=12):',
            'code interact_on_axes(draw_weights, D=power_of_two_slider("D", 1, 1024, value=64));',
            'output interact_on_axes(draw_weights, D=power_of_two_slider("D", 1, 1024, value=64));',
            'code fig = small_multiples(draw_weights, [{"D": 4}, {"D": 64}, {"D": 1024}],',
            'code check("scaled_dot_scores", my_scaled_scores, part="values").assert_passed()',
            'code check("scaled_dot_scores", my_scaled_scores, part="heads").assert_passed()',
            'code check("scaled_dot_scores", my_scaled_scores, part="unbatched").assert_passed()',
            'code def score_variances(E):',
            'code check("score_variance", score_variances, part="unscaled").assert_passed()',
            'code check("score_variance", score_variances, part="scaled").assert_passed()',
        ],
        'chapters/04_bilinear_score': [
            'literalinclude BilinearScore',
            'code B, L, S, Dq, Dk = 2, 3, 5, 4, 6',
            'code D = 8',
            'code Dq, Dk, Dv = 6, 10, 10  # decoder states of width 6, bidirectional encoder states of width 2 * 5',
            'output Dq, Dk, Dv = 6, 10, 10  # decoder states of width 6, bidirectional encoder states of width 2 * 5',
            'code class LayerBilinearScore(nn.Module):',
            'code A = wrong.w.weight.detach()  # (d_out, d_in)',
            'output A = wrong.w.weight.detach()  # (d_out, d_in)',
            'code D, S, noise = 16, 8, 0.3',
            'output D, S, noise = 16, 8, 0.3',
            'code W = learned.weight.detach()',
            'code def flops(score, queries, keys):',
            'output def flops(score, queries, keys):',
            'code for D in (16, 256):',
            'code def my_bilinear_score(queries, weight, keys):',
            'code check("bilinear_score", my_bilinear_score, part="values").assert_passed()',
            'code check("bilinear_score", my_bilinear_score, part="square").assert_passed()',
            'code check("bilinear_score", my_bilinear_score, part="batch").assert_passed()',
            'code import math',
            'code check("bilinear_equals_dot", dot_as_bilinear, part="values").assert_passed()',
            'code check("bilinear_equals_dot", dot_as_bilinear, part="check").assert_passed()',
        ],
        'chapters/05_additive_score': [
            'code B, L, S, Dq, Dk, Dh = 2, 3, 4, 5, 6, 7',
            'output B, L, S, Dq, Dk, Dh = 2, 3, 4, 5, 6, 7',
            'literalinclude AdditiveScore',
            'code score64 = AdditiveScore(Dq, Dk, Dh).double()',
            'code attend = Attention(AdditiveScore(Dq, Dk, Dh))',
            'code B, Dq, Dk, Dh = 2, 32, 64, 32',
            'output B, Dq, Dk, Dh = 2, 32, 64, 32',
            'code bytes_per_float = 4',
            'output bytes_per_float = 4',
            'code times = {"broadcast": [], "concat": []}',
            'code fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))',
            'code n = lengths[-2]',
            'output n = lengths[-2]',
            'code import torch',
            'code check("additive_score", my_additive_score, part="values").assert_passed()',
            'code check("additive_score", my_additive_score, part="square").assert_passed()',
            'code check("additive_score", my_additive_score, part="one_query").assert_passed()',
            'code check("additive_concat", concat_weight, part="values").assert_passed()',
        ],
        'chapters/05b_four_scores': [
            'code import statistics',
            'code parameters = {name: sum(p.numel() for p in make_score(name, 64, 64).parameters())',
            'code recorded = load_results()',
            'output recorded = load_results()',
            'code LABELS = {"none": "no attention", "dot": "dot", "scaled_dot": "scaled dot",',
            'code mean_curves = {',
            'code long_bucket = bucket_names[-1]',
            'output long_bucket = bucket_names[-1]',
            'code attention_scores = [s for s in SCORE_NAMES if s != "none"]',
            'output attention_scores = [s for s in SCORE_NAMES if s != "none"]',
            'code def beats_on_every_seed(a, b):',
            'code sharpness = {}',
            'code losses = {LABELS[s]: recorded["runs"][f"{s}/seed{seeds[0]}"]["loss_every_10"] for s in SCORE_NAMES}',
            'output losses = {LABELS[s]: recorded["runs"][f"{s}/seed{seeds[0]}"]["loss_every_10"] for s in SCORE_NAMES}',
            'code def score_parameters(Dq, Dk, Dh):',
            'code check("score_parameter_count", score_parameters, part="dot").assert_passed()',
            'code check("score_parameter_count", score_parameters, part="bilinear").assert_passed()',
            'code check("score_parameter_count", score_parameters, part="additive").assert_passed()',
            'code check("score_widths", scores_for_two_widths, part="can").assert_passed()',
            'code check("score_widths", scores_for_two_widths, part="cannot").assert_passed()',
        ],
        'chapters/06_queries_keys_values': [
            'code B, L, E, D = 2, 5, 6, 4',
            'output B, L, E, D = 2, 5, 6, 4',
            'code i = 3',
            'code mixer = nn.Linear(L, L, bias=False)  # mixes the L positions with a learned (L, L) matrix',
            'code square_q, square_k, square_v = (nn.Linear(E, E, bias=False) for _ in range(3))  # D = E for one head',
            'output square_q, square_k, square_v = (nn.Linear(E, E, bias=False) for _ in range(3))  # D = E for one head',
            'code self_attention = MultiHeadAttention(E, num_heads=2).eval()',
            'code vocab = {word: n for n, word in enumerate(["the", "dog", "bites", "man", "saw", "cat"])}',
            'code table = sinusoidal_positions(64, 32)  # (L, E)',
            'code with torch.no_grad():',
            'output with torch.no_grad():',
            'code words = sentence.split()',
            'code import math',
            'code check("self_attention", my_self_attention, part="values").assert_passed()',
            'code check("self_attention", my_self_attention, part="mask").assert_passed()',
        ],
        'chapters/07_masking': [
            'code import math',
            'code lengths = torch.tensor([5, 3, 2])',
            'code x_noisy = x.clone()',
            'code L = 5',
            'code both = combine_masks(keys_ok[:, None, :], causal)  # (B, L, S)',
            'code L_new, S_all = 2, 5',
            'code layer = CausalSelfAttention(E, num_heads=2).eval()',
            'output layer = CausalSelfAttention(E, num_heads=2).eval()',
            'code scores = torch.randn(1, L, L)  # (B, L, S)',
            'output scores = torch.randn(1, L, L)  # (B, L, S)',
            'code def exhibit2_fill_minus_1e9(scores, mask):',
            'output def exhibit2_fill_minus_1e9(scores, mask):',
            'code row_mask = causal.clone()',
            'code class ExhibitFourListOfHeads(nn.Module):',
            'output class ExhibitFourListOfHeads(nn.Module):',
            'code torch_mha = nn.MultiheadAttention(E, 2, batch_first=True).eval()',
            'output torch_mha = nn.MultiheadAttention(E, 2, batch_first=True).eval()',
            'code def exhibit6_causal_without_diagonal(n):',
            'code D_wide = 256',
            'code editor_tokens = ["the", "cat", "sat", "on", "mats"]',
            'output editor_tokens = ["the", "cat", "sat", "on", "mats"]',
            'code no_mask = torch.ones(5, 5, dtype=torch.bool)',
            'code check("causal_mask", my_causal_mask, part="more_keys").assert_passed()',
            'code check("causal_mask", my_causal_mask, part="one_query").assert_passed()',
            'code check("causal_mask", my_causal_mask, part="fewer_keys").assert_passed()',
            'code check("pick_causal_mask", causal_picks, part="square").assert_passed()',
        ],
        'chapters/08_multi_head_attention': [
            'code import itertools',
            'code B, L, S, E, H = 2, 5, 7, 8, 2',
            'literalinclude split_heads',
            'literalinclude merge_heads',
            'code with torch.no_grad():',
            'output with torch.no_grad():',
            'code params = {heads: sum(p.numel() for p in MultiHeadAttention(64, heads).parameters()) for heads in (1, 2, 4, 8)}',
            'output params = {heads: sum(p.numel() for p in MultiHeadAttention(64, heads).parameters()) for heads in (1, 2, 4, 8)}',
            'code values = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, -1.0, -1.0], [-1.0, -1.0, 1.0, 1.0]])  # (S, E)',
            'code torch_mha = nn.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64).eval()',
            'output torch_mha = nn.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64).eval()',
            'code sdpa = MultiHeadAttention.from_torch(torch_mha, backend="sdpa")',
            'output sdpa = MultiHeadAttention.from_torch(torch_mha, backend="sdpa")',
            'literalinclude TransformerBlock',
            'code torch.manual_seed(0)',
            'output torch.manual_seed(0)',
            'code losses = train_repeat(model, steps=120, batch_size=32, half_len=N, lr=3e-3, seed=0)',
            'code test_tokens = repeat_batch(1000, N, vocab_size, generator=torch.Generator().manual_seed(1))  # (B, 2N)',
            'code example = repeat_batch(1, N, vocab_size, generator=torch.Generator().manual_seed(7))  # (1, 2N)',
            'code picker = interact_on_axes(',
            'output picker = interact_on_axes(',
            'code prompts = test_tokens[:8, :N]  # (B, N): first halves only',
            'code d = 64',
            'output d = 64',
            "code # n grows 8 times: attention's quadratic work should grow far faster than the convolution's linear",
            'code def my_split_heads(x, num_heads):',
            'code check("split_heads", my_split_heads, part="values").assert_passed()',
            'code check("split_heads", my_split_heads, part="non_contiguous").assert_passed()',
            'code check("merge_heads", my_merge_heads, part="round_trip").assert_passed()',
            'code import math',
            'code check("multi_head_forward", my_multi_head_forward, part="values").assert_passed()',
            'code check("multi_head_forward", my_multi_head_forward, part="mask").assert_passed()',
            'code check("multi_head_forward", my_multi_head_forward, part="structure").assert_passed()',
            'code from torch import nn',
            'code check("multi_head_forward", MyMultiHeadAttention, part="structure").assert_passed()',
            'code check("multi_head_forward", MyMultiHeadAttention, part="values").assert_passed()',
            'code check("multi_head_forward", MyMultiHeadAttention, part="mask").assert_passed()',
        ],
        'chapters/09_attention_at_scale': [
            'code def attention_flops(B, H, L, S, D):',
            'code B, L, E, H = 8, 1024, 768, 12',
            'code lengths = [256, 512, 1024, 2048, 4096]',
            'code # From L = 1024 to 4096 the work grows 16 times. Both paths do all of it, so both times grow',
            'code fig, (ax_time, ax_memory) = plt.subplots(1, 2, figsize=(9.0, 3.6))',
            'code scores = torch.tensor([1.0, 3.0, 0.5, 4.0, 2.0, -1.0], dtype=torch.float64)  # (S,) for one query',
            'literalinclude tiled_attention',
            'code B, H, L, S, D = 2, 3, 37, 50, 16',
            'code n = 4096',
            'literalinclude KVCache.append',
            'code torch.manual_seed(0)',
            'output torch.manual_seed(0)',
            'code with torch.inference_mode():',
            'output with torch.inference_mode():',
            'code import torch',
            'code check("online_softmax_merge", my_merge_states, part="values").assert_passed()',
            'code check("online_softmax_merge", my_merge_states, part="empty_block").assert_passed()',
            'code check("online_softmax_merge", my_merge_states, part="attention").assert_passed()',
        ],
    },
    'controls': {
        'chapters/00_attention_at_a_glance': [
            'FloatLogSlider in def show_temperature(scale=1 / math.sqrt(2)):',
            'interact in def show_temperature(scale=1 / math.sqrt(2)):',
        ],
        'chapters/03_scaled_dot_product': [
            'interact_on_axes in interact_on_axes(draw_weights, D=power_of_two_slider("D", 1, 1024, value=64));',
        ],
        'chapters/08_multi_head_attention': [
            'interact_on_axes in picker = interact_on_axes(',
            'Dropdown in picker = interact_on_axes(',
        ],
    },
    'figures': {
        'chapters/00_attention_at_a_glance': [
            'fig-00-self-weights',
            'fig-00-temperature',
        ],
        'chapters/01_seq2seq_bottleneck': [
            'fig-01-loss',
            'fig-01-accuracy',
            'fig-01-position',
        ],
        'chapters/02_attention_in_seq2seq': [
            'fig-02-accuracy',
            'fig-02-heatmaps',
        ],
        'chapters/03_scaled_dot_product': [
            'fig-03-variance',
            'fig-03-saturation',
            'fig-03-weights',
        ],
        'chapters/04_bilinear_score': [
            'fig-04-learned-w',
        ],
        'chapters/05_additive_score': [
            'fig-05-cost',
        ],
        'chapters/05b_four_scores': [
            'fig-05b-accuracy',
            'fig-05b-loss',
        ],
        'chapters/06_queries_keys_values': [
            'fig-06-sinusoids',
            'fig-06-weights',
        ],
        'chapters/07_masking': [
            'fig-07-masks',
            'fig-07-editor',
        ],
        'chapters/08_multi_head_attention': [
            'fig-08-loss',
            'fig-08-heads',
            'fig-08-timing',
        ],
        'chapters/09_attention_at_scale': [
            'fig-09-scaling',
        ],
    },
}


def settle(rule: str, entry: str, found: dict[str, str]) -> None:
    """Compare the violations ``found`` (key -> message) with those listed for ``rule`` and ``entry``."""
    known = set(DEBTS.get(rule, {}).get(entry, []))
    new = {key: message for key, message in found.items() if key not in known}
    fixed = sorted(known - set(found))
    problems = []
    if new:
        problems.append(f"{entry}: {len(new)} violation(s) of '{rule}' not listed in tests/chapter_debts.py:")
        problems += [f"  - {message}" for message in new.values()]
    if fixed:
        problems.append(f"{entry}: listed under DEBTS[{rule!r}] but fixed; delete these entries from "
                        "tests/chapter_debts.py:")
        problems += [f"  - {key!r}" for key in fixed]
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)
    if found:
        shown = list(found.values())[:2]
        more = f" | ... {len(found) - 2} more" if len(found) > 2 else ""
        pytest.xfail(f"{len(found)} known violation(s) of '{rule}' listed in tests/chapter_debts.py: "
                     + " | ".join(shown) + more)


def rule_test(rule: str, check, doc: str):
    """A test, one case per chapter notebook of _toc.yml, that settles ``check(entry, nb)`` (key ->
    message) against the violations listed for ``rule``."""
    from test_notebooks import notebook, parametrize

    @parametrize
    def test(entry):
        settle(rule, entry, check(entry, notebook(entry)))

    test.__doc__ = doc
    return test


def _print_current() -> None:  # pragma: no cover - a tool for the chapters' owners
    """Print every chapter's current violations of every rule, in the registry's format."""
    import importlib
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_notebooks import ENTRIES, notebook_or_none

    rules = {}
    for module in ("test_claims", "test_notation", "test_reading_order", "test_cells", "test_figures"):
        rules.update(importlib.import_module(module).RULES)
    print("DEBTS = {")
    for rule, check in rules.items():
        print(f"    {rule!r}: {{")
        for entry in ENTRIES:
            nb = notebook_or_none(entry)
            if nb is None:
                continue
            found = check(entry, nb)
            if found:
                print(f"        {entry!r}: [")
                for key in found:
                    print(f"            {key!r},")
                print("        ],")
        print("    },")
    print("}")


if __name__ == "__main__":  # pragma: no cover
    _print_current()
