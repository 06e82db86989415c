"""A graph split in two at inputs that stay the same across calls: the edit behind
`transmuter.split(model, invariant=[...])`.

A decoder run once per token on a padded sequence reads the encoder's states at every step and
computes the same values from them every step: the cross-attention's keys and values, 1.8 GMAC
a step on a Whisper-tiny-sized decoder over 1,500 encoder positions (bench/README.md,
"Encoder-decoder generation"). `split(model, invariant)` gives (head, tail): head takes the
invariant inputs and returns each value computed from their data that the rest of the graph
reads; tail is the rest, taking those values as inputs. Head once, then tail per call, gives
the graph's outputs.

Head holds each node (in graph order) that reads only what head has (the invariant inputs,
initializers, its own nodes' values) and reads an invariant input's data, directly or through
such nodes; those leave tail. Shape and Size read no data: computations on shapes are copied
into head where its nodes need them and stay in tail, where the runtime keeps them on the host
(as a traced input of tail they could not decide a shape). Nodes holding subgraphs (an If's
branches read outer values that head does not see whole) and random draws (made at every
call) stay in tail.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from transmuter.errors import InputError
from transmuter.ir.graph import Model, Node, ValueInfo, subgraphs
from transmuter.ir.passes import dce
from transmuter.ir.passes.common import Context, use_counts

# Ops whose outputs depend on their input's shape, never on its values.
_SHAPE_ONLY = frozenset({"Shape", "Size"})


def split(model: Model, invariant: Sequence[str]) -> tuple[Model, Model]:
    """(head, tail) of `model` at the inputs `invariant` (see the module)."""
    graph = model.graph
    inputs = [v.name for v in graph.inputs]
    unknown = [name for name in invariant if name not in inputs]
    if unknown:
        raise InputError(f"split: {unknown} are not inputs of the graph; its inputs are {inputs}")
    random = Context().random
    available = {*invariant, *graph.initializers}
    data = set(invariant)
    head: list[Node] = []
    moved: list[Node] = []
    for node in graph.nodes:
        read = [name for name in node.inputs if name]
        if subgraphs(node) or random(node) or not all(name in available for name in read):
            continue
        outputs = [name for name in node.outputs if name]
        available.update(outputs)
        head.append(node)
        if node.op_type not in _SHAPE_ONLY and any(name in data for name in read):
            data.update(outputs)
            moved.append(node)
    leaving = {id(node) for node in moved}
    rest = [node for node in graph.nodes if id(node) not in leaving]
    needed = use_counts(dataclasses.replace(graph, nodes=rest))
    frontier = [name for node in moved for name in node.outputs if needed[name]]
    types = {v.name: v for v in (*graph.inputs, *graph.value_info.values())}
    declared = [types.get(name, ValueInfo(name, None)) for name in frontier]
    head_inputs = [v for v in graph.inputs if v.name in invariant]
    return (
        _part(model, head, head_inputs, declared),
        _part(model, rest, [*graph.inputs, *declared], graph.outputs),
    )


def _part(
    model: Model, nodes: list[Node], inputs: Sequence[ValueInfo], outputs: Sequence[ValueInfo]
) -> Model:
    """`model` with the `nodes` that `outputs` need (dead-code elimination's rule: random draws
    stay), and the `inputs` and initializers they read."""
    graph = dataclasses.replace(
        model.graph, nodes=nodes, inputs=list(inputs), outputs=list(outputs)
    )
    part = dce.run(dataclasses.replace(model, graph=graph), Context())
    read = use_counts(part.graph)
    graph = dataclasses.replace(part.graph, inputs=[v for v in part.graph.inputs if read[v.name]])
    return dataclasses.replace(part, graph=graph)
