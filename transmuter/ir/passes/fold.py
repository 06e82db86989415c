"""Constant folding: chains computed from stored weights (and constants) alone are computed once
at load by the runtime's evaluator (`Context.evaluate`); chains of constants alone are left to
the tracer, which evaluates them at no cost per call.

Exporters leave weight chains in the graph (Transpose of a Linear weight, Reshape / Unsqueeze of
a bias, Cast, the Mul of a scale), which a compiled run would otherwise recompute on every call,
and shape chains of constants. Where a result lands keeps the runtime's split between params and
host constants (runtime/model.py): a value computed from an initializer that is a device value
(a param or device constant) becomes a new initializer, which `Model` places by its own rule; a
value computed only from host values (Constant nodes, small initializers) becomes a Constant
node, so it stays host-known while tracing (it may decide a shape) and never turns into a jit
argument.

An Identity of a known value is an alias: its readers read the value itself (no copy).

Not folded: random nodes, nodes with subgraphs, nodes the evaluator cannot compute, and a result
larger than what it is computed from (an Expand or Tile of a small constant, a DequantizeLinear
or widening Cast of stored weights: those are kept small in memory on purpose; a few KiB of host values are
always folded).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from transmuter.ir.graph import Model, Node, subgraphs
from transmuter.ir.passes.common import Context, constants, renamed_inputs, use_counts

ALWAYS_BYTES = 4096  # results this small fold whatever they are computed from


def run(model: Model, context: Context) -> Model:
    if context.evaluate is None:
        return model
    graph = model.graph
    known = constants(graph, context)
    device = {name for name, array in known.items() if context.device_bound(array)}
    outputs = {v.name for v in graph.outputs}
    folded: dict[str, np.ndarray] = {}
    kept: list[Node] = []
    renames: dict[str, str] = {}
    wanted = _weight_chains(graph, known, device, context)
    for original in graph.nodes:
        node = renamed_inputs(original, renames)
        present = [n for n in node.inputs if n]
        if (
            node.op_type == "Identity"
            and node.domain == ""
            and present
            and present[0] in known
            and node.outputs[0] not in outputs
        ):
            # An alias, not a copy: exporters read shared weights through Identity nodes.
            renames[node.outputs[0]] = present[0]
            continue
        if (
            id(original) not in wanted
            or not all(n in known for n in present)
            or not any(node.outputs)
        ):
            kept.append(node)
            continue
        values = context.evaluate(node, {n: known[n] for n in present})
        if node.op_type == "Constant" and node.domain == "":
            # Already a host value as it stands: known to the nodes after it, kept as it is.
            kept.append(node)
            if values is not None and isinstance(values[0], np.ndarray):
                known[node.outputs[0]] = values[0]
            continue
        on_device = any(n in device for n in present)
        if values is None or not _worth(values, [known[n] for n in present], on_device):
            kept.append(node)
            continue
        for name, value in zip(node.outputs, values):
            if name:
                known[name] = folded[name] = value
                if on_device:
                    device.add(name)
    if not folded and not renames:
        return model
    counts = use_counts(dataclasses.replace(graph, nodes=kept))
    initializers = dict(graph.initializers)
    constant_nodes = []
    for name, value in folded.items():
        if not counts[name]:
            continue
        if name in device or name in outputs:
            initializers[name] = value
        else:
            constant_nodes.append(Node("Constant", "", (), (name,), {"value": value}))
    return dataclasses.replace(
        model,
        graph=dataclasses.replace(graph, nodes=constant_nodes + kept, initializers=initializers),
    )


def _weight_chains(graph, known, device, context: Context) -> set[int]:
    """The ids of the nodes worth evaluating: those computed from stored weights and constants
    alone that read a weight (directly or through such nodes), and the constant-only nodes they
    need. Chains of constants alone are left to the tracer, which computes them on the host or
    in the program at no cost per call; folding them here would only move that work to load."""
    static = set(known) | {o for n in graph.nodes if n.op_type == "Constant" for o in n.outputs}
    weighty = set(device)
    foldable: dict[str, Node] = {}
    for node in graph.nodes:
        present = [n for n in node.inputs if n]
        if subgraphs(node) or context.random(node) or not all(n in static for n in present):
            continue
        static.update(o for o in node.outputs if o)
        foldable.update((o, node) for o in node.outputs if o)
        if any(n in weighty for n in present):
            weighty.update(o for o in node.outputs if o)
    wanted: set[int] = set()
    pending = [node for name, node in foldable.items() if name in weighty]
    while pending:
        node = pending.pop()
        if id(node) not in wanted:
            wanted.add(id(node))
            pending.extend(foldable[n] for n in node.inputs if n in foldable)
    return wanted


def _worth(values, inputs, on_device: bool) -> bool:
    """Whether the results are plain arrays no larger than what they are computed from. Small
    host results always are worth it; a result of stored weights never grows them (a Cast of
    float16 storage to float32 compute is kept, however small, so params keep the file's type)."""
    if not all(isinstance(v, np.ndarray) for v in values):
        return False
    out = sum(v.nbytes for v in values if v.dtype != object)
    if not on_device and out <= ALWAYS_BYTES:
        return True
    return out <= sum(np.asarray(a).nbytes for a in inputs)
