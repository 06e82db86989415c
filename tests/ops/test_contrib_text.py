"""com.microsoft Tokenizer against ONNX Runtime (string inputs run eagerly only)."""

import numpy as np
import pytest
from opcheck import check_node

MS = "com.microsoft"


def strings(*values):
    return np.array(values, dtype=object)


@pytest.mark.parametrize(
    "attrs",
    [
        {"tokenexp": "[a-zA-Z0-9_]+", "mark": 0, "mincharnum": 1, "pad_value": "#"},
        {"tokenexp": "[a-z]+", "mark": 1, "mincharnum": 3, "pad_value": "?"},
        {"separators": [" ", ","], "mark": 0, "mincharnum": 1, "pad_value": "#"},
    ],
)
@pytest.mark.parametrize("shape", [(3,), (3, 1)])
def test_tokenizer(attrs, shape):
    x = strings("good movie, fun plot", "bad", "an awful_actor 42").reshape(shape)
    check_node("Tokenizer", {"X": x}, attrs, domain=MS, compiled=False)
