"""What an operator that asks for it (`@op(..., context=True)`) sees of the runtime."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transmuter import ir


@dataclass
class OpContext:
    """The node being lowered, its opset, and the runtime services an op may need.

    run_graph(graph, inputs) evaluates a subgraph (If/Loop/Scan bodies) with the enclosing
    scope visible and returns its outputs in order. next_key() returns a fresh PRNG key for
    random ops. recompute(names, feeds) evaluates the named values of the graph this node is in
    again, from `feeds` (name -> value) in place of those values, by the nodes between them
    (what Gradient differentiates).
    """

    node: ir.Node
    opset: int
    run_graph: Callable[[ir.Graph, Sequence[Any]], list[Any]]
    next_key: Callable[[], Any]
    recompute: Callable[[Sequence[str], Mapping[str, Any]], list[Any]]

    @property
    def num_outputs(self) -> int:
        """How many outputs the node lists (optional trailing outputs may be absent)."""
        return len(self.node.outputs)

    def wants(self, index: int) -> bool:
        """True when the node asks for output `index` (present and not the empty name)."""
        return index < len(self.node.outputs) and bool(self.node.outputs[index])
