"""com.microsoft Tokenizer: the text splitter skl2onnx puts before TfIdfVectorizer.

Strings live on the host, so this runs with Python's `re` (ONNX Runtime uses RE2; the patterns
converters write, such as skl2onnx's `[a-zA-Z0-9_]+`, mean the same in both). Per
ContribOperators.md and ONNX Runtime's CPU kernel: every match of tokenexp (or every piece
between separators) with at least mincharnum characters is a token, `mark` wraps each row's
tokens in the start / end of text characters 0x02 / 0x03, and rows are padded with pad_value to
the longest one: [N] -> [N, T], [N, C] -> [N, C, T].
"""

from __future__ import annotations

import re

import numpy as np

from transmuter.errors import ShapeError
from transmuter.lowering import op

MS = "com.microsoft"


@op("Tokenizer", since=1, domain=MS)
def tokenizer(X, *, mark, mincharnum, pad_value, separators=None, tokenexp=None):
    """com.microsoft Tokenizer-1: strings split into padded rows of tokens."""
    x = np.asarray(X)
    if x.dtype != object:
        raise ShapeError(f"Tokenizer: X must be a string tensor, got {x.dtype}")
    if x.ndim not in (1, 2):
        raise ShapeError(f"Tokenizer: X must be [N] or [N, C], got shape {list(x.shape)}")
    if (tokenexp is None) == (not separators):
        raise ValueError("Tokenizer: set exactly one of tokenexp and separators")
    if tokenexp is not None:
        pattern = re.compile(tokenexp)

        def split(text):
            return [m.group(0) for m in pattern.finditer(text)]
    else:
        # Longer separators first, so that one containing another wins.
        alternatives = sorted(separators, key=len, reverse=True)
        pattern = re.compile("|".join(re.escape(s) for s in alternatives))

        def split(text):
            return pattern.split(text)

    rows = []
    for text in x.reshape(-1).tolist():
        tokens = [t for t in split(text) if len(t) >= mincharnum]
        rows.append(["\x02", *tokens, "\x03"] if mark else tokens)
    width = max((len(r) for r in rows), default=0)
    out = np.empty((len(rows), width), object)
    out[:] = pad_value
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out.reshape(*x.shape, width)
