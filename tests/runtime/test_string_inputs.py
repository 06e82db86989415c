"""String inputs given as numpy unicode, bytes or StringDType arrays run as object arrays of str."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

import transmuter

WORDS = ["a", "été", "日本", "", "b", "a"]
KEYS = ["a", "b", "été", "日本"]

# The numpy forms of a list of str. Bytes are its UTF-8 encoding; numpy pads the shorter items
# with NULs and drops them when read, as ONNX Runtime does.
FORMS = {
    "unicode": np.array,
    "bytes": lambda words: np.array([w.encode() for w in words]),
    "stringdtype": lambda words: np.array(words, dtype=np.dtypes.StringDType()),
}
needs_string_dtype = pytest.mark.skipif(
    not hasattr(np.dtypes, "StringDType"), reason="StringDType is numpy 2's"
)
FORM_PARAMS = [
    pytest.param(form, marks=needs_string_dtype if form == "stringdtype" else ()) for form in FORMS
]


def label_encoder(strings: str, ids: str) -> onnx.NodeProto:
    """KEYS[i] -> i, anything else -> -1."""
    return helper.make_node(
        "LabelEncoder",
        [strings],
        [ids],
        domain="ai.onnx.ml",
        keys_strings=KEYS,
        values_int64s=list(range(len(KEYS))),
        default_int64=-1,
    )


def string_model(shape) -> onnx.ModelProto:
    """phs: tensor(string) of `shape` -> the same strings, their LabelEncoder ids, phs == "a"."""
    nodes = [
        helper.make_node("Identity", ["phs"], ["same"]),
        label_encoder("phs", "ids"),
        helper.make_node("Equal", ["phs", "a"], ["is_a"]),
    ]
    graph = helper.make_graph(
        nodes,
        "strings",
        [helper.make_tensor_value_info("phs", TensorProto.STRING, shape)],
        [
            helper.make_tensor_value_info("same", TensorProto.STRING, shape),
            helper.make_tensor_value_info("ids", TensorProto.INT64, shape),
            helper.make_tensor_value_info("is_a", TensorProto.BOOL, shape),
        ],
        [helper.make_tensor("a", TensorProto.STRING, [], [b"a"])],
    )
    opsets = [helper.make_opsetid("", 19), helper.make_opsetid("ai.onnx.ml", 2)]
    return helper.make_model(graph, opset_imports=opsets)


def ort_run(proto: onnx.ModelProto, inputs: dict) -> list:
    """ONNX Runtime's outputs, optimizations off; the inputs as given (a list is a sequence)."""
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = onnxruntime.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, inputs)


def run(model, inputs, mode):
    if mode == "eager":
        return transmuter.run(model, inputs)
    return transmuter.compile(model, inputs)(inputs)


def assert_same(got, want):
    """`got` (a dict of outputs) equals ONNX Runtime's `want` (a list in output order), the
    strings as an object array of Python str."""
    for name, expected in zip(["same", "ids", "is_a"], want, strict=True):
        value = np.asarray(got[name])
        assert value.dtype == expected.dtype and value.shape == expected.shape, name
        np.testing.assert_array_equal(value, expected, err_msg=name)
    assert all(type(s) is str for s in got["same"].ravel())


@pytest.mark.parametrize("mode", ["eager", "compiled"])
@pytest.mark.parametrize("form", FORM_PARAMS)
def test_numpy_string_arrays_run_as_object_arrays(form, mode):
    proto = string_model(["N"])
    model = transmuter.load(proto)
    given, words = FORMS[form](WORDS), np.array(WORDS, dtype=object)
    # ONNX Runtime refuses StringDType and reads a bytes item that fills its width past its end:
    # the reference is its result for the object array of the same strings.
    for picked in (slice(None), slice(None, None, 2)):  # a strided view too
        want = ort_run(proto, {"phs": words[picked]})
        assert_same(run(model, {"phs": given[picked]}, mode), want)


