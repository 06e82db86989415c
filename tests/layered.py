"""A model of repeated layers built with onnx.helper, for the `layers` graph pass and the tests
that run its Scan (tests/ir/test_passes.py, tests/runtime/test_sharding.py).

x [batch, seq, D] * 2, then `layers` pre-norm residual layers of 18 nodes each (LayerNorm, a
gated MLP, the residual, a shared mask input, and a Reshape to Shape(h)[0] x -1 x D computed
in the layer), then a ReduceMean over the features.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

D, HIDDEN = 8, 16


def layered_model(
    layers: int = 18,
    *,
    shared: bool = False,
    every_output: bool = False,
    per_layer_input: bool = False,
    random: bool = False,
    seed: int = 0,
):
    """The model and its inputs' shapes. shared: one set of weights for every layer (ALBERT);
    every_output: each layer's result is also a graph output; per_layer_input: each layer reads
    a graph input of its own (as a KV cache is); random: each layer draws random numbers."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("Mul", ["x", "two"], ["x2"])]
    inits = {"two": np.array(2.0, np.float32)}
    inputs = {"x": ["batch", "seq", D], "mask": ["batch", "seq", 1]}
    outputs = ["y"]
    h = "x2"
    for j in range(layers):
        prefix = "shared_" if shared else f"w{j}_"
        extra = f"past{j}" if per_layer_input else None
        if extra:
            inputs[extra] = ["batch", "seq", D]
        block, h = _layer(j, h, prefix, extra, random)
        nodes += block
        inits.update(_layer_weights(prefix, rng))
        if every_output:
            outputs.append(h)
    nodes.append(helper.make_node("ReduceMean", [h], ["y"], axes=[-1], keepdims=0))
    graph = helper.make_graph(
        nodes,
        "layered",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), inputs


def layered_inputs(shapes, batch: int = 2, seq: int = 5, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = {"batch": batch, "seq": seq}
    return {
        n: rng.standard_normal([sizes.get(d, d) for d in shape]).astype(np.float32)
        for n, shape in shapes.items()
    }


def _layer(j: int, h: str, w: str, extra_input: str | None, random: bool):
    p = f"l{j}_"
    const = lambda name, value: helper.make_node(  # noqa: E731
        "Constant", [], [p + name], value=numpy_helper.from_array(np.array(value))
    )
    nodes = [
        helper.make_node("LayerNormalization", [h, f"{w}ln_s", f"{w}ln_b"], [p + "ln"], axis=-1),
        helper.make_node("MatMul", [p + "ln", f"{w}up"], [p + "up"]),
        helper.make_node("Add", [p + "up", f"{w}up_b"], [p + "upb"]),
        helper.make_node("Sigmoid", [p + "upb"], [p + "gate"]),
        helper.make_node("Mul", [p + "upb", p + "gate"], [p + "act"]),
        helper.make_node("MatMul", [p + "act", f"{w}down"], [p + "down"]),
        helper.make_node("Add", [h, p + "down"], [p + "res"]),
        helper.make_node("Mul", [p + "res", "mask"], [p + "masked"]),
        helper.make_node("Shape", [p + "masked"], [p + "shape"]),
        const("zero", 0),
        helper.make_node("Gather", [p + "shape", p + "zero"], [p + "rows"], axis=0),
        const("axes", [0]),
        helper.make_node("Unsqueeze", [p + "rows", p + "axes"], [p + "rows1"]),
        const("rest", [-1, D]),
        helper.make_node("Concat", [p + "rows1", p + "rest"], [p + "target"], axis=0),
        helper.make_node("Reshape", [p + "masked", p + "target"], [p + "out0"]),
        helper.make_node("Neg", [p + "out0"], [p + "neg"]),
        helper.make_node("Sub", [p + "out0", extra_input or p + "neg"], [p + "out"]),
    ]
    if random:
        nodes[-2] = helper.make_node("RandomNormalLike", [p + "out0"], [p + "neg"], scale=0.0)
    return nodes, p + "out"


def _layer_weights(prefix: str, rng) -> dict[str, np.ndarray]:
    def normal(*shape, scale=1.0):
        return (scale * rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    return {
        prefix + "ln_s": 1 + normal(D, scale=0.25),
        prefix + "ln_b": normal(D, scale=0.25),
        prefix + "up": normal(D, HIDDEN),
        prefix + "up_b": normal(HIDDEN),
        prefix + "down": normal(HIDDEN, D, scale=0.5),
    }
