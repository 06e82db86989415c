"""`variant`: an older version described by its signature's difference from a newer function."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from transmuter.lowering import REQUIRED, Attribute, lookup, variant


def newest(ctx, X, K, B=None, *, axis=-1, layout=0, mode="a"):
    """The newest version: returns what it was called with."""
    return ctx, X, K, B, {"axis": axis, "layout": layout, "mode": mode}


def test_signature_is_the_described_version():
    older = variant(
        newest,
        "newest_v1",
        "Version 1.",
        fixed={"layout": 0},
        ignored={"legacy": REQUIRED},
        defaults={"mode": "b"},
        required=("B",),
        attributes={"K": Attribute("k", 3)},
    )
    assert str(inspect.signature(older)) == "(ctx, X, B, *, axis=-1, mode='b', k=3, legacy)"
    assert (older.__name__, older.__qualname__, older.__doc__) == (
        "newest_v1",
        "newest_v1",
        "Version 1.",
    )
    assert older.__module__ == __name__


def test_forwards_with_the_differences_applied():
    older = variant(
        newest,
        "newest_v1",
        "Version 1.",
        fixed={"layout": 1},
        ignored={"legacy": 0},
        attributes={"K": Attribute("k", dtype=np.float32)},
    )
    ctx, x, k, b, attrs = older("ctx", "x", k=(2, 3), legacy=5, axis=0)
    assert (ctx, x, b, attrs) == ("ctx", "x", None, {"axis": 0, "layout": 1, "mode": "a"})
    assert isinstance(k, np.ndarray) and k.dtype == np.float32 and k.tolist() == [2.0, 3.0]
    with pytest.raises(TypeError):
        older("ctx", "x", k=1, layout=0)  # version 1 has no layout attribute
    with pytest.raises(TypeError):
        older("ctx", "x")  # k is required


def test_an_absent_attribute_input_stays_absent():
    older = variant(newest, "newest_v1", "Version 1.", attributes={"B": Attribute("b", None)})
    assert older("ctx", "x", "k")[3] is None


@pytest.mark.parametrize(
    "differences",
    [
        {"fixed": {"nope": 0}},
        {"ignored": {"axis": 0}},
        {"defaults": {"X": 1}},
        {"required": ("axis",)},
        {"attributes": {"mode": Attribute("mode")}},
    ],
)
def test_a_difference_that_does_not_fit_is_an_error(differences):
    with pytest.raises(ValueError):
        variant(newest, "newest_v1", "Version 1.", **differences)


def test_registered_variants_belong_to_their_family():
    lstm = lookup("", "LSTM", 7).fn
    assert (lstm.__name__, lstm.__module__) == ("lstm_v7", "transmuter.lowering.ops.rnn")
    gelu = lookup("com.microsoft", "Gelu", 1).fn
    assert gelu.__module__ == "transmuter.lowering.ops.contrib.fused"
