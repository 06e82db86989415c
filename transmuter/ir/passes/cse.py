"""Common-subexpression elimination: a node computing what an earlier node computed (the same
op, attributes and inputs) reads the earlier node's outputs instead. Exporters repeat shape
chains per layer (Shape -> Gather -> Unsqueeze -> Concat) and identical Constant nodes; merging
them shortens the graph walk that every new shape traces. Random nodes and nodes with subgraphs
are never merged; a node producing a graph output keeps its name (it stays)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from transmuter.ir.graph import Graph, Model, subgraphs
from transmuter.ir.passes.common import Context, renamed_inputs


def run(model: Model, context: Context) -> Model:
    graph = model.graph
    outputs = {v.name for v in graph.outputs}
    seen: dict[Any, tuple[str, ...]] = {}
    renames: dict[str, str] = {}
    kept = []
    for node in graph.nodes:
        node = renamed_inputs(node, renames)
        key = None if subgraphs(node) or context.random(node) else _key(node)
        if key is not None and key in seen and not outputs.intersection(node.outputs):
            renames.update((o, e) for o, e in zip(node.outputs, seen[key]) if o)
            continue
        if key is not None:
            seen.setdefault(key, node.outputs)
        kept.append(node)
    if not renames:
        return model
    value_info = {k: v for k, v in graph.value_info.items() if k not in renames}
    return dataclasses.replace(
        model, graph=dataclasses.replace(graph, nodes=kept, value_info=value_info)
    )


def _key(node) -> Any:
    try:
        attrs = tuple(sorted((k, _hashable(v)) for k, v in node.attrs.items()))
    except TypeError:
        return None
    present = tuple(bool(o) for o in node.outputs)
    return (node.op_type, node.domain, node.inputs, attrs, present)


def _hashable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return ("object", value.shape, tuple(map(str, value.reshape(-1))))
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, Graph):
        raise TypeError("subgraph")
    if isinstance(value, float) and value != value:
        return ("nan",)
    hash(value)
    return (type(value).__name__, value)
