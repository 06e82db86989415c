"""A compile that runs long says on stderr what it compiles (transmuter/compile_notice.py)."""

from __future__ import annotations

import contextlib
import re
import threading

import numpy as np
from onnx import TensorProto, helper

import transmuter
from transmuter import compile_notice
from transmuter.compile_notice import slow_compile


def _waiting(answer):
    """A describe() returning `answer`, and the event it sets when called."""
    called = threading.Event()

    def describe():
        called.set()
        return answer

    return describe, called


def test_a_compile_past_the_limit_says_what_and_then_how_long(capsys):
    describe, called = _waiting("m.onnx from node 0 for x: float32[2, 3]")
    with slow_compile(describe, after=0.01):
        assert called.wait(10)  # the block outlives the limit
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == (
        "transmuter: compiling m.onnx from node 0 for x: float32[2, 3] (over 0.01 s so far)"
    )
    assert re.fullmatch(r"transmuter: compiled m\.onnx .* in \d+\.\d s", lines[1])
    assert len(lines) == 2


def test_nothing_is_said_under_the_limit_or_when_nothing_compiles(capsys):
    with slow_compile(lambda: "never said", after=60):
        pass
    describe, called = _waiting(None)  # e.g. a jitted call whose program was cached
    with slow_compile(describe, after=0.01):
        assert called.wait(10)
    assert capsys.readouterr().err == ""


def test_a_segment_names_its_model_and_input_shapes(monkeypatch, tmp_path):
    said = []

    @contextlib.contextmanager
    def recording(describe, after=None):
        yield
        said.append(describe())

    monkeypatch.setattr(compile_notice, "slow_compile", recording)
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
    )  # fmt: skip
    path = tmp_path / "relu.onnx"
    path.write_bytes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    )
    example = {"x": np.ones((2, 3), np.float32)}
    model = transmuter.compile(transmuter.load(path), example)
    model(example)  # cached: no compile, nothing wrapped
    model({"x": np.ones((5, 3), np.float32)})
    assert said == [
        f"{path} from node 0 for x: float32[2, 3]",
        f"{path} from node 0 for x: float32[5, 3]",
    ]


def test_many_inputs_are_named_up_to_a_few_and_counted():
    # A segment after a graph break can read hundreds of tensors (the real Kokoro's decoder
    # half reads 148): the line names the first few and counts the rest.
    arrays = {
        f"t{i}": np.zeros((1, i + 1), np.float32) for i in range(compile_notice.SHAPES_SHOWN + 3)
    }
    assert compile_notice.shapes(arrays) == (
        "t0: float32[1, 1], t1: float32[1, 2], t2: float32[1, 3], t3: float32[1, 4] and 3 more"
    )
    assert (
        compile_notice.shapes(dict(list(arrays.items())[:2]))
        == "t0: float32[1, 1], t1: float32[1, 2]"
    )
