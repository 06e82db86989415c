"""Convolutions inside a loop body against the same step called from Python (issue 43).

Run: .venv/bin/python bench/bench_loop_convolutions.py [--repeats 7]

The step: six 3x3 convolutions of 128 channels with a Relu after each, on a [1, 128, 32, 32]
map (the micro-benchmark of issue 43, as an ONNX graph). "loop": an ONNX Loop of 10 steps,
compiled as one program; "stepped": the step's own graph compiled, called 10 times from Python
(nothing read back until the end). Each with the default passes (the layout pass's NhwcConv)
and with optimize=False (Conv as the file has it). Also: how many convolutions XLA:CPU runs
slowly in the loop's while body (runtime/loop_convolutions.py). Medians, alternating.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import transmuter
import transmuter.cpu

C, HW, CONVS, STEPS = 128, 32, 6, 10


def _step_nodes(x: str, out: str) -> list:
    nodes, current = [], x
    for i in range(CONVS):
        conv, relu = f"{out}_c{i}", (out if i == CONVS - 1 else f"{out}_r{i}")
        nodes.append(helper.make_node("Conv", [current, f"w{i}", f"b{i}"], [conv], pads=[1] * 4))
        nodes.append(helper.make_node("Relu", [conv], [relu]))
        current = relu
    return nodes


def _model(loop: bool):
    rng = np.random.default_rng(0)
    inits = {}
    for i in range(CONVS):
        inits[f"w{i}"] = (rng.standard_normal((C, C, 3, 3)) / np.sqrt(9 * C)).astype(np.float32)
        inits[f"b{i}"] = rng.standard_normal(C).astype(np.float32) * 0.1
    value = helper.make_tensor_value_info
    if loop:
        body = helper.make_graph(
            [*_step_nodes("x_in", "x_out"), helper.make_node("Identity", ["c_in"], ["c_out"])],
            "body",
            [value("i", TP.INT64, []), value("c_in", TP.BOOL, []), value("x_in", TP.FLOAT, None)],
            [value("c_out", TP.BOOL, []), value("x_out", TP.FLOAT, None)],
        )
        nodes = [helper.make_node("Loop", ["M", "", "x"], ["y"], body=body)]
        inits["M"] = np.array(STEPS, np.int64)
    else:
        nodes = _step_nodes("x", "y")
    graph = helper.make_graph(
        nodes,
        "main",
        [value("x", TP.FLOAT, [1, C, HW, HW])],
        [value("y", TP.FLOAT, [1, C, HW, HW])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 9
    return proto


def _slow_in_loop(model, x) -> str:
    try:
        from transmuter.runtime.loop_convolutions import loop_convolutions, slow_loop_convolutions
    except ImportError:  # a tree before the check existed
        return "?"

    def run(params, x):
        return transmuter.run(model, {"x": x}, params=params)

    text = jax.jit(run).lower(model.params, x).compile().as_text()
    return f"{len(slow_loop_convolutions(text))}/{len(loop_convolutions(text))}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    x = np.random.default_rng(1).standard_normal((1, C, HW, HW)).astype(np.float32)
    inputs = {"x": x}
    runs, slow = {}, {}
    for optimize in (True, False):
        label = "passes" if optimize else "optimize=False"
        looped = transmuter.load(_model(True), optimize=optimize)
        step = transmuter.load(_model(False), optimize=optimize)
        loop_fn = transmuter.compile(looped, inputs)
        step_fn = transmuter.compile(step, inputs)

        def stepped(step_fn=step_fn):
            y = x
            for _ in range(STEPS):
                y = step_fn({"x": y})["y"]
            return np.asarray(y)

        runs[f"loop, {label}"] = lambda loop_fn=loop_fn: np.asarray(loop_fn(inputs)["y"])
        runs[f"stepped, {label}"] = stepped
        slow[f"loop, {label}"] = _slow_in_loop(looped, x)
    results = {name: fn() for name, fn in runs.items()}  # compiles, and the outputs to compare
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for round_ in range(args.repeats):
        for name in names if round_ % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            runs[name]()
            times[name].append(time.perf_counter() - start)
    reference = results[names[1]]
    print(transmuter.cpu.describe().split(";")[0], f"jax {jax.__version__}")
    print(f"{STEPS} steps of {CONVS} 3x3 convs, {C} channels, {HW}x{HW}; medians of {args.repeats}")
    print(f"{'':26}{'ms':>9}{'slow convs in loop':>20}{'max diff':>10}")
    for name in names:
        diff = float(np.abs(results[name] - reference).max())
        ms = statistics.median(times[name]) * 1e3
        print(f"{name:26}{ms:9.1f}{slow.get(name, ''):>20}{diff:10.1e}")
    for label in ("passes", "optimize=False"):
        ratio = statistics.median(times[f"loop, {label}"]) / statistics.median(
            times[f"stepped, {label}"]
        )
        print(f"loop / stepped ({label}): {ratio:.2f}")


if __name__ == "__main__":
    main()
