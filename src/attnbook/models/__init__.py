"""The models the chapters train: seq2seq with and without attention, a tiny causal Transformer, an encoder-decoder."""
