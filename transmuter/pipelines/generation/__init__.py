"""Decoding: the decode loop and token chooser (decoder.py), encoder-decoder decoding
(seq2seq.py) and continuous batching (continuous.py)."""
