"""Where a model's graph will break, found without running it.

The interpreter keeps host values (constants, shapes and what is computed from them alone)
apart from data. A node breaks the compiled graph when an input it needs on the host is data,
or when its output shape depends on the values of data (NonZero, NonMaxSuppression). Ops
registered with `may_need_host` (If, Loop, RoiAlign) decide at trace time: they break only when
the data they read changes a shape, so they are listed as possible breaks; so are ops on
strings (`strings_on_host`) given strings and data. Every fact about an op used here is its
registration (`OpDef`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from transmuter import dtypes, ir
from transmuter.errors import UnsupportedOpError
from transmuter.lowering import lookup


@dataclass(frozen=True)
class Break:
    """A node where `transmuter.compile` splits the graph (certain) or may split it."""

    node: str
    op_type: str
    input: str
    reason: str
    certain: bool
    # The model inputs that, given as `static_inputs` as well, remove this break: those the
    # value it needs is computed from, when it is computed from inputs alone (no weights).
    static: tuple[str, ...] = ()

    def __str__(self) -> str:
        kind = "breaks" if self.certain else "may break"
        text = f"{self.node} ({self.op_type}) {kind}: {self.input!r} is data; {self.reason}"
        if self.static:
            text += f"; static_inputs={list(self.static)} removes this break"
        return text


def graph_breaks(model, static_inputs: frozenset[str] = frozenset()) -> list[Break]:
    """The main graph's break nodes, in order, for inputs other than `static_inputs` being data,
    each with the inputs that would remove it if static too (`Break.static`).

    `model` is a `transmuter.Model`: its host constants are host values; params, large
    constants and inputs are data."""
    found = _breaks(model, frozenset(static_inputs))
    sources = _input_sources(model)
    tried: dict[frozenset[str], set[str]] = {}
    for i, brk in enumerate(found):
        names = sources.get(brk.input)
        if not names or names & set(static_inputs):
            continue
        more = frozenset(static_inputs) | names
        if more not in tried:
            tried[more] = {b.node for b in _breaks(model, more)}
        if brk.node not in tried[more]:
            found[i] = replace(brk, static=tuple(sorted(names)))
    return found


def _input_sources(model) -> dict[str, frozenset[str]]:
    """For each value of the main graph computed from model inputs and host constants alone,
    the inputs it is computed from (one forward pass; values reading a weight are left out)."""
    inputs = set(model.inputs)
    sources: dict[str, frozenset[str]] = {n: frozenset([n]) for n in inputs}
    constants = set(model.host_constants)
    empty: frozenset[str] = frozenset()
    for step in model.plan.steps:
        node = step.node
        if ir.subgraphs(node) or step.opdef.random:
            continue
        names: set[str] = set()
        for n in node.inputs:
            if not n or n in constants:
                continue
            if n not in sources:
                break
            names |= sources[n]
        else:
            value = frozenset(names) if names else empty
            for o in node.outputs:
                if o:
                    sources[o] = value
    return {n: v for n, v in sources.items() if v}


def _breaks(model, static_inputs: frozenset[str]) -> list[Break]:
    host = set(model.host_constants) | set(static_inputs)
    strings = _declared_strings(model.ir.graph)
    found: list[Break] = []
    for step in model.plan.steps:
        node, opdef = step.node, step.opdef
        data_inputs = [n for n in node.inputs if n and n not in host and n not in strings]
        if _makes_strings(node, opdef, strings):
            strings.update(o for o in node.outputs if o)
        if opdef.reads_shape:
            host.update(o for o in node.outputs if o)
            continue
        blocking = [i for i in opdef.host_input_indices(node.inputs) if node.inputs[i] not in host]
        outer = [n for sub in ir.subgraphs(node) for n in sub.outer_names if n not in host]
        if blocking:
            index = blocking[0]
            reason = opdef.host_reason(index)
            found.append(Break(node.label, node.op_type, node.inputs[index], reason, True))
            host.update(o for o in node.outputs if o)  # the break runs it on the host
        elif opdef.may_need_host and (data_inputs or outer):
            name = (data_inputs or outer)[0]
            found.append(Break(node.label, node.op_type, name, opdef.may_need_host, False))
        elif opdef.strings_on_host and data_inputs and strings.intersection(node.outputs):
            reason = "strings live on the host, so the data it reads is needed there"
            found.append(Break(node.label, node.op_type, data_inputs[0], reason, False))
        elif not data_inputs and not outer and not opdef.random:
            host.update(o for o in node.outputs if o)
    return found


def _declared_strings(graph: ir.Graph) -> set[str]:
    """The names the file declares as string tensors (inputs, outputs, value_info, initializers)."""
    infos = [*graph.inputs, *graph.outputs, *graph.value_info.values()]
    found = {v.name for v in infos if _is_string(v.type)}
    found.update(n for n, a in graph.initializers.items() if a.dtype == object)
    return found


def _is_string(value_type) -> bool:
    return isinstance(value_type, ir.TensorType) and value_type.dtype == object


def _makes_strings(node: ir.Node, opdef, strings: set[str]) -> bool:
    """Whether the node's outputs are strings: a Cast to strings, or an op on strings (a Gather
    from a string table) reading some. ml ops that make strings declare their outputs' types."""
    if node.op_type == "Cast" and not node.domain:
        return node.attrs.get("to") == dtypes.to_onnx(np.dtype(object))
    return opdef.strings_on_host and any(n in strings for n in node.inputs)


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
