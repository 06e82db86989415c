"""Graph breaks, shown on a small detector-like graph built in place.

scores -> 24 Neg ops -> NonZero(scores > threshold) -> gather kept rows -> 24 ops -> out. How many
rows survive depends on the data, so the graph breaks at NonZero: the part before is compiled,
NonZero runs on the host, and the part after is compiled for the number of rows that resulted.

    python examples/graph_breaks.py
"""

from __future__ import annotations

import logging
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import transmuter


def build():
    nodes, current = [], "scores"
    for i in range(24):
        nodes.append(helper.make_node("Neg", [current], [f"a{i}"]))  # stands for a backbone
        current = f"a{i}"
    nodes += [
        helper.make_node("ReduceMax", [current], ["best"], axes=[1], keepdims=0),
        helper.make_node("Greater", ["best", "threshold"], ["keep"]),
        helper.make_node("NonZero", ["keep"], ["kept"], name="nonzero"),
        helper.make_node("Squeeze", ["kept", "zero"], ["rows"]),
        helper.make_node("Gather", [current, "rows"], ["picked"], axis=0),
    ]
    current = "picked"
    for i in range(24):
        nodes.append(helper.make_node("Tanh" if i % 2 else "Sigmoid", [current], [f"b{i}"]))
        current = f"b{i}"
    nodes.append(helper.make_node("Identity", [current], ["out"]))
    graph = helper.make_graph(
        nodes,
        "breaks",
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["boxes", 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["kept", 4])],
        [
            numpy_helper.from_array(np.array(0.8, np.float32), "threshold"),
            numpy_helper.from_array(np.array([0], np.int64), "zero"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def main() -> None:
    logging.basicConfig(format="  log: %(message)s", stream=sys.stdout)
    logging.getLogger("transmuter").setLevel(logging.INFO)
    transmuter.telemetry.log_compile_work()
    model = transmuter.load(build())
    rng = np.random.default_rng(0)
    print("compiling for 6 boxes:")
    detect = transmuter.compile(model, {"scores": rng.standard_normal((6, 4), np.float32)})
    for boxes in (6, 9):
        out = detect({"scores": rng.standard_normal((boxes, 4), np.float32)})["out"]
        print(f"{boxes} boxes in -> {out.shape[0]} kept")
    print("segment plan (start, stop, compiled):", detect.segments)


if __name__ == "__main__":
    main()
