"""Block-quantized matmul weights (com.microsoft MatMulNBits) dequantized once, at load.

MatMulNBits unpacks and scales its weight on every call, and XLA:CPU does not fuse that into
the GEMM: 4-bit MiniLM ran at 1.8x Transmuter's own float32 time at batch 1. Where B, its
scales and zero points (every input but A) are constants, this pass computes the float32 weight
once, with the lowering's own dequantization (`Context.weight`), and leaves a plain MatMul in
float32, as the op computes:

    MatMulNBits(A, B, ...) -> CastLike(MatMul(Cast(A, float), W) [+ Cast(bias, float)], A)

The price is memory: W holds 4 bytes per weight where a 4-bit B holds half a byte, 8x as much.
So it is not in `DEFAULT`: `optimize=[*passes.DEFAULT, "dequantize"]` asks for it.
"""

from __future__ import annotations

import dataclasses

from transmuter.ir.graph import Model, Node
from transmuter.ir.passes.common import Context, Names, known_values

FLOAT = 1  # TensorProto.FLOAT
BIAS = 5  # MatMulNBits' input position of the bias


def run(model: Model, context: Context) -> Model:
    if not context.weights or context.opset() < 15:  # CastLike-15
        return model
    graph = model.graph
    known = known_values(graph, context)
    names = Names(graph)
    initializers = dict(graph.initializers)
    nodes: list[Node] = []
    for node in graph.nodes:
        weight = None
        if node.op_type == "MatMulNBits" and node.domain == "com.microsoft":
            weight = context.weight(node, {n: known[n] for n in node.inputs[1:] if n in known})
        if weight is None or node.inputs[0] in known:
            nodes.append(node)
            continue
        w_name = names.fresh(node.inputs[1], "dequantized")
        initializers[w_name] = weight
        nodes.extend(_matmul(node, w_name, names))
    if len(nodes) == len(graph.nodes):
        return model
    graph = dataclasses.replace(graph, nodes=nodes, initializers=initializers)
    return dataclasses.replace(model, graph=graph)


def _matmul(node: Node, weight: str, names: Names) -> list[Node]:
    """MatMulNBits `node` as Cast, MatMul (+ bias) and CastLike, its name on the MatMul."""
    a, out = node.inputs[0], node.outputs[0]
    a32, y = names.fresh(a, "float"), names.fresh(out, "float")
    new = [
        Node("Cast", "", (a,), (a32,), {"to": FLOAT}),
        Node("MatMul", "", (a32, weight), (y,), name=node.name),
    ]
    bias = node.inputs[BIAS] if len(node.inputs) > BIAS else ""
    if bias:
        bias32, biased = names.fresh(bias, "float"), names.fresh(out, "bias")
        new += [
            Node("Cast", "", (bias,), (bias32,), {"to": FLOAT}),
            Node("Add", "", (y, bias32), (biased,)),
        ]
        y = biased
    new.append(Node("CastLike", "", (y, a), (out,)))
    return new
