"""Projections that read one input become one wider matmul: MatMul(x, W_i) (+ bias b_i) for
i = 1..n with constant 2-D weights of the same rows turn into MatMul(x, [W_1 .. W_n]) (+ [b_1 ..
b_n]) and a Split of the last axis (an attention layer's Q, K and V; a gated MLP's gate and up).
One GEMM of n times the columns instead of n, reading x once. The concatenated weights are one
new initializer (the originals go when nothing else reads them)."""

from __future__ import annotations

import dataclasses

import numpy as np

from transmuter import dtypes
from transmuter.ir.graph import Model, Node
from transmuter.ir.passes.common import Context, Names, constants, use_counts


def run(model: Model, context: Context) -> Model:
    if not context.weights:
        return model
    graph = model.graph
    known = constants(graph, context)
    counts = use_counts(graph)
    outputs = {v.name for v in graph.outputs}
    consumers: dict[str, list[Node]] = {}
    for node in graph.nodes:
        for name in node.inputs:
            consumers.setdefault(name, []).append(node)
    groups: dict[tuple, list[Node]] = {}
    for node in graph.nodes:
        weight = _weight(node, known)
        if weight is not None:
            groups.setdefault((node.inputs[0], weight.shape[0], weight.dtype.str), []).append(node)
    names = Names(graph)
    initializers = dict(graph.initializers)
    replaced: dict[int, list[Node]] = {}  # id(first node of a group) -> the nodes in its place
    dropped: set[int] = set()
    for (x, _, _), group in groups.items():
        if len(group) < 2:
            continue
        biases = [_bias_add(m, consumers, counts, outputs, known) for m in group]
        with_bias = all(b is not None for b in biases)
        weights = [known[m.inputs[1]] for m in group]
        sizes = [w.shape[1] for w in weights]
        w_name = names.fresh(group[0].inputs[1], "fused")
        initializers[w_name] = np.concatenate(weights, axis=1)
        fused = names.fresh(group[0].outputs[0], "fused")
        new = [Node("MatMul", "", (x, w_name), (fused,), name=f"{group[0].label}__fused")]
        ends = [m.outputs[0] for m in group]
        if with_bias:
            b_name = names.fresh(biases[0][1], "fused")
            initializers[b_name] = np.concatenate([known[b] for _, b in biases])
            biased = names.fresh(fused, "bias")
            new.append(Node("Add", "", (fused, b_name), (biased,)))
            fused = biased
            ends = [add.outputs[0] for add, _ in biases]
            dropped.update(id(add) for add, _ in biases)
        new.append(_split(fused, sizes, ends, context, names, initializers))
        replaced[id(group[0])] = new
        dropped.update(id(m) for m in group[1:])
    if not replaced:
        return model
    nodes = []
    for node in graph.nodes:
        if id(node) in replaced:
            nodes.extend(replaced[id(node)])
        elif id(node) not in dropped:
            nodes.append(node)
    graph = dataclasses.replace(graph, nodes=nodes, initializers=initializers)
    return dataclasses.replace(model, graph=graph)


def _weight(node: Node, known) -> np.ndarray | None:
    if node.op_type != "MatMul" or node.domain != "" or len(node.inputs) != 2:
        return None
    weight = known.get(node.inputs[1])
    if weight is None or weight.ndim != 2 or not dtypes.is_float(weight.dtype):
        return None
    return None if node.inputs[0] in known else weight


def _bias_add(matmul: Node, consumers, counts, outputs, known) -> tuple[Node, str] | None:
    """The Add of a constant vector that alone reads the matmul's result, and that vector."""
    out = matmul.outputs[0]
    users = consumers.get(out, [])
    if counts[out] != 1 or out in outputs or len(users) != 1:
        return None
    add = users[0]
    if add.op_type != "Add" or add.domain != "" or len(add.inputs) != 2:
        return None
    other = add.inputs[1] if add.inputs[0] == out else add.inputs[0]
    bias = known.get(other)
    columns = known[matmul.inputs[1]].shape[1]
    if bias is None or bias.shape != (columns,) or bias.dtype != known[matmul.inputs[1]].dtype:
        return None
    return add, other


def _split(source, sizes, ends, context: Context, names: Names, initializers) -> Node:
    if context.opset() >= 13:
        split = names.fresh(source, "sizes")
        initializers[split] = np.asarray(sizes, np.int64)
        return Node("Split", "", (source, split), tuple(ends), {"axis": -1})
    return Node("Split", "", (source,), tuple(ends), {"axis": -1, "split": tuple(sizes)})
