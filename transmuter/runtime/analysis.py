"""Where a model's graph will break, found without running it.

The interpreter keeps host values (constants, shapes and what is computed from them alone)
apart from data. A node breaks the compiled graph when an input it needs on the host is data,
or when its output shape depends on the values of data (NonZero, NonMaxSuppression). If, Loop
and a few others decide at trace time: they break only when the data they read changes a shape
(If branches of different shapes, a Loop trip count read from data), so they are listed as
possible breaks.
"""

from __future__ import annotations

from dataclasses import dataclass

from transmuter import ir
from transmuter.errors import UnsupportedOpError
from transmuter.lowering import lookup

# Operators whose result is host-known whatever their input: they read only its shape.
SHAPE_READERS = {("", "Shape"), ("", "Size")}
# Operators that raise HostValueNeeded themselves when data decides a shape.
DECIDES_AT_TRACE = {
    ("", "If"): "its branches may give different shapes",
    ("", "Loop"): "a trip count or condition read from data decides the output length",
    ("", "RoiAlign"): "sampling_ratio 0 sizes the sampling grid from the boxes",
}
# Not listed: ai.onnx.ml ops mapping traced numbers to strings (strings live on the host).


@dataclass(frozen=True)
class Break:
    """A node where `transmuter.compile` splits the graph (certain) or may split it."""

    node: str
    op_type: str
    input: str
    reason: str
    certain: bool

    def __str__(self) -> str:
        kind = "breaks" if self.certain else "may break"
        return f"{self.node} ({self.op_type}) {kind}: {self.input!r} is data; {self.reason}"


def graph_breaks(model, static_inputs: frozenset[str] = frozenset()) -> list[Break]:
    """The main graph's break nodes, in order, for inputs other than `static_inputs` being data.

    `model` is a `transmuter.Model`: its host constants are host values; params, large
    constants and inputs are data."""
    host = set(model.host_constants) | set(static_inputs)
    found: list[Break] = []
    for step in model.plan.steps:
        node, opdef = step.node, step.opdef
        data_inputs = [n for n in node.inputs if n and n not in host]
        key = (node.domain, node.op_type)
        if key in SHAPE_READERS:
            host.update(o for o in node.outputs if o)
            continue
        needs = range(len(node.inputs)) if opdef.data_dependent else opdef.host_inputs
        blocking = [node.inputs[i] for i in needs if i < len(node.inputs) and node.inputs[i]]
        blocking = [n for n in blocking if n not in host]
        outer = [n for sub in ir.subgraphs(node) for n in sub.outer_names if n not in host]
        if blocking:
            reason = (
                "its output shape depends on it"
                if opdef.data_dependent
                else opdef.host_inputs.get(node.inputs.index(blocking[0]), "")
            )
            found.append(Break(node.label, node.op_type, blocking[0], reason, True))
            host.update(o for o in node.outputs if o)  # the break runs it on the host
        elif key in DECIDES_AT_TRACE and (data_inputs or outer):
            name = (data_inputs or outer)[0]
            found.append(Break(node.label, node.op_type, name, DECIDES_AT_TRACE[key], False))
        elif not data_inputs and not outer and not opdef.random:
            host.update(o for o in node.outputs if o)
    return found


def unsupported_ops(model_ir: ir.Model) -> list[str]:
    """`domain::op_type` of every operator in the model (subgraphs included) that has no
    lowering for the opset the model imports."""
    missing: set[str] = set()
    for node in _all_nodes(model_ir.graph):
        opset = model_ir.opsets.get(node.domain)
        try:
            if opset is None:
                raise UnsupportedOpError(node.domain, node.op_type, 0, node.label, "no opset")
            lookup(node.domain, node.op_type, opset)
        except UnsupportedOpError:
            missing.add(f"{node.domain or 'ai.onnx'}::{node.op_type}")
    return sorted(missing)


def _all_nodes(graph: ir.Graph):
    for node in graph.nodes:
        yield node
        for sub in ir.subgraphs(node):
            yield from _all_nodes(sub)
