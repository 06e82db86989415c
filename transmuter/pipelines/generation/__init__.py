"""Decoding: the one token chooser and decode loop (choice.py), decoder-only models with the
past in a bucketed buffer (decoder.py), encoder-decoders (seq2seq.py) and continuous batching
(continuous.py)."""
