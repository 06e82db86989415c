"""Dead-code elimination: nodes none of whose outputs reach a graph output, and (when weights
may change) the initializers nothing reads. Random nodes stay: each draw advances the call's key
stream, so removing one would change the values the others draw."""

from __future__ import annotations

import dataclasses

from transmuter.ir.graph import Model, subgraphs
from transmuter.ir.passes.common import Context


def run(model: Model, context: Context) -> Model:
    graph = model.graph
    live = {v.name for v in graph.outputs}
    kept = []
    for node in reversed(graph.nodes):
        if context.random(node) or any(o in live for o in node.outputs if o):
            kept.append(node)
            live.update(n for n in node.inputs if n)
            for sub in subgraphs(node):
                live.update(sub.outer_names)
    if len(kept) == len(graph.nodes) and (not context.weights or live >= set(graph.initializers)):
        return model
    inputs = {v.name for v in graph.inputs}
    initializers = graph.initializers
    if context.weights:
        # An initializer that is also an input is part of the interface: it stays.
        initializers = {k: v for k, v in initializers.items() if k in live or k in inputs}
    defined = live | {o for n in kept for o in n.outputs}
    value_info = {k: v for k, v in graph.value_info.items() if k in defined}
    return dataclasses.replace(
        model,
        graph=dataclasses.replace(
            graph, nodes=kept[::-1], initializers=initializers, value_info=value_info
        ),
    )
