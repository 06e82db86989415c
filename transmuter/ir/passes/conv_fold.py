"""Conv followed by BatchNormalization (inference), or by a Mul or Add of a per-channel
constant, becomes one Conv with new weights and bias:

    BN(conv(x, W) + B) = conv(x, W * s) + (B - mean) * s + beta,  s = gamma / sqrt(var + eps)

computed once at load in float64 and stored in W's dtype. XLA:CPU runs a convolution as a
library call that fuses nothing into it, so each BatchNormalization is a full extra pass over
the activations. Only where the Conv's output feeds nothing else, its weights and the
normalization's tensors are constants, and weights may change (not a trainable model)."""

from __future__ import annotations

import dataclasses

import numpy as np

from transmuter import dtypes
from transmuter.ir.graph import Model, Node
from transmuter.ir.passes.common import Context, Names, constants, per_channel, use_counts


def run(model: Model, context: Context) -> Model:
    if not context.weights:
        return model
    graph = model.graph
    known = constants(graph, context)
    counts = use_counts(graph)
    outputs = {v.name for v in graph.outputs}
    names = Names(graph)
    convs: dict[str, int] = {}  # a Conv's output -> its position in `nodes`
    nodes: list[Node | None] = []
    initializers = dict(graph.initializers)
    changed = False
    for node in graph.nodes:
        source = _source(node, convs)
        if source is not None and counts[source] == 1 and source not in outputs:
            conv = nodes[convs[source]]
            folded = _fold(conv, node, known)
            if folded is not None:
                weight, bias = folded
                w_name = names.fresh(conv.inputs[1], "folded")
                b_name = names.fresh(conv.inputs[2] if _bias(conv) else conv.inputs[1], "bias")
                initializers[w_name] = known[w_name] = weight
                initializers[b_name] = known[b_name] = bias
                nodes[convs.pop(source)] = None
                node = dataclasses.replace(
                    conv, inputs=(conv.inputs[0], w_name, b_name), outputs=node.outputs[:1]
                )
                changed = True
        if node.op_type == "Conv" and node.domain == "" and _foldable_conv(node, known):
            convs[node.outputs[0]] = len(nodes)
        nodes.append(node)
    if not changed:
        return model
    graph = dataclasses.replace(
        graph, nodes=[n for n in nodes if n is not None], initializers=initializers
    )
    return dataclasses.replace(model, graph=graph)


def _source(node: Node, convs: dict[str, int]) -> str | None:
    """The Conv output `node` may fold into: BatchNormalization's input, either of Mul's or
    Add's (not both)."""
    if node.domain != "" or not node.inputs:
        return None
    if node.op_type == "BatchNormalization":
        return node.inputs[0] if node.inputs[0] in convs else None
    if node.op_type in ("Mul", "Add") and len(node.inputs) == 2:
        found = [n for n in node.inputs if n in convs]
        return found[0] if len(found) == 1 else None
    return None


def _bias(conv: Node) -> bool:
    return len(conv.inputs) > 2 and bool(conv.inputs[2])


def _foldable_conv(conv: Node, known) -> bool:
    weight = known.get(conv.inputs[1]) if len(conv.inputs) > 1 else None
    if weight is None or not dtypes.is_float(weight.dtype) or weight.ndim < 3:
        return False
    return not _bias(conv) or conv.inputs[2] in known


def _fold(conv: Node, node: Node, known) -> tuple[np.ndarray, np.ndarray] | None:
    """The Conv's new (weight, bias) with `node` folded in, or None where it does not fold."""
    weight = known[conv.inputs[1]]
    channels = weight.shape[0]
    bias = known[conv.inputs[2]] if _bias(conv) else np.zeros(channels, weight.dtype)
    w, b = weight.astype(np.float64), bias.astype(np.float64)
    if node.op_type == "BatchNormalization":
        if len(node.inputs) != 5 or any(node.outputs[1:]) or node.attrs.get("training_mode", 0):
            return None
        if node.attrs.get("spatial", 1) != 1 or not all(n in known for n in node.inputs[1:]):
            return None
        gamma, beta, mean, var = (per_channel(known[n], channels, 1, 0) for n in node.inputs[1:])
        if any(v is None for v in (gamma, beta, mean, var)):
            return None
        eps = float(node.attrs.get("epsilon", 1e-5))
        scale = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
        w = w * scale.reshape((-1,) + (1,) * (w.ndim - 1))
        b = (b - mean) * scale + beta
    elif node.op_type in ("Mul", "Add") and len(node.inputs) == 2:
        other = node.inputs[1] if node.inputs[0] == conv.outputs[0] else node.inputs[0]
        if other not in known or known[other].dtype != weight.dtype:
            return None
        c = per_channel(known[other], channels, weight.ndim)
        if c is None:
            return None
        if node.op_type == "Mul":
            w = w * c.astype(np.float64).reshape((-1,) + (1,) * (w.ndim - 1))
            b = b * c
        else:
            b = b + c
    else:
        return None
    return w.astype(weight.dtype), b.astype(weight.dtype)