def test_onnx_runtime_agrees_on_unicode_and_padded_bytes():
    proto = string_model(["N"])
    model = transmuter.load(proto)
    padded = np.array([w.encode() for w in WORDS], dtype="S16")
    for given in (np.array(WORDS), padded):
        assert_same(transmuter.run(model, {"phs": given}), ort_run(proto, {"phs": given}))


@pytest.mark.parametrize("form", FORM_PARAMS)
def test_a_compiled_callable_takes_every_form(form):
    proto = string_model(["N"])
    model = transmuter.load(proto)
    words = np.array(WORDS, dtype=object)
    compiled = transmuter.compile(model, {"phs": words})
    want = ort_run(proto, {"phs": words})
    assert_same(compiled({"phs": FORMS[form](WORDS)}), want)
    assert_same(compiled({"phs": words}), want)


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_scalar_string_inputs(mode):
    proto = string_model([])
    model = transmuter.load(proto)
    want = ort_run(proto, {"phs": np.array("été", dtype=object)})
    given = ["été", "été".encode(), np.str_("été"), np.bytes_("été".encode()), np.array("été")]
    if hasattr(np.dtypes, "StringDType"):
        given.append(np.array("été", dtype=np.dtypes.StringDType()))
    for value in given:
        assert_same(run(model, {"phs": value}, mode), want)


@pytest.mark.parametrize("mode", ["eager", "compiled"])
@pytest.mark.parametrize("form", FORM_PARAMS)
def test_string_arrays_in_a_sequence_input(form, mode):
    nodes = [
        helper.make_node("SequenceAt", ["seq", "i"], ["phs"]),
        label_encoder("phs", "ids"),
    ]
    graph = helper.make_graph(
        nodes,
        "sequence",
        [
            helper.make_tensor_sequence_value_info("seq", TensorProto.STRING, None),
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
        ],
        [
            helper.make_tensor_value_info("phs", TensorProto.STRING, None),
            helper.make_tensor_value_info("ids", TensorProto.INT64, None),
        ],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 2)]
    proto = helper.make_model(graph, opset_imports=opsets)
    model = transmuter.load(proto)
    parts = [WORDS[:2], WORDS[2:]]
    index = np.array(1, np.int64)
    want = ort_run(proto, {"seq": [np.array(p, dtype=object) for p in parts], "i": index})
    got = run(model, {"seq": [FORMS[form](p) for p in parts], "i": index}, mode)
    assert got["phs"].dtype == object and all(type(s) is str for s in got["phs"])
    np.testing.assert_array_equal(got["phs"], want[0])
    np.testing.assert_array_equal(np.asarray(got["ids"]), want[1])


def test_object_arrays_pass_as_they_are():
    model = transmuter.load(string_model(["N"]))
    words = np.array(WORDS, dtype=object)
    assert model.check_input("phs", words) is words


def test_bytes_that_are_not_utf8_are_refused():
    model = transmuter.load(string_model(["N"]))
    latin1 = np.array([b"a", "été".encode("latin-1")])
    with pytest.raises(transmuter.InputError, match=r"'phs' holds b'\\xe9t\\xe9' at \[1\].*UTF-8"):
        transmuter.run(model, {"phs": latin1})


@pytest.mark.parametrize(
    "value, match",
    [
        (np.array([1, 2], np.int64), r"expects tensor\(object\)\[N\], got int64\[2\]"),
        (np.array([1.5], np.float32), r"expects tensor\(object\)\[N\], got float32\[1\]"),
        ([1, 2], "expects object, got a Python list"),
    ],
)
def test_numbers_for_a_string_input_are_refused(value, match):
    model = transmuter.load(string_model(["N"]))
    with pytest.raises(transmuter.InputError, match=match):
        transmuter.run(model, {"phs": value})
    compiled = transmuter.compile(model, {"phs": np.array(WORDS, dtype=object)})
    with pytest.raises(transmuter.InputError, match=match):
        compiled({"phs": value})
