"""The attention pattern, rewritten into a cheaper order of the same ONNX operators:

    Softmax(MatMul(Q, K') / c + mask) @ V   ->   (E @ V) / ReduceSum(E),
    E = Exp(S - ReduceMax(S)),  S = MatMul(Q * (1/c), K') + mask

The scale moves onto Q ([.., seq, head dim], not the [.., seq, seq] scores), and the softmax's
division moves after the second MatMul, onto [.., seq, head dim] instead of the probabilities:
two passes over the scores fewer. XLA:CPU fuses the rest (max, subtract, exp, sum) as it fused
the softmax. Only float32 graphs (the scale's type says), a scalar scale, Softmax over the last
axis, and intermediates nothing else reads."""

from __future__ import annotations

import dataclasses

import numpy as np

from transmuter.ir.graph import Model, Node
from transmuter.ir.passes.common import Context, Names, known_values, use_counts


def run(model: Model, context: Context) -> Model:
    graph = model.graph
    known = known_values(graph, context)
    counts = use_counts(graph)
    outputs = {v.name for v in graph.outputs}
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    names = Names(graph)
    replace: dict[int, list[Node]] = {}  # id(node) -> the nodes in its place
    drop: set[int] = set()
    opset = context.opset()

    def single(name: str) -> bool:
        return counts[name] == 1 and name not in outputs

    def made_by(name: str, *ops: str) -> Node | None:
        node = producer.get(name)
        return node if node is not None and node.domain == "" and node.op_type in ops else None

    for out in graph.nodes:
        if out.op_type != "MatMul" or out.domain != "" or len(out.inputs) != 2:
            continue
        softmax = made_by(out.inputs[0], "Softmax")
        if softmax is None or not single(out.inputs[0]) or softmax.attrs.get("axis") != -1:
            continue
        scores, mask = softmax.inputs[0], None
        add = made_by(scores, "Add")
        if add is not None and single(scores):
            scores, mask = add.inputs[0], add.inputs[1]
            if made_by(scores, "Div", "Mul") is None:
                scores, mask = mask, scores
        scale = made_by(scores, "Div", "Mul")
        if scale is None or not single(scores) or scale.inputs[1] not in known:
            continue
        c = known[scale.inputs[1]]
        qk = made_by(scale.inputs[0], "MatMul")
        if c.size != 1 or c.dtype != np.float32 or qk is None or not single(scale.inputs[0]):
            continue
        factor = float(c.reshape(())) if scale.op_type == "Mul" else 1.0 / float(c.reshape(()))
        q, k = qk.inputs
        v = out.inputs[1]
        f, qs = names.fresh(q, "scale"), names.fresh(q, "scaled")
        raw = names.fresh(out.outputs[0], "scores")
        new = [
            Node("Constant", "", (), (f,), {"value": np.asarray(factor, np.float32)}),
            Node("Mul", "", (q, f), (qs,)),
            Node("MatMul", "", (qs, k), (raw,)),
        ]
        s = raw
        if mask is not None:
            s = names.fresh(raw, "masked")
            new.append(Node("Add", "", (raw, mask), (s,)))
        peak, shifted, e = (names.fresh(s, x) for x in ("max", "shifted", "exp"))
        ev, total = names.fresh(s, "ev"), names.fresh(s, "sum")
        new += [
            *_reduce("ReduceMax", s, peak, opset, names),
            Node("Sub", "", (s, peak), (shifted,)),
            Node("Exp", "", (shifted,), (e,)),
            Node("MatMul", "", (e, v), (ev,)),
            *_reduce("ReduceSum", e, total, opset, names),
            Node("Div", "", (ev, total), out.outputs),
        ]
        replace[id(out)] = new
        drop.update(id(n) for n in (qk, scale, softmax) + ((add,) if mask is not None else ()))
    if not replace:
        return model
    nodes = []
    for node in graph.nodes:
        if id(node) in replace:
            nodes.extend(replace[id(node)])
        elif id(node) not in drop:
            nodes.append(node)
    return dataclasses.replace(model, graph=dataclasses.replace(graph, nodes=nodes))


def _reduce(op: str, source: str, target: str, opset: int, names: Names) -> list[Node]:
    """A keepdims reduction over the last axis, in the form the opset has (axes as an input
    from ReduceSum-13 and ReduceMax-18 on)."""
    if opset >= (13 if op == "ReduceSum" else 18):
        axes = names.fresh(target, "axes")
        return [
            Node("Constant", "", (), (axes,), {"value": np.asarray([-1], np.int64)}),
            Node(op, "", (source, axes), (target,), {"keepdims": 1}),
        ]
    return [Node(op, "", (source,), (target,), {"axes": (-1,), "keepdims": 1})]
