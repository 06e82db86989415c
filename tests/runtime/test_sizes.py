"""Sizes read from the graph are checked before XLA is asked for them: past int64 XLA aborts the
process ("overflow in static extent product"), which nothing can catch, and past the machine's
memory no allocation can succeed. Each case runs in a subprocess with a timeout, so an abort
fails the test instead of ending the run."""

from __future__ import annotations

import subprocess
import sys

import pytest

CASES = r"""
import sys
import numpy as np
import onnx
from onnx import TensorProto as T, helper

import transmuter

HUGE = 2**62


def loop_with_a_scan_output():
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["c"], ["c_out"]),
            helper.make_node("Add", ["x_in", "one"], ["x_out"]),
            helper.make_node("Identity", ["x_out"], ["scan"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", T.INT64, []),
            helper.make_tensor_value_info("c", T.BOOL, []),
            helper.make_tensor_value_info("x_in", T.FLOAT, [2]),
        ],
        [
            helper.make_tensor_value_info("c_out", T.BOOL, []),
            helper.make_tensor_value_info("x_out", T.FLOAT, [2]),
            helper.make_tensor_value_info("scan", T.FLOAT, [2]),
        ],
        [onnx.numpy_helper.from_array(np.ones(2, np.float32), "one")],
    )
    node = helper.make_node("Loop", ["M", "", "x"], ["last", "ys"], body=body, name="huge_loop")
    return [node], [("M", np.array(HUGE, np.int64))], ["last", "ys"]


def one_node(op, constants, name):
    inputs = ["x", *[c for c, _ in constants]] if op != "ConstantOfShape" else [constants[0][0]]
    return [helper.make_node(op, inputs, ["y"], name=name)], constants, ["y"]


CASES = {
    "loop": loop_with_a_scan_output(),
    "expand": one_node("Expand", [("s", np.array([2**31, 2**31, 2**10]))], "huge_expand"),
    "tile": one_node("Tile", [("r", np.array([HUGE]))], "huge_tile"),
    "pad": one_node("Pad", [("p", np.array([0, HUGE]))], "huge_pad"),
    "constant_of_shape": one_node("ConstantOfShape", [("s", np.array([2**40, 2**40]))], "huge_fill"),
}

mode = sys.argv[1]
for case, (nodes, constants, outputs) in CASES.items():
    graph = helper.make_graph(
        nodes,
        case,
        [helper.make_tensor_value_info("x", T.FLOAT, [2 if case == "loop" else 1])],
        [helper.make_tensor_value_info(o, T.FLOAT, None) for o in outputs],
        [onnx.numpy_helper.from_array(v.astype(np.int64), n) for n, v in constants],
    )
    model = transmuter.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    x = {"x": np.zeros(2 if case == "loop" else 1, np.float32)}
    try:
        transmuter.run(model, x) if mode == "eager" else transmuter.compile(model, x)(x)
        print(case, "no error")
    except transmuter.TransmuterError as exc:
        print(case, type(exc).__name__, str(exc).splitlines()[0])
"""


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_huge_sizes_are_errors_naming_the_node_not_aborts(mode):
    done = subprocess.run(
        [sys.executable, "-c", CASES, mode], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.strip().splitlines())
    names = {
        "loop": "huge_loop",
        "expand": "huge_expand",
        "tile": "huge_tile",
        "pad": "huge_pad",
        "constant_of_shape": "huge_fill",
    }
    for case, node in names.items():
        assert lines[case].startswith("NodeError"), (case, lines[case])
        assert f"'{node}'" in lines[case] and "past this machine's" in lines[case], lines[case]
